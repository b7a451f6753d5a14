package kafka_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	kafkago "github.com/segmentio/kafka-go"

	"github.com/idemkit/idem/adapters/kafka"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/wire"
	"github.com/idemkit/idem/internal/testenv/kafkatest"
	"github.com/idemkit/idem/internal/testenv/retrytest"
)

// Identity is decided once, at first delivery, and travels with every copy:
// these tests hold the two holes of issue 37 shut on real Kafka and
// Postgres.

// TestKafkaRetryCopyKeepsTopicTenant: the tenant is taken from the topic
// (as docs/keys.md suggests); a payment is applied and its COMMIT reported
// failed every time, so its in-lane attempts run out and it goes to retry.
// Its copy arrives on pay.retry.<delay>, yet it must be keyed in its
// original's scope (payments/<topic>) and skipped: one ledger row.
func TestKafkaRetryCopyKeepsTopicTenant(t *testing.T) {
	delays := []time.Duration{300 * time.Millisecond}
	brokers, a, topic, group := retryTest(t, 1, delays)
	b := newTestBank(t)
	v, _ := json.Marshal(payment{TxnID: "uncertain", Amount: 42})
	a.Produce(t, topic, kafkago.Message{Key: []byte("uncertain"), Value: v})

	scfg := realSourceConfig(t, brokers, topic, group)
	scfg.RetryDelays = delays
	src := newSource(t, scfg)
	store := retrytest.NewLyingStore(b.store)
	cfg := b.config(src, src)
	cfg.Store = store
	cfg.Logger = testLogger(t)
	cfg.Tenant = func(m *consumer.Message) (string, error) { return m.Topic, nil }
	cfg.Retry = consumer.RetryPolicy{Initial: 10 * time.Millisecond, Max: 50 * time.Millisecond, MaxAttempts: 1000, MaxElapsed: time.Minute}
	cfg.Retries = consumer.NonBlocking{Attempts: 2, Delays: delays, Sink: src}
	inner := cfg.Handler
	cfg.Handler = consumer.HandlerFunc[pgx.Tx](func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if m.Topic == topic {
			store.Target(m.Ref()) // the original's COMMITs are reported failed
		}
		return inner.Handle(ctx, tx, m)
	})
	r := start(t, cfg)
	waitUntil(t, time.Minute, "the payment sent to retry", func() bool { return r.Stats().RetriedLater >= 1 })
	a.WaitNoLag(t, group, topic)
	waitSettled(t, a, group, kafka.RetryTopic(topic, delays[0]))
	r.Stop(t)

	if rows, _ := b.rows(t); rows != 1 {
		t.Fatalf("%d ledger rows for one payment, want 1 (the retry copy was keyed in another scope)", rows)
	}
	if st := r.Stats(); st.Duplicates < 1 || store.Lies() == 0 {
		t.Fatalf("stats %+v, %d COMMITs reported failed: want the copy skipped as a duplicate", st, store.Lies())
	}
}

// TestKafkaRetryTopicStartsAtFirstRecord: StartFrom is LastOffset; a
// payment fails, goes to a retry topic, and the consumer restarts while its
// copy waits out its delay, before any copy of that retry partition was
// acknowledged. The new member must read the copy (its original was
// acknowledged when the copy was written), not start at the partition's
// end: the payment is applied once.
func TestKafkaRetryTopicStartsAtFirstRecord(t *testing.T) {
	delays := []time.Duration{3 * time.Second}
	brokers, a, topic, group := retryTest(t, 1, delays)
	retryTopic := kafka.RetryTopic(topic, delays[0])
	b := newTestBank(t)

	var release atomic.Bool
	run := func() (*running, *kafka.Source) {
		scfg := realSourceConfig(t, brokers, topic, group)
		scfg.RetryDelays = delays
		scfg.StartFrom = kafka.LastOffset
		src := newSource(t, scfg)
		cfg := b.config(src, src)
		cfg.Logger = testLogger(t)
		cfg.Retry = consumer.RetryPolicy{Initial: 10 * time.Millisecond, Max: 50 * time.Millisecond, MaxAttempts: 1000, MaxElapsed: time.Minute}
		cfg.Retries = consumer.NonBlocking{Attempts: 1, Delays: delays, Sink: src}
		inner := cfg.Handler
		cfg.Handler = consumer.HandlerFunc[pgx.Tx](func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			if !release.Load() {
				return consumer.Retryable(fmt.Errorf("the account service is down"))
			}
			return inner.Handle(ctx, tx, m)
		})
		return start(t, cfg), src
	}
	r, src := run()
	// LastOffset: produce once both partitions were fetched from, so that
	// the topic's start (its end) lies before the payment.
	waitUntil(t, time.Minute, "both partitions fetched from", func() bool {
		lanes := src.Describe().Lanes()
		for _, l := range lanes {
			if l.LastFetch.IsZero() {
				return false
			}
		}
		return len(lanes) == 2
	})
	v, _ := json.Marshal(payment{TxnID: "p-1", Amount: 7})
	a.Produce(t, topic, kafkago.Message{Key: []byte("p-1"), Value: v})
	waitUntil(t, time.Minute, "the payment sent to retry", func() bool { return r.Stats().RetriedLater >= 1 })
	a.WaitNoLag(t, group, topic)
	r.Stop(t) // before the copy is due: nothing of the retry partition was acknowledged
	if got := a.committed(t, group, retryTopic); got[0] >= 0 {
		t.Fatalf("the retry partition's committed offset is %d before the restart; the test needs none", got[0])
	}

	release.Store(true)
	r, _ = run()
	waitUntil(t, 30*time.Second, "the payment applied after the restart", func() bool { rows, _ := b.rows(t); return rows >= 1 })
	waitSettled(t, a, group, retryTopic)
	r.Stop(t)
	if rows, _ := b.rows(t); rows != 1 {
		t.Fatalf("%d ledger rows for one payment, want 1", rows)
	}
}

// TestKafkaRetryCopyTooLargeIsDeadLettered: a payment of 1.2 MB on a topic
// that takes 3 MB records fails and goes to retry, but its copy is past
// the retry writer's limit (1 MiB): no retry of the write can help, so it
// is dead-lettered — the letter without its value, cause exhausted — and
// the partition goes on, instead of retrying the write for ever.
func TestKafkaRetryCopyTooLargeIsDeadLettered(t *testing.T) {
	delays := []time.Duration{300 * time.Millisecond}
	brokers, a, topic, group := kafkaTest(t, 1)
	big := topic + ".big"
	a.CreateTopicWith(t, big, 1, []kafkago.ConfigEntry{{ConfigName: "max.message.bytes", ConfigValue: "3000000"}})
	for _, d := range delays {
		a.CreateTopic(t, kafka.RetryTopic(big, d), 1)
	}
	a.CreateTopic(t, big+".dlq", 1)
	b := newTestBank(t)
	v, _ := json.Marshal(map[string]any{"txn_id": "big", "amount": 1, "pad": strings.Repeat("x", 1200<<10)})
	ok, _ := json.Marshal(payment{TxnID: "after", Amount: 2})
	tr := &kafkago.Transport{}
	defer tr.CloseIdleConnections()
	w := &kafkago.Writer{Addr: kafkago.TCP(brokers...), BatchBytes: 4 << 20, RequiredAcks: kafkago.RequireAll, Transport: tr}
	if err := w.WriteMessages(ctxTimeout(t, 30*time.Second),
		kafkago.Message{Topic: big, Key: []byte("big"), Value: v}, kafkago.Message{Topic: big, Key: []byte("after"), Value: ok}); err != nil {
		t.Fatal(err)
	}
	w.Close()

	scfg := realSourceConfig(t, brokers, big, group)
	scfg.RetryDelays = delays
	src := newSource(t, scfg)
	cfg := b.config(src, src)
	cfg.Logger = testLogger(t)
	cfg.Retry = consumer.RetryPolicy{Initial: 10 * time.Millisecond, Max: 50 * time.Millisecond, MaxAttempts: 1000, MaxElapsed: time.Minute}
	cfg.Retries = consumer.NonBlocking{Attempts: 1, Delays: delays, Sink: src}
	inner := cfg.Handler
	cfg.Handler = consumer.HandlerFunc[pgx.Tx](func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if string(m.Key) == "big" {
			return consumer.Retryable(fmt.Errorf("the account service is down"))
		}
		return inner.Handle(ctx, tx, m)
	})
	r := start(t, cfg)
	waitUntil(t, 30*time.Second, "the big payment dead-lettered", func() bool { return r.Stats().DeadLettered >= 1 })
	a.WaitNoLag(t, group, big)
	r.Stop(t)
	b.requireLedger(t, map[string]bool{"after": true})
	letters := a.ReadAll(t, big+".dlq")
	if len(letters) != 1 || kafkatest.Header(letters[0], wire.MetaCause) != "exhausted" || len(letters[0].Value) != 0 {
		t.Fatalf("%d letters (first: cause %q, %d bytes of value), want one, exhausted, its value left out", len(letters),
			kafkatest.Header(letters[0], wire.MetaCause), len(letters[0].Value))
	}
	t.Logf("reason: %s", kafkatest.Header(letters[0], wire.MetaReason))
}

// TestKafkaRefusesARetiredRetryTopicWithCopies: the 1s delay was taken out
// of RetryDelays while pay.retry.1s still holds two copies the group began
// to read (it has an offset there) and has not: Run refuses to start,
// naming the topic and the count, rather than leave them unread for good
// (their originals were acknowledged). Once the group has read them, it
// starts.
func TestKafkaRefusesARetiredRetryTopicWithCopies(t *testing.T) {
	brokers, a, topic, group := retryTest(t, 1, []time.Duration{300 * time.Millisecond, time.Second})
	retired := kafka.RetryTopic(topic, time.Second)
	a.Produce(t, retired, kafkago.Message{Key: []byte("a"), Value: []byte("{}")}, kafkago.Message{Key: []byte("b"), Value: []byte("{}")})
	commitOffset(t, brokers, group, retired, 0, 0) // its retry reader's, before it read a copy
	scfg := sourceConfig(t, brokers, topic, group)
	scfg.RetryDelays = []time.Duration{300 * time.Millisecond}
	deliver := func(context.Context, *consumer.Message) error { return nil }
	err := newSource(t, scfg).Run(ctxTimeout(t, 30*time.Second), deliver)
	if !errors.Is(err, kafka.ErrRetiredRetryTopic) || !strings.Contains(err.Error(), retired+" holds 2") {
		t.Fatalf("Run: %v, want ErrRetiredRetryTopic naming %s and its 2 copies", err, retired)
	}
	scfg.RetryDelays = nil // Blocking again: the same
	if err := newSource(t, scfg).Run(ctxTimeout(t, 30*time.Second), deliver); !errors.Is(err, kafka.ErrRetiredRetryTopic) {
		t.Fatalf("Run without retry delays: %v, want ErrRetiredRetryTopic", err)
	}
	// The group read them (as it does with the delay put back): no refusal.
	commitOffset(t, brokers, group, retired, 0, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if err := newSource(t, scfg).Run(ctx, deliver); err != nil {
		t.Fatalf("Run once the copies were read: %v", err)
	}
}

// commitOffset commits offset as group's offset of topic's partition, as a
// member of no generation (the group must have no members).
func commitOffset(t *testing.T, brokers []string, group, topic string, partition int, offset int64) {
	t.Helper()
	tr := &kafkago.Transport{}
	defer tr.CloseIdleConnections()
	cl := &kafkago.Client{Addr: kafkago.TCP(brokers...), Transport: tr}
	res, err := cl.OffsetCommit(ctxTimeout(t, 10*time.Second), &kafkago.OffsetCommitRequest{GroupID: group, GenerationID: -1,
		Topics: map[string][]kafkago.OffsetCommit{topic: {{Partition: partition, Offset: offset}}}})
	if err == nil {
		for _, p := range res.Topics[topic] {
			err = errors.Join(err, p.Error)
		}
	}
	if err != nil {
		t.Fatalf("commit %s/%d at %d for %s: %v", topic, partition, offset, group, err)
	}
}

// TestKafkaForgedRedrivenCopyCannotTakeALaterKey: keyed by the message ID
// (a Kafka position no producer chooses), a payment at offset 2 must be
// applied whatever was produced before it. A forged "redriven copy" at
// offset 1 names the record at offset 0 as its original (which passes the
// lineage checks: an earlier offset of its own partition) but carries
// idem-key <topic>/0/2. Honoured, that key is claimed for the forgery, and
// the genuine record at offset 2 is refused as a fingerprint mismatch
// (or skipped, were the payloads equal): never applied.
func TestKafkaForgedRedrivenCopyCannotTakeALaterKey(t *testing.T) {
	brokers, a, topic, group := retryTest(t, 1, nil)
	b := newTestBank(t)
	pay := func(id string) []byte { v, _ := json.Marshal(payment{TxnID: id, Amount: 5}); return v }
	h := func(k, v string) kafkago.Header { return kafkago.Header{Key: k, Value: []byte(v)} }
	a.Produce(t, topic,
		kafkago.Message{Value: pay("p-0")},
		kafkago.Message{Value: pay("forged"), Headers: []kafkago.Header{
			h(wire.MetaRedriveCount, "1"), h(wire.MetaTopic, topic), h(wire.MetaPartition, "0"),
			h(wire.MetaOffset, "0"), h(wire.MetaMessageID, topic+"/0/0"),
			h(wire.MetaKeyScope, "payments"), h(wire.MetaKey, topic+"/0/2")}},
		kafkago.Message{Value: pay("p-2")})
	src := newSource(t, realSourceConfig(t, brokers, topic, group))
	cfg := b.config(src, src)
	cfg.Key = consumer.ByMessageID()
	cfg.Logger = testLogger(t)
	r := start(t, cfg)
	waitUntil(t, time.Minute, "three records settled", func() bool {
		st := r.Stats()
		return st.Applied+st.Duplicates+st.DeadLettered >= 3
	})
	a.WaitNoLag(t, group, topic)
	r.Stop(t)
	var genuine int
	if err := b.pool.QueryRow(ctxTimeout(t, 10*time.Second), `SELECT count(*) FROM `+b.table+` WHERE source = $1`,
		topic+"/0/2").Scan(&genuine); err != nil {
		t.Fatal(err)
	}
	if genuine != 1 {
		t.Fatalf("the genuine payment at %s/0/2: %d ledger rows, want 1: a forged redriven copy carrying its key took it first (stats %+v)",
			topic, genuine, r.Stats())
	}
}
