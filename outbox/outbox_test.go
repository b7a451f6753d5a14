package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/pgstore"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/internal/testenv/pgtest"
	"github.com/idemkit/idem/internal/testenv/relaytest"
	"github.com/idemkit/idem/outbox"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// outboxAndStore migrates an outbox and a dedup store into one fresh
// schema.
func outboxAndStore(t *testing.T) (*outbox.Outbox, *pgxpool.Pool, *pgstore.Store) {
	t.Helper()
	ob, pool, schema := relaytest.NewOutbox(t)
	store := pgtest.Store(t, pool, schema)
	return ob, pool, store
}

// payments are n payment callbacks, {"txn_id":"T000"} and on, spread over
// partitions partitions of the topic "payments".
func payments(n, partitions int) []*consumer.Message {
	var msgs []*consumer.Message
	for i := range n {
		msgs = append(msgs, consumertest.Message("payments", int32(i%partitions), int64(i/partitions), "", fmt.Sprintf(`{"txn_id":"T%03d"}`, i)))
	}
	return msgs
}

// runWithCrashes runs cfg over msgs, each delivered one to three times,
// reordered, with a crash after every third commit. It fails the test when
// no duplicate was delivered: the test would prove nothing.
func runWithCrashes(t *testing.T, cfg consumer.Config[pgx.Tx], msgs []*consumer.Message) consumertest.Result {
	t.Helper()
	res := consumertest.Run(t, cfg, consumertest.Script{MinDeliveries: 1, MaxDeliveries: 3, ReorderWindow: 8, CrashAfterCommitEvery: 3}, msgs...)
	if res.Stats.Duplicates == 0 {
		t.Fatalf("no duplicates delivered: the test proves nothing (%v)", res)
	}
	return res
}

// row is what a test reads back from the outbox table.
type row struct {
	ID, Scope, Key string
	Position       int
	Topic          string
	MsgKey, Value  []byte
	Sent           bool
}

func rows(t *testing.T, pool *pgxpool.Pool, table string) []row {
	t.Helper()
	rs, err := pool.Query(context.Background(), `SELECT id, parent_scope, parent_key, position, topic, key, value, sent_at IS NOT NULL FROM `+table+` ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rs, func(r pgx.CollectableRow) (row, error) {
		var w row
		err := r.Scan(&w.ID, &w.Scope, &w.Key, &w.Position, &w.Topic, &w.MsgKey, &w.Value, &w.Sent)
		return w, err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func msg(topic, key, value string) outbox.Message {
	m := outbox.Message{Topic: topic, Value: []byte(value)}
	if key != "" {
		m.Key = []byte(key)
	}
	return m
}

func inTx(t *testing.T, pool *pgxpool.Pool, fn func(tx pgx.Tx) error) error {
	t.Helper()
	return pgx.BeginFunc(testenv.Context(t, time.Minute), pool, fn)
}

func TestCheckAndMigrate(t *testing.T) {
	pool, schema := testenv.SchemaPool(t)
	ob, err := outbox.New(pool, outbox.Config{Schema: schema, Table: "events_out"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := testenv.Context(t, time.Minute)
	if err := ob.Check(ctx); !errors.Is(err, dedup.ErrNotMigrated) {
		t.Fatalf("Check before Migrate: %v, want ErrNotMigrated", err)
	}
	for range 2 {
		if err := ob.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := ob.Check(ctx); err != nil {
		t.Fatal(err)
	}
	if got, want := ob.DeadTable(), `"`+schema+`"."events_out_dead"`; got != want {
		t.Errorf("DeadTable %s, want %s", got, want)
	}
	for _, bad := range []outbox.Config{{Schema: "Public"}, {Table: "x;drop"}, {Table: strings.Repeat("t", 49)}} {
		if _, err := outbox.New(pool, bad); err == nil {
			t.Errorf("New(%+v) accepted", bad)
		}
	}
}

// TestEnqueueCommitsWithItsTransaction: a rolled-back transaction leaves
// no row, a committed one leaves its messages with identities derived from
// the parent key and their position — computed by the server as MessageID
// computes them.
func TestEnqueueCommitsWithItsTransaction(t *testing.T) {
	ob, pool, _ := relaytest.NewOutbox(t)
	ctx := testenv.Context(t, time.Minute)
	parent := dedup.Key{Scope: "payments", ID: "4200000001"}
	boom := errors.New("handler failed")
	err := inTx(t, pool, func(tx pgx.Tx) error {
		if err := ob.EnqueueFor(ctx, tx, parent, msg("order.paid", "O-1", `{"n":1}`)); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatal(err)
	}
	if got := rows(t, pool, ob.Table()); len(got) != 0 {
		t.Fatalf("a rolled-back transaction left %d rows", len(got))
	}
	// Two calls in one transaction: positions go on from the first.
	err = inTx(t, pool, func(tx pgx.Tx) error {
		if err := ob.EnqueueFor(ctx, tx, parent, msg("order.paid", "O-1", `{"n":1}`), msg("audit", "", `{"n":2}`)); err != nil {
			return err
		}
		return ob.EnqueueFor(ctx, tx, parent, outbox.Message{Topic: "order.paid", Key: []byte("O-1"), Value: []byte(`{"n":3}`),
			Headers: []consumer.Header{{Key: "trace", Value: []byte("t-1")}}})
	})
	if err != nil {
		t.Fatal(err)
	}
	got := rows(t, pool, ob.Table())
	if len(got) != 3 {
		t.Fatalf("%d rows, want 3", len(got))
	}
	for i, r := range got {
		if r.Position != i || r.Scope != parent.Scope || r.Key != parent.ID || r.ID != outbox.MessageID(parent, i) || r.Sent {
			t.Errorf("row %d: %+v, want position %d and ID %s", i, r, i, outbox.MessageID(parent, i))
		}
		if want := fmt.Sprintf(`{"n":%d}`, i+1); string(r.Value) != want {
			t.Errorf("row %d: value %s, want %s", i, r.Value, want)
		}
	}
	if got[1].MsgKey != nil {
		t.Errorf("a message without a key was stored with key %q", got[1].MsgKey)
	}
	// The same work again in a new transaction (its dedup row purged, say):
	// the same identities, already in the outbox, are not added twice.
	err = inTx(t, pool, func(tx pgx.Tx) error {
		return ob.EnqueueFor(ctx, tx, parent, msg("order.paid", "O-1", `{"n":1}`), msg("audit", "", `{"n":2}`), msg("x", "", "new"), msg("y", "", "new"))
	})
	if err != nil {
		t.Fatal(err)
	}
	got = rows(t, pool, ob.Table())
	if len(got) != 4 || got[3].Position != 3 || got[3].Topic != "y" || string(got[2].Value) != `{"n":3}` {
		t.Fatalf("after enqueueing positions 0..3 again: %+v", got)
	}
	// Another parent: other identities.
	if outbox.MessageID(parent, 0) == outbox.MessageID(dedup.Key{Scope: "payments", ID: "4200000002"}, 0) ||
		outbox.MessageID(parent, 0) == outbox.MessageID(parent, 1) || len(outbox.MessageID(parent, 0)) != 32 {
		t.Error("MessageID does not tell parents and positions apart")
	}
}

// TestMessageIDIsStable pins the derivation: changing it would make every
// message in flight during an upgrade look new downstream. The value is
// printf 'idem-outbox\x1fpayments\x1f4200000001\x1f0' | sha256sum, cut to
// 32 digits.
func TestMessageIDIsStable(t *testing.T) {
	if got, want := outbox.MessageID(dedup.Key{Scope: "payments", ID: "4200000001"}, 0), "dd612ff453e2d1f72a31f0fccfdd3290"; got != want {
		t.Fatalf("MessageID = %s, want %s", got, want)
	}
}

func TestEnqueueRefusesBadMessages(t *testing.T) {
	ob, pool, _ := relaytest.NewOutbox(t)
	ctx := testenv.Context(t, time.Minute)
	parent := dedup.Key{Scope: "payments", ID: "1"}
	for _, c := range []struct {
		name   string
		parent dedup.Key
		m      outbox.Message
		says   string
	}{
		{"no topic", parent, outbox.Message{}, "want 1 to 249 bytes"},
		{"long topic", parent, outbox.Message{Topic: strings.Repeat("t", 250)}, "want 1 to 249 bytes"},
		{"topic with a space", parent, outbox.Message{Topic: "order paid"}, "neither a letter"},
		{"reserved header", parent, outbox.Message{Topic: "t", Headers: []consumer.Header{{Key: outbox.HeaderID, Value: []byte("x")}}}, "are the relay's"},
		{"empty header name", parent, outbox.Message{Topic: "t", Headers: []consumer.Header{{Value: []byte("x")}}}, "no name"},
		{"control character in a header name", parent, outbox.Message{Topic: "t", Headers: []consumer.Header{{Key: "a\nb"}}}, "control characters"},
		{"bad parent", dedup.Key{Scope: "payments"}, outbox.Message{Topic: "t"}, "id is empty"},
	} {
		err := inTx(t, pool, func(tx pgx.Tx) error { return ob.EnqueueFor(ctx, tx, c.parent, c.m) })
		if !consumer.IsPermanent(err) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s: %v, want a permanent error saying %q", c.name, err, c.says)
		}
	}
	err := inTx(t, pool, func(tx pgx.Tx) error {
		return ob.Enqueue(ctx, tx, consumertest.Message("payments", 0, 0, "", "{}"), msg("t", "", ""))
	})
	if !consumer.IsPermanent(err) || !strings.Contains(err.Error(), "no dedup key") {
		t.Errorf("Enqueue from a message no consumer keyed: %v", err)
	}
}

// TestEnqueueInAConsumer: the handler of a consumer delivered every
// callback several times, with lost acks, enqueues one event per payment;
// the outbox holds exactly one per payment, identified by the callback's
// dedup key.
func TestEnqueueInAConsumer(t *testing.T) {
	ob, pool, store := outboxAndStore(t)
	res := runWithCrashes(t, consumer.Config[pgx.Tx]{
		Name: "payments", Store: store, Key: consumer.ByJSONField("txn_id"), Logger: quiet, BatchSize: 16,
		Handler: consumer.HandlerFunc[pgx.Tx](func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			txn, _ := consumer.ByJSONField("txn_id")(m)
			return ob.Enqueue(ctx, tx, m, msg("order.paid", txn, `{"txn_id":"`+txn+`"}`))
		}),
	}, payments(200, 4))
	got := rows(t, pool, ob.Table())
	if len(got) != 200 {
		t.Fatalf("%d outbox rows for 200 payments (%v)", len(got), res)
	}
	for _, r := range got {
		if r.ID != outbox.MessageID(dedup.Key{Scope: "payments", ID: string(r.MsgKey)}, 0) {
			t.Fatalf("row %+v: its ID is not MessageID(payments/%s, 0)", r, r.MsgKey)
		}
	}
}

// TestEnqueueAllInABatchHandler: a BatchHandler enqueues two events per
// payment for the whole batch in one call (the second Outgoing of a
// message numbered after its first); the outbox holds exactly two per
// payment, positions 0 and 1, however often the payments were delivered.
func TestEnqueueAllInABatchHandler(t *testing.T) {
	ob, pool, store := outboxAndStore(t)
	res := runWithCrashes(t, consumer.Config[pgx.Tx]{
		Name: "payments", Store: store, Key: consumer.ByJSONField("txn_id"), Logger: quiet, BatchSize: 32,
		BatchHandler: consumer.BatchHandlerFunc[pgx.Tx](func(ctx context.Context, tx pgx.Tx, ms []*consumer.Message) error {
			var out []outbox.Outgoing
			for _, m := range ms {
				out = append(out, outbox.Outgoing{From: m, Messages: []outbox.Message{msg("order.paid", "", "paid")}})
			}
			for _, m := range ms {
				out = append(out, outbox.Outgoing{From: m, Messages: []outbox.Message{msg("order.receipt", "", "receipt")}})
			}
			return ob.EnqueueAll(ctx, tx, out)
		}),
	}, payments(150, 3))
	got := rows(t, pool, ob.Table())
	if len(got) != 300 {
		t.Fatalf("%d outbox rows for 150 payments, want 300 (%v)", len(got), res)
	}
	for _, r := range got {
		want := map[string]int{"order.paid": 0, "order.receipt": 1}[r.Topic]
		if r.Position != want || r.ID != outbox.MessageID(dedup.Key{Scope: r.Scope, ID: r.Key}, want) {
			t.Fatalf("row %+v: want position %d", r, want)
		}
	}
	err := inTx(t, pool, func(tx pgx.Tx) error {
		return ob.EnqueueAll(context.Background(), tx, []outbox.Outgoing{{From: consumertest.Message("p", 0, 0, "", "{}"), Messages: []outbox.Message{msg("t", "", "")}}})
	})
	if !consumer.IsPermanent(err) {
		t.Fatalf("EnqueueAll from a message no consumer keyed: %v", err)
	}
}
