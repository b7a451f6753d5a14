package kafka_test

import (
	"context"
	"encoding/json"
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
	"github.com/idemkit/idem/dedup/memstore"
	"github.com/idemkit/idem/internal/testenv/retrytest"
)

// nonBlockingRetries: set false to watch TestKafkaNonBlockingRetries fail
// in the default (Blocking) mode, where the payments behind a failing one
// wait for it.
var nonBlockingRetries = true

func TestRetryTopic(t *testing.T) {
	for d, want := range map[time.Duration]string{
		10 * time.Second: "pay.retry.10s", time.Minute: "pay.retry.1m", 2 * time.Hour: "pay.retry.2h",
		1500 * time.Millisecond: "pay.retry.1500ms", 90 * time.Second: "pay.retry.90s",
	} {
		if got := kafka.RetryTopic("pay", d); got != want {
			t.Errorf("RetryTopic(pay, %v) = %q, want %q", d, got, want)
		}
	}
}

// TestKafkaNonBlockingRetries: 400 payments over 2 partitions; 5% of them
// (every 20th) fail with a retryable error until the test has seen every
// other payment booked, and one more ("uncertain") commits its booking
// while its COMMIT is reported failed, again and again in its partition.
// With NonBlocking retries the good payments are booked while the failing
// ones still fail (asserted on the ledger), the failing ones are booked
// once released, the uncertain one's retry copy is skipped, and a retry
// copy is never delivered before it is due. In three key modes: a
// business key, ByMessageID (the copy's key comes from its lineage only),
// and ByMessageID beside offsets in the store.
func TestKafkaNonBlockingRetries(t *testing.T) {
	for _, mode := range []string{"business-key", "message-id", "offsets"} {
		t.Run(mode, func(t *testing.T) { testNonBlocking(t, mode) })
	}
}

// retryDelays are the retry topics' delays of the non-blocking tests: 14 s
// of trips, so that the failing messages outlast an outage, under load too.
var retryDelays = []time.Duration{300 * time.Millisecond, time.Second, 3 * time.Second, 10 * time.Second}

// retryTest is kafkaTest with the topic's dead-letter topic and a retry
// topic for each of delays.
func retryTest(t *testing.T, partitions int, delays []time.Duration) (brokers []string, a *admin, topic, group string) {
	t.Helper()
	brokers, a, topic, group = kafkaTest(t, partitions)
	a.CreateTopic(t, topic+".dlq", partitions)
	for _, d := range delays {
		a.CreateTopic(t, kafka.RetryTopic(topic, d), partitions)
	}
	return brokers, a, topic, group
}

func testNonBlocking(t *testing.T, mode string) {
	const partitions, n = 2, 400
	delays := retryDelays
	brokers, a, topic, group := retryTest(t, partitions, delays)
	b := newTestBank(t)

	want, good, failing := map[string]bool{}, map[string]bool{}, map[string]bool{}
	var msgs []kafkago.Message
	for i := range n {
		id := fmt.Sprintf("p-%04d", i)
		if i == n/2 {
			id = "uncertain"
		}
		want[id] = true
		switch {
		case i%20 == 7:
			failing[id] = true
		case id != "uncertain":
			good[id] = true
		}
		v, _ := json.Marshal(payment{TxnID: id, Amount: int64(i%97 + 1)})
		msgs = append(msgs, kafkago.Message{Partition: i % partitions, Key: []byte(id), Value: v})
	}
	a.Produce(t, topic, msgs...)

	scfg := realSourceConfig(t, brokers, topic, group)
	scfg.RetryDelays = delays
	src := newSource(t, scfg)
	store := retrytest.NewLyingStore(b.store)
	cfg := b.config(src, src)
	cfg.Store = store
	cfg.Logger = testLogger(t)
	cfg.Retry = consumer.RetryPolicy{Initial: 20 * time.Millisecond, Max: 200 * time.Millisecond, MaxAttempts: 1000, MaxElapsed: 10 * time.Minute}
	switch mode {
	case "message-id":
		cfg.Key = consumer.ByMessageID()
	case "offsets":
		cfg.Key, cfg.Offsets = consumer.ByMessageID(), store
	}
	if nonBlockingRetries {
		cfg.Retries = consumer.NonBlocking{Attempts: 2, Delays: delays, Sink: src}
	}
	var release atomic.Bool
	var early retrytest.EarlyCopies
	inner := cfg.Handler
	cfg.Handler = consumer.HandlerFunc[pgx.Tx](func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		early.Handled(m)
		var p payment
		_ = json.Unmarshal(m.Value, &p)
		if failing[p.TxnID] && !release.Load() {
			return consumer.Retryable(fmt.Errorf("%s: the account service is down", p.TxnID))
		}
		if p.TxnID == "uncertain" && m.Topic == topic {
			store.Target(m.Ref())
		}
		return inner.Handle(ctx, tx, m)
	})
	r := start(t, cfg)

	booked := func(ids map[string]bool) int {
		ctx := ctxTimeout(t, 10*time.Second)
		list := make([]string, 0, len(ids))
		for id := range ids {
			list = append(list, id)
		}
		var c int
		if err := b.pool.QueryRow(ctx, `SELECT count(DISTINCT txn_id) FROM `+b.table+` WHERE txn_id = ANY($1)`, list).Scan(&c); err != nil {
			t.Fatal(err)
		}
		return c
	}
	waitUntil(t, time.Minute, "every good payment booked while the failing ones fail", func() bool { return booked(good) == len(good) })
	if c := booked(failing); c != 0 {
		t.Fatalf("%d failing payments booked before their release", c)
	}
	release.Store(true)
	waitUntil(t, time.Minute, "every payment booked", func() bool { return booked(want) == len(want) })
	a.WaitNoLag(t, group, topic)
	for _, d := range delays {
		waitSettled(t, a, group, kafka.RetryTopic(topic, d))
	}
	r.Stop(t)

	if mode == "offsets" {
		requireBookedOnce(t, b, want)
	} else {
		b.requireLedger(t, want)
	}
	st := r.Stats()
	if st.DeadLettered != 0 || st.RetriedLater < int64(len(failing)) {
		t.Errorf("stats %+v: want no dead letters and at least %d trips to retry", st, len(failing))
	}
	if store.Lies() == 0 {
		t.Error("the uncertain payment's COMMIT was never reported failed")
	}
	if mode != "offsets" {
		// The uncertain payment went to retry (with offsets in the store
		// the next attempt finds it below the stored offset, in its lane)
		// and its copy was skipped: requireLedger saw one row.
		copies := 0
		for _, m := range a.ReadAll(t, kafka.RetryTopic(topic, delays[0])) {
			if string(m.Key) == "uncertain" {
				copies++
			}
		}
		if copies == 0 {
			t.Error("the uncertain payment never went to retry")
		}
	}
	early.Check(t)
	t.Logf("%s: applied %d, duplicates %d, trips to retry %d, COMMITs reported failed %d",
		mode, st.Applied, st.Duplicates, st.RetriedLater, store.Lies())
}

// waitSettled is WaitNoLag for a topic whose partitions may have stayed
// empty: those have no offset to commit.
func waitSettled(t *testing.T, a *admin, group, topic string) {
	t.Helper()
	waitUntil(t, time.Minute, "the group has no lag on "+topic, func() bool {
		ctx := ctxTimeout(t, 10*time.Second)
		hwm, err := a.HighWatermarks(ctx, topic)
		if err != nil {
			return false
		}
		got, err := a.Committed(ctx, group, topic)
		if err != nil || len(got) != len(hwm) {
			return false
		}
		for i := range hwm {
			if hwm[i] > 0 && got[i] != hwm[i] {
				return false
			}
		}
		return true
	})
}

// requireBookedOnce: one ledger row per payment of want, nothing else.
func requireBookedOnce(t *testing.T, b *bank, want map[string]bool) {
	t.Helper()
	rows, distinct := b.rows(t)
	if rows != len(want) || distinct != len(want) {
		t.Fatalf("%d ledger rows of %d payments, want %d of %d", rows, distinct, len(want), len(want))
	}
}

func TestSourceReadsItsRetryTopics(t *testing.T) {
	src, err := kafka.New(kafka.Config{Brokers: []string{"h:1"}, Topics: []string{"pay"}, Group: "g",
		RetryDelays: []time.Duration{10 * time.Second, time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	for topic, want := range map[string]string{"pay.retry.10s": "pay", "pay.retry.1m": "pay", "pay": "", "pay.retry.5s": ""} {
		if got, ok := src.Describe().RetryOf(topic); got != want || ok != (want != "") {
			t.Errorf("RetryOf(%q) = %q, %v; want %q", topic, got, ok, want)
		}
	}
	err = src.Retry(context.Background(), consumer.RetryLetter{Letter: consumer.Letter{Message: &consumer.Message{Topic: "pay"}}, Retry: wire.Retry{Delay: 5 * time.Second}})
	if err == nil || !strings.Contains(err.Error(), "no retry topic for delay 5s") {
		t.Errorf("Retry with an unknown delay: %v", err)
	}
	_, err = consumer.New(consumer.Config[*memstore.Tx]{Name: "p", Source: src, Store: memstore.New(memstore.Config{}), DeadLetter: src,
		Key: consumer.ByMessageID(), Handler: consumer.HandlerFunc[*memstore.Tx](func(context.Context, *memstore.Tx, *consumer.Message) error { return nil }),
		Retries: consumer.NonBlocking{Delays: []time.Duration{10 * time.Second, 5 * time.Second}, Sink: src}})
	if err == nil || !strings.Contains(err.Error(), "Retries.Delays[1] is 5s") {
		t.Errorf("consumer.New with a delay the source has no topic for: %v", err)
	}
}
