package twohop_test

import (
	"context"
	"hash/fnv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/dedup/pgstore"
	"github.com/idemkit/idem/examples/payments"
	"github.com/idemkit/idem/examples/twohop"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/internal/testenv/pgtest"
	"github.com/idemkit/idem/internal/testenv/relaytest"
	"github.com/idemkit/idem/outbox"
)

// world is one test's database: the payments and shipping tables, the dedup
// store and the outbox, in a schema of its own.
type world struct {
	pool   *pgxpool.Pool
	schema string
	store  *pgstore.Store
	ob     *outbox.Outbox
	stream payments.Stream
}

func newWorld(t *testing.T, pool *pgxpool.Pool, schema string, n int, seed uint64) *world {
	t.Helper()
	ctx := testenv.Context(t, time.Minute)
	store := pgtest.Store(t, pool, schema)
	ob := relaytest.OutboxIn(t, pool, schema)
	if err := twohop.Setup(ctx, payments.Pgx(pool)); err != nil {
		t.Fatal(err)
	}
	s := payments.Generate(n, seed)
	if err := payments.CreateOrders(ctx, payments.Pgx(pool), s.Orders); err != nil {
		t.Fatal(err)
	}
	return &world{pool: pool, schema: schema, store: store, ob: ob, stream: s}
}

// callbacks are the stream's payloads as Kafka-like messages on four
// partitions, keyed by order.
func (w *world) callbacks() []*consumer.Message {
	var msgs []*consumer.Message
	offsets := map[int32]int64{}
	for _, p := range w.stream.Payloads {
		key := payments.PartitionKey(p)
		part := partitionOf([]byte(key), 4)
		msgs = append(msgs, consumertest.Message("payment-callbacks", part, offsets[part], key, string(p)))
		offsets[part]++
	}
	return msgs
}

func partitionOf(key []byte, n int) int32 {
	h := fnv.New32a()
	h.Write(key)
	return int32(h.Sum32() % uint32(n))
}

// paymentsConfig is the first hop's consumer; Source is left to the caller.
func (w *world) paymentsConfig(t testing.TB, topic string) consumer.Config[pgx.Tx] {
	return consumer.Config[pgx.Tx]{
		Name: twohop.PaymentsName, Store: w.store, Handler: twohop.PaymentsHandler(w.ob, topic),
		Key: consumer.ByJSONField(payments.KeyField), MaxPayloadBytes: payments.MaxPayload, BatchSize: 20,
		Logger: testenv.Logger(t),
	}
}

// shippingConfig is the second hop's consumer, keyed by the outbox identity.
func (w *world) shippingConfig(t testing.TB) consumer.Config[pgx.Tx] {
	return consumer.Config[pgx.Tx]{
		Name: twohop.ShippingName, Store: w.store, Handler: twohop.ShippingHandler(),
		Key: consumer.ByHeader(outbox.HeaderID), BatchSize: 50, Logger: testenv.Logger(t),
		Retry: consumer.RetryPolicy{Initial: 20 * time.Millisecond, Max: 500 * time.Millisecond},
	}
}

// bookPayments runs the first hop over the stream, each callback delivered
// one to three times with lost acks, and checks what it dead-lettered.
func (w *world) bookPayments(t *testing.T, topic string) consumertest.Result {
	t.Helper()
	res := consumertest.Run(t, w.paymentsConfig(t, topic),
		consumertest.Script{MinDeliveries: 1, MaxDeliveries: 3, ReorderWindow: 4, CrashAfterCommitEvery: 5, Seed: 7}, w.callbacks()...)
	if res.Stats.Applied != int64(len(w.stream.Expected)) {
		t.Fatalf("first hop applied %d of %d payments: %v", res.Stats.Applied, len(w.stream.Expected), res)
	}
	return res
}

func (w *world) reconcile(t *testing.T) twohop.Report {
	t.Helper()
	r, err := twohop.Reconcile(testenv.Context(t, time.Minute), w.pool, w.store.Table(), w.ob, w.stream.Expected)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// loopback is a Publisher that "publishes" into a slice of messages as a
// Kafka topic of four partitions would hold them, every third record twice
// (an at-least-once relay's copies).
type loopback struct {
	mu      sync.Mutex
	n       int
	msgs    []*consumer.Message
	offsets map[int32]int64
	copies  int
}

func (l *loopback) Publish(_ context.Context, recs []outbox.Record, _ []error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.offsets == nil {
		l.offsets = map[int32]int64{}
	}
	for _, r := range recs {
		l.n++
		times := 1
		if l.n%3 == 0 {
			times, l.copies = 2, l.copies+1
		}
		for range times {
			part := partitionOf(r.Key, 4)
			m := consumertest.Message(r.Topic, part, l.offsets[part], string(r.Key), string(r.Value))
			m.Headers = r.Headers
			l.offsets[part]++
			l.msgs = append(l.msgs, m)
		}
	}
}

// TestTwoHopsWithoutABroker: callbacks with duplicates book payments and
// enqueue events; a relay publishes them at least once (a third twice);
// shipping, delivered each copy up to twice more, ships every paid order
// once. Both hops reconcile.
func TestTwoHopsWithoutABroker(t *testing.T) {
	pool, schema := testenv.SchemaPool(t)
	w := newWorld(t, pool, schema, 300, 11)
	w.bookPayments(t, "order.paid")
	lb := &loopback{}
	relay := relaytest.StartRelay(t, outbox.RelayConfig{Outbox: w.ob, Publisher: lb})
	testenv.WaitUntilProgress(t, time.Minute, "the outbox drained", func() (bool, string) { return relaytest.Pending(t, pool, w.ob) == 0, "" })
	if st := relay.Stats(); st.Published != int64(len(w.stream.Expected)) {
		t.Fatalf("relay published %d events for %d payments", st.Published, len(w.stream.Expected))
	}
	lb.mu.Lock()
	msgs, copies := lb.msgs, lb.copies
	lb.mu.Unlock()
	res := consumertest.Run(t, w.shippingConfig(t), consumertest.Script{MinDeliveries: 1, MaxDeliveries: 2, CrashAfterCommitEvery: 7, Seed: 3}, msgs...)
	if res.Stats.Applied != int64(len(w.stream.Expected)) || res.Stats.Duplicates < int64(copies) || len(res.DeadLetters) != 0 {
		t.Fatalf("shipping: %v, want %d applied and at least %d duplicates", res, len(w.stream.Expected), copies)
	}
	if r := w.reconcile(t); !r.OK() || r.Shipped != int64(len(w.stream.Expected)) {
		t.Fatalf("%v", r)
	}
}

// TestReconcileCatchesSecondHopFaults breaks the second hop one way at a
// time; every check can fail.
func TestReconcileCatchesSecondHopFaults(t *testing.T) {
	pool, schema := testenv.SchemaPool(t)
	w := newWorld(t, pool, schema, 40, 5)
	w.bookPayments(t, "order.paid")
	lb := &loopback{}
	relay := relaytest.StartRelay(t, outbox.RelayConfig{Outbox: w.ob, Publisher: lb})
	testenv.WaitUntilProgress(t, time.Minute, "the outbox drained", func() (bool, string) { return relaytest.Pending(t, pool, w.ob) == 0, "" })
	// Stopped, so that the event put into the outbox below stays there.
	if err := relay.Stop(testenv.Context(t, time.Minute)); err != nil {
		t.Fatal(err)
	}
	lb.mu.Lock()
	msgs := lb.msgs
	lb.mu.Unlock()
	consumertest.Run(t, w.shippingConfig(t), consumertest.Script{}, msgs...)
	if r := w.reconcile(t); !r.OK() {
		t.Fatalf("before the faults: %v", r)
	}
	ctx := testenv.Context(t, time.Minute)
	exec := func(sql string) {
		t.Helper()
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	for _, c := range []struct {
		name         string
		break_, mend string
		counter      func(r twohop.Report) int64
	}{
		{"an order shipped twice",
			`INSERT INTO shipments (order_id, txn_id, event_id, sku) SELECT order_id, txn_id, event_id, sku FROM shipments WHERE id = (SELECT min(id) FROM shipments);
			 UPDATE warehouse SET shipped = shipped + 1 WHERE sku = (SELECT sku FROM shipments WHERE id = (SELECT min(id) FROM shipments))`,
			`DELETE FROM shipments WHERE id = (SELECT max(id) FROM shipments);
			 UPDATE warehouse SET shipped = shipped - 1 WHERE sku = (SELECT sku FROM shipments WHERE id = (SELECT min(id) FROM shipments))`,
			func(r twohop.Report) int64 { return r.ShippedTwice }},
		{"a paid order never shipped",
			`CREATE TABLE saved AS SELECT * FROM shipments WHERE id = (SELECT min(id) FROM shipments); DELETE FROM shipments WHERE id IN (SELECT id FROM saved)`,
			`INSERT INTO shipments SELECT * FROM saved; DROP TABLE saved`,
			func(r twohop.Report) int64 { return r.Unshipped }},
		{"a shipment by another event",
			`UPDATE shipments SET event_id = 'x' || event_id WHERE id = (SELECT min(id) FROM shipments)`,
			`UPDATE shipments SET event_id = substr(event_id, 2) WHERE id = (SELECT min(id) FROM shipments)`,
			func(r twohop.Report) int64 { return r.WrongEvent }},
		{"a warehouse count off",
			`UPDATE warehouse SET shipped = shipped + 1 WHERE sku = (SELECT min(sku) FROM warehouse)`,
			`UPDATE warehouse SET shipped = shipped - 1 WHERE sku = (SELECT min(sku) FROM warehouse)`,
			func(r twohop.Report) int64 { return r.Warehouse }},
		{"an event still in the outbox",
			`INSERT INTO ` + w.ob.Table() + ` (id, parent_scope, parent_key, position, shard, topic) VALUES (repeat('0', 32), 's', 'k', 0, 0, 't')`,
			`DELETE FROM ` + w.ob.Table(),
			func(r twohop.Report) int64 { return r.OutboxPending }},
	} {
		exec(c.break_)
		r := w.reconcile(t)
		if r.OK() || c.counter(r) != 1 {
			t.Errorf("%s went unnoticed: %v", c.name, r)
		}
		exec(c.mend)
		if r := w.reconcile(t); !r.OK() {
			t.Fatalf("after mending %s: %v", c.name, r)
		}
	}
}
