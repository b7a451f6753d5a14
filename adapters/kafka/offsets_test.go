package kafka_test

// Offsets in the store (consumer.Config.Offsets) on the real broker: the
// consumer keyed by offset alone, its progress in the store's offsets
// table, the group's offsets advisory.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	kafkago "github.com/segmentio/kafka-go"

	"github.com/idemkit/idem/adapters/kafka"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/consumer/source"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/pgstore"
	"github.com/idemkit/idem/internal/testenv"
)

// uniquePayments builds n callbacks with distinct transactions, round-robin
// over the partitions: keyed by offset alone, a re-send would be a new
// payment.
func uniquePayments(prefix string, n, partitions int) ([]kafkago.Message, map[string]bool) {
	msgs := make([]kafkago.Message, n)
	want := make(map[string]bool, n)
	for i := range msgs {
		id := fmt.Sprintf("%s-%06d", prefix, i)
		want[id] = true
		v, _ := json.Marshal(payment{TxnID: id, Amount: int64(i%97 + 1)})
		msgs[i] = kafkago.Message{Partition: i % partitions, Key: []byte(id), Value: v}
	}
	return msgs, want
}

// offsetsConfig is the bank's consumer with offsets in the store and no key
// rows.
func (b *bank) offsetsConfig(t testing.TB, store *pgstore.Store, src source.Source) consumer.Config[pgx.Tx] {
	cfg := b.config(src, &consumertest.DeadLetters{})
	cfg.Store, cfg.Offsets, cfg.Key = store, store, nil
	cfg.Logger = testLogger(t)
	return cfg
}

// requireOffsetsLedger fails unless the ledger holds one row per
// transaction of want and nothing else, the key table nothing, and the
// store's next offsets are topic's high watermarks.
func (b *bank) requireOffsetsLedger(t testing.TB, a *admin, topic string, want map[string]bool) {
	t.Helper()
	rows, distinct := b.rows(t)
	if rows != len(want) || distinct != len(want) {
		t.Fatalf("ledger: %d rows, %d distinct; want %d each", rows, distinct, len(want))
	}
	var keyRows int
	if err := b.pool.QueryRow(ctxTimeout(t, 10*time.Second), `SELECT count(*) FROM `+b.store.Table()).Scan(&keyRows); err != nil {
		t.Fatal(err)
	}
	if keyRows != 0 {
		t.Errorf("%d key rows, want none", keyRows)
	}
	stored, err := b.store.NextOffsets(ctxTimeout(t, 10*time.Second), "payments", topic)
	if err != nil {
		t.Fatal(err)
	}
	for p, hwm := range a.highWatermarks(t, topic) {
		if stored[int32(p)] != hwm {
			t.Errorf("partition %d: stored next offset %d, high watermark %d", p, stored[int32(p)], hwm)
		}
	}
}

// TestKafkaOffsetsCrashBetweenCommits: a consumer keyed by offset is killed
// (SIGKILL, a child process that never commits a group offset: every batch
// it did lies between the database commit and the Kafka commit). A second
// consumer starting from the group's offsets is redelivered the child's
// work and skips it by the stored offsets; after a second kill, a third
// starting from the store's offsets (Config.StartOffsets) is not even
// redelivered it. Every payment is booked once, and the group's offsets are
// still committed to the end.
func TestKafkaOffsetsCrashBetweenCommits(t *testing.T) {
	const partitions, n = 4, 3000
	brokers, a, topic, group := kafkaTest(t, partitions)
	b := newTestBank(t)
	msgs, want := uniquePayments("one", n, partitions)
	a.Produce(t, topic, msgs...)
	rowsAtLeast := func(n int) func() bool {
		return func() bool { rows, _ := b.rows(t); return rows >= n }
	}

	// 1: the child books some, commits no group offset, and is killed.
	child := startChild(t, topic, group, b.schema, "CHILD_OFFSETS=1")
	waitUntil(t, time.Minute, "1,000 rows", rowsAtLeast(1000))
	child.kill(t)
	killedAt, _ := b.rows(t)
	for p, off := range a.committed(t, group, topic) {
		if off >= 0 {
			t.Fatalf("the child committed a group offset: partition %d at %d", p, off)
		}
	}

	// 2: from the group's offsets (none: the log start).
	r := start(t, b.offsetsConfig(t, b.store, newSource(t, realSourceConfig(t, brokers, topic, group))))
	waitUntil(t, 2*time.Minute, "every payment booked", rowsAtLeast(n))
	a.WaitNoLag(t, group, topic)
	r.Stop(t)
	st := r.Stats()
	t.Logf("child booked %d before the kill; second consumer: %+v", killedAt, st)
	if st.Duplicates < int64(killedAt) {
		t.Fatalf("second consumer skipped %d duplicates, want at least the %d the child booked", st.Duplicates, killedAt)
	}

	// 3: more payments, a child killed again, and a consumer starting from
	// the store's offsets.
	more, want2 := uniquePayments("two", n, partitions)
	maps.Copy(want, want2)
	a.Produce(t, topic, more...)
	child = startChild(t, topic, group, b.schema, "CHILD_OFFSETS=1")
	waitUntil(t, time.Minute, "1,000 more rows", rowsAtLeast(n+1000))
	child.kill(t)
	killedAt, _ = b.rows(t)
	scfg := realSourceConfig(t, brokers, topic, group)
	scfg.StartOffsets = kafka.StoreOffsets(b.store, "payments")
	r = start(t, b.offsetsConfig(t, b.store, newSource(t, scfg)))
	waitUntil(t, 2*time.Minute, "every payment booked", rowsAtLeast(2*n))
	a.WaitNoLag(t, group, topic)
	r.Stop(t)
	st = r.Stats()
	t.Logf("child booked %d of the second lot before the kill; third consumer: %+v", killedAt-n, st)
	if max := int64(2*n - killedAt); st.Delivered > max {
		t.Fatalf("third consumer was delivered %d messages; starting from the store it needs at most %d", st.Delivered, max)
	}
	b.requireOffsetsLedger(t, a, topic, want)
	a.requireNoLag(t, group, topic)
}

// TestKafkaOffsetsZombie: two consumers of one name in two groups both
// believe they own the only partition. The first stalls inside a batch's
// transaction, holding the partition's offset row; the second's batch over
// the same offsets waits for it, times out and rolls back (retried, not
// applied), and once the first commits, the second skips what it applied.
// Every payment is booked once.
func TestKafkaOffsetsZombie(t *testing.T) {
	const n = 400
	brokers, a, topic, zgroup := kafkaTest(t, 1)
	ogroup := name(t, "owner")
	b := newTestBank(t)
	msgs, want := uniquePayments("z", n, 1)
	a.Produce(t, topic, msgs...)

	entered, release := make(chan struct{}), make(chan struct{})
	zcfg := b.offsetsConfig(t, b.store, newSource(t, realSourceConfig(t, brokers, topic, zgroup)))
	inner := zcfg.Handler
	zcfg.Handler = consumer.HandlerFunc[pgx.Tx](func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if m.Offset == n/2 {
			close(entered)
			select { // stalled, its transaction open
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return inner.Handle(ctx, tx, m)
	})
	zombie := start(t, zcfg)
	<-entered

	impatient, err := pgstore.New(b.pool, pgstore.Config{Schema: b.schema, LockTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	owner := start(t, b.offsetsConfig(t, impatient, newSource(t, realSourceConfig(t, brokers, topic, ogroup))))
	waitUntil(t, time.Minute, "the owner's batch over the stalled offsets rolled back and retried", func() bool {
		return owner.Stats().Retries >= 2
	})
	if rows, _ := b.rows(t); rows >= n/2+1 {
		t.Fatalf("%d rows booked while the zombie holds offset %d", rows, n/2)
	}
	close(release)
	waitUntil(t, time.Minute, "every payment booked", func() bool { rows, _ := b.rows(t); return rows >= n })
	a.WaitNoLag(t, zgroup, topic)
	a.WaitNoLag(t, ogroup, topic)
	zombie.Stop(t)
	owner.Stop(t)
	zs, ost := zombie.Stats(), owner.Stats()
	t.Logf("zombie %+v; owner %+v", zs, ost)
	if zs.Applied+ost.Applied != n {
		t.Fatalf("applied %d + %d, want %d in all", zs.Applied, ost.Applied, n)
	}
	b.requireOffsetsLedger(t, a, topic, want)
}

// TestKafkaOffsetsTopicRecreated: the topic is deleted and created again
// while the store's next offset is 10; the new log's messages (offsets 0–2)
// lie below it. The consumer refuses to skip them: Run returns
// dedup.ErrOffsetsAhead, nothing is booked, until the topic's offsets are
// reset.
func TestKafkaOffsetsTopicRecreated(t *testing.T) {
	brokers, a, topic, group := kafkaTest(t, 1)
	b := newTestBank(t)
	old, want := uniquePayments("old", 10, 1)
	a.Produce(t, topic, old...)
	scfg := realSourceConfig(t, brokers, topic, group)
	scfg.StartOffsets = kafka.StoreOffsets(b.store, "payments")
	r := start(t, b.offsetsConfig(t, b.store, newSource(t, scfg)))
	waitUntil(t, time.Minute, "the old payments booked", func() bool { rows, _ := b.rows(t); return rows >= 10 })
	a.WaitNoLag(t, group, topic)
	r.Stop(t)

	a.recreate(t, topic, 1)
	reborn, want2 := uniquePayments("new", 3, 1)
	a.Produce(t, topic, reborn...)
	c, err := consumer.New(b.offsetsConfig(t, b.store, newSource(t, scfg)))
	if err != nil {
		t.Fatal(err)
	}
	runErr := make(chan error, 1)
	go func() { runErr <- c.Run(testenv.Context(t, 2*time.Minute)) }()
	err = <-runErr
	if !errors.Is(err, dedup.ErrOffsetsAhead) {
		t.Fatalf("Run: %v; want ErrOffsetsAhead", err)
	}
	t.Log(err)
	if rows, _ := b.rows(t); rows != 10 {
		t.Fatalf("%d rows after the refusal, want the 10 old ones", rows)
	}

	if n, err := b.store.ResetOffsets(ctxTimeout(t, 10*time.Second), "payments", topic); err != nil || n != 1 {
		t.Fatalf("ResetOffsets: %d, %v", n, err)
	}
	r = start(t, b.offsetsConfig(t, b.store, newSource(t, scfg)))
	waitUntil(t, time.Minute, "the new payments booked", func() bool { rows, _ := b.rows(t); return rows >= 13 })
	a.WaitNoLag(t, group, topic)
	r.Stop(t)
	maps.Copy(want, want2)
	b.requireOffsetsLedger(t, a, topic, want)
}

// TestKafkaOffsetsStartFromStore: the store's offsets are at the log's end
// and the group's are not (a consumer committed its batches to the database
// and died before the group commit). A consumer with Config.StartOffsets
// fetches nothing below them, brings the group's offsets up to them although
// nothing new arrives, and books what comes next.
func TestKafkaOffsetsStartFromStore(t *testing.T) {
	const partitions = 2
	brokers, a, topic, group := kafkaTest(t, partitions)
	b := newTestBank(t)
	old, _ := uniquePayments("old", 20, partitions)
	a.Produce(t, topic, old...)
	ctx := ctxTimeout(t, time.Minute)
	for p, hwm := range a.highWatermarks(t, topic) {
		err := b.store.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
			ok, err := b.store.AdvanceOffset(ctx, tx, dedup.Partition{Scope: "payments", Topic: topic, Partition: int32(p)}, 0, hwm)
			if err == nil && !ok {
				err = errors.New("refused")
			}
			return err
		})
		if err != nil {
			t.Fatalf("partition %d: %v", p, err)
		}
	}
	scfg := realSourceConfig(t, brokers, topic, group)
	scfg.StartOffsets = kafka.StoreOffsets(b.store, "payments")
	r := start(t, b.offsetsConfig(t, b.store, newSource(t, scfg)))
	a.WaitNoLag(t, group, topic)
	if st := r.Stats(); st.Delivered != 0 {
		t.Fatalf("%+v; want nothing below the store's offsets delivered", st)
	}
	more, want := uniquePayments("new", 4, partitions)
	a.Produce(t, topic, more...)
	waitUntil(t, time.Minute, "the new payments booked", func() bool { rows, _ := b.rows(t); return rows >= len(want) })
	a.WaitNoLag(t, group, topic)
	r.Stop(t)
	if st := r.Stats(); st.Delivered != int64(len(want)) || st.Duplicates != 0 {
		t.Fatalf("%+v; want the %d new payments delivered, no duplicate", st, len(want))
	}
	b.requireOffsetsLedger(t, a, topic, want)
}

// TestStoreOffsetsScopeMustBeTheConsumersName (issue 25, item 8d): a
// StoreOffsets of another scope than the consumer's Name reads no offsets
// (another consumer's, or none) and started every partition at the
// group's offset without a word; consumer.New now refuses it, naming both.
func TestStoreOffsetsScopeMustBeTheConsumersName(t *testing.T) {
	pool := testenv.Pool(t)
	store, err := pgstore.New(pool, pgstore.Config{Schema: testenv.Schema(t, pool)})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		scope string
		ok    bool
	}{{"payments", true}, {"payment", false}, {"", false}} {
		src, err := kafka.New(kafka.Config{Brokers: []string{"127.0.0.1:1"}, Topics: []string{"payments"}, Group: "g",
			StartOffsets: kafka.StoreOffsets(store, tc.scope)})
		if err != nil {
			t.Fatal(err)
		}
		_, err = consumer.New(consumer.Config[pgx.Tx]{
			Name: "payments", Source: src, Store: store, Offsets: store, DeadLetter: &consumertest.DeadLetters{},
			Handler: consumer.HandlerFunc[pgx.Tx](func(context.Context, pgx.Tx, *consumer.Message) error { return nil }),
		})
		switch {
		case tc.ok && err != nil:
			t.Errorf("StoreOffsets(store, %q) for the consumer payments: %v", tc.scope, err)
		case !tc.ok && (err == nil || !strings.Contains(err.Error(), fmt.Sprintf("scope %q", tc.scope)) || !strings.Contains(err.Error(), `Name is "payments"`)):
			t.Errorf("StoreOffsets(store, %q) for the consumer payments: %v, want an error naming the scope and the Name", tc.scope, err)
		}
	}
}
