package channels_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/examples/channels"
	"github.com/idemkit/idem/examples/payments"
	"github.com/idemkit/idem/internal/testenv"
)

const testdata = "../../testdata/channels"

type channel interface {
	Name() string
	Verify([]byte) error
	Decode([]byte) (channels.Event, error)
}

func channelsOf(k channels.Keys) []channel {
	return []channel{channels.Alipay{Secret: k.Alipay}, channels.WeChatPay{Secret: k.WeChatPay, Serial: k.WeChatPaySerial}, channels.Stripe{Secret: k.Stripe}}
}

func load(t *testing.T, name string) channels.Fixture {
	t.Helper()
	f, err := channels.Load(testdata, name)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// database sets a per-test schema up with the channels' tables and f's orders.
func database(t *testing.T, f channels.Fixture) (*pgxpool.Pool, string) {
	t.Helper()
	pool, schema := testenv.SchemaPool(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := channels.Setup(ctx, payments.Pgx(pool)); err != nil {
		t.Fatal(err)
	}
	if err := channels.CreateOrders(ctx, payments.Pgx(pool), f.Orders); err != nil {
		t.Fatal(err)
	}
	return pool, schema
}

// TestApplyReplaysTheOracle applies, in stream order, the first delivery of
// every event the stream expects handled — no consumer, no dedup — and
// checks Apply's SQL against the generator's oracle: the same errors for the
// dead-lettered ones, the same end state.
func TestApplyReplaysTheOracle(t *testing.T) {
	for _, ch := range channelsOf(channels.TestKeys()) {
		t.Run(ch.Name(), func(t *testing.T) {
			t.Parallel()
			f := load(t, ch.Name())
			pool, _ := database(t, f)
			ctx := context.Background()
			ran := 0
			for _, d := range f.Stream {
				handled := d.Expect == channels.Applied || d.Expect == channels.Recorded ||
					d.Reason == channels.WrongAmount || d.Reason == channels.WrongCurrency
				if !handled {
					continue
				}
				ran++
				ev, err := ch.Decode([]byte(d.Value))
				if err != nil {
					t.Fatal(err)
				}
				err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					return channels.Apply(ctx, payments.Pgx(tx), ev, d.Event, "line")
				})
				switch {
				case d.Expect == channels.DeadLettered && (!errors.Is(err, d.Reason.Err()) || !consumer.IsRejected(err)):
					t.Errorf("line %d: %v, want %v rejected", d.Line, err, d.Reason.Err())
				case d.Expect != channels.DeadLettered && err != nil:
					t.Errorf("line %d: %v", d.Line, err)
				}
			}
			r, err := channels.Reconcile(ctx, payments.Pgx(pool), "", "", "", f.Expected)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%d events replayed: %v", ran, r)
			if !r.OK() {
				t.Fatal(r)
			}
		})
	}
}

// TestReconcileCatchesEachCorruption: every check of Reconcile can fail.
func TestReconcileCatchesEachCorruption(t *testing.T) {
	f := load(t, "alipay")
	var paid, refunded channels.OrderState
	for _, o := range f.Expected.Orders {
		switch {
		case o.Status == "PAID" && paid.ID == "":
			paid = o
		case o.Status == "REFUNDED" && refunded.ID == "":
			refunded = o
		}
	}
	cases := []struct {
		name, sql string
		args      []any
	}{
		{"an order moved back", `UPDATE orders SET status = 'PAID' WHERE id = $1`, []any{refunded.ID}},
		{"a transition recorded twice", `INSERT INTO channel_events (channel, event_key, order_id, trade, status, kind, from_status, to_status, effect, source)
    VALUES ('alipay', 'x/TRADE_SUCCESS', $1, 'x', 'TRADE_SUCCESS', 'pay', 'UNPAID', 'PAID', 'applied', 'test')`, []any{paid.ID}},
		{"a double credit", `UPDATE accounts SET balance = balance + 1 WHERE id = (SELECT account_id FROM orders WHERE id = $1)`, []any{paid.ID}},
		{"a payment without its ledger row", `DELETE FROM ledger WHERE txn_id = $1`, []any{paid.PaidTxn}},
		{"a refund without its ledger row", `DELETE FROM ledger WHERE txn_id = $1 || '/refund'`, []any{refunded.PaidTxn}},
		{"a unit sold twice", `UPDATE inventory SET sold = sold + 1 WHERE sku = (SELECT sku FROM orders WHERE id = $1)`, []any{paid.ID}},
		{"a stranger's order", `INSERT INTO orders (id, account_id, sku, amount) SELECT 'stranger', account_id, sku, 1 FROM orders WHERE id = $1`, []any{paid.ID}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			pool, _ := database(t, f)
			ctx := context.Background()
			for _, d := range f.Stream {
				if d.Expect != channels.Applied && d.Expect != channels.Recorded {
					continue
				}
				ev, err := channels.Alipay{Secret: channels.TestKeys().Alipay}.Decode([]byte(d.Value))
				if err != nil {
					t.Fatal(err)
				}
				if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					return channels.Apply(ctx, payments.Pgx(tx), ev, d.Event, "line")
				}); err != nil {
					t.Fatal(err)
				}
			}
			if r, err := channels.Reconcile(ctx, payments.Pgx(pool), "", "", "", f.Expected); err != nil || !r.OK() {
				t.Fatalf("before the corruption: %v, %v", r, err)
			}
			if _, err := pool.Exec(ctx, c.sql, c.args...); err != nil {
				t.Fatal(err)
			}
			r, err := channels.Reconcile(ctx, payments.Pgx(pool), "", "", "", f.Expected)
			if err != nil {
				t.Fatal(err)
			}
			if r.OK() {
				t.Fatalf("%s went unnoticed", c.name)
			}
			t.Log(r)
		})
	}
}
