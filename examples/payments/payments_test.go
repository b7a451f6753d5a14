package payments_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/mysqlstore"
	"github.com/idemkit/idem/dedup/sqlitestore"
	"github.com/idemkit/idem/examples/payments"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/internal/testenv/pgtest"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// backend is one database the example runs on.
type backend struct {
	db        payments.DB
	dedup     string // dedup table as SQL names it
	drive     func(t *testing.T, script consumertest.Script, msgs []*consumer.Message) consumertest.Result
	rawCredit func(t *testing.T, account string, amount int64) // an effect outside idem
}

// exec runs a statement outside idem, to corrupt the tables on purpose.
func (b backend) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	if _, err := b.db.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func config[TTx any](st dedup.Store[TTx], h consumer.Handler[TTx]) consumer.Config[TTx] {
	return consumer.Config[TTx]{
		Name: "payments", Store: st, Handler: h, Key: consumer.ByJSONField(payments.KeyField),
		MaxPayloadBytes: payments.MaxPayload, BatchSize: 20, Logger: quiet,
	}
}

func sqliteBackend(t *testing.T) backend {
	db, err := sqlitestore.Open(filepath.Join(t.TempDir(), "payments.db"), sqlitestore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	st, err := sqlitestore.New(db, sqlitestore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	h := payments.Handler(func(tx *sql.Tx) payments.DB { return payments.SQL(tx) })
	return backend{
		db:    payments.SQL(db),
		dedup: `"idem_dedup"`,
		drive: func(t *testing.T, script consumertest.Script, msgs []*consumer.Message) consumertest.Result {
			return consumertest.Run(t, config(st, h), script, msgs...)
		},
		rawCredit: func(t *testing.T, account string, amount int64) {
			if _, err := db.Exec(`UPDATE accounts SET balance = balance + $1 WHERE id = $2`, amount, account); err != nil {
				t.Fatal(err)
			}
		},
	}
}

func postgresBackend(t *testing.T) backend {
	pool, schema := testenv.SchemaPool(t)
	st := pgtest.Store(t, pool, schema)
	h := payments.Handler(func(tx pgx.Tx) payments.DB { return payments.Pgx(tx) })
	return backend{
		db:    payments.Pgx(pool),
		dedup: st.Table(),
		drive: func(t *testing.T, script consumertest.Script, msgs []*consumer.Message) consumertest.Result {
			return consumertest.Run(t, config(st, h), script, msgs...)
		},
		rawCredit: func(t *testing.T, account string, amount int64) {
			if _, err := pool.Exec(context.Background(), `UPDATE accounts SET balance = balance + $1 WHERE id = $2`, amount, account); err != nil {
				t.Fatal(err)
			}
		},
	}
}

func mysqlBackend(t *testing.T) backend {
	dsn := testenv.MySQLDatabase(t, testenv.MySQLDSN(t))
	cfg := mysqlstore.Config{}
	db, err := mysqlstore.Open(dsn, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	st, err := mysqlstore.New(db, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	h := payments.Handler(func(tx *sql.Tx) payments.DB { return payments.MySQL(tx) })
	return backend{
		db:    payments.MySQL(db),
		dedup: st.Table(),
		drive: func(t *testing.T, script consumertest.Script, msgs []*consumer.Message) consumertest.Result {
			return consumertest.Run(t, config(st, h), script, msgs...)
		},
		rawCredit: func(t *testing.T, account string, amount int64) {
			if _, err := db.Exec(`UPDATE accounts SET balance = balance + ? WHERE id = ?`, amount, account); err != nil {
				t.Fatal(err)
			}
		},
	}
}

func eachBackend(t *testing.T, f func(t *testing.T, b backend)) {
	t.Run("sqlite", func(t *testing.T) { f(t, sqliteBackend(t)) })
	t.Run("postgres", func(t *testing.T) { f(t, postgresBackend(t)) })
	t.Run("mysql", func(t *testing.T) { f(t, mysqlBackend(t)) })
}

// messages puts payloads on four partitions by order, as a producer keyed
// by order ID would (payments.PartitionKey): the callbacks of one order stay
// in order.
func messages(payloads [][]byte) []*consumer.Message {
	var msgs []*consumer.Message
	offsets := map[int32]int64{}
	for _, p := range payloads {
		key := payments.PartitionKey(p)
		part := int32(0)
		for _, c := range key {
			part = (part*31 + c) % 4
		}
		msgs = append(msgs, consumertest.Message("payments", part, offsets[part], key, string(p)))
		offsets[part]++
	}
	return msgs
}

// distinctMessages counts dead letters by message: a crash between the
// dead-letter write and the ack writes a letter twice (at-least-once).
func distinctMessages(ls []consumer.Letter) int {
	seen := map[string]bool{}
	for _, l := range ls {
		seen[l.Message.ID] = true
	}
	return len(seen)
}

func setup(t *testing.T, b backend, orders []payments.Order) {
	ctx := context.Background()
	if err := payments.Setup(ctx, b.db); err != nil {
		t.Fatal(err)
	}
	if err := payments.CreateOrders(ctx, b.db, orders); err != nil {
		t.Fatal(err)
	}
}

func reconcile(t *testing.T, b backend, expected []payments.Expected) payments.Report {
	t.Helper()
	r, err := payments.Reconcile(context.Background(), b.db, b.dedup, "payments", expected)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestStreamWithDuplicatesAndCrashesReconciles(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		s := payments.Generate(400, 3)
		setup(t, b, s.Orders)
		res := b.drive(t, consumertest.Script{MinDeliveries: 1, MaxDeliveries: 3, CrashAfterCommitEvery: 4, Seed: 5}, messages(s.Payloads))
		r := reconcile(t, b, s.Expected)
		t.Log(res, r)
		if !r.OK() || r.Payments != 400 {
			t.Fatalf("%v (payments %d, want 400)", r, r.Payments)
		}
		if res.Stats.Duplicates == 0 || res.Stats.Applied != 400 {
			t.Fatalf("stats %+v", res.Stats)
		}
		if want := s.Bad + s.Conflicting; distinctMessages(res.DeadLetters) != want {
			t.Fatalf("%d messages dead-lettered, want %d (bad %d, conflicting %d)", distinctMessages(res.DeadLetters), want, s.Bad, s.Conflicting)
		}
	})
}

func TestFixtures(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		var orders []payments.Order
		raw, err := os.ReadFile("../../testdata/payments/good/orders.json")
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(raw, &orders); err != nil {
			t.Fatal(err)
		}
		setup(t, b, orders)
		lines, err := os.ReadFile("../../testdata/payments/good/callbacks.jsonl")
		if err != nil {
			t.Fatal(err)
		}
		var payloads [][]byte
		for _, l := range strings.Split(strings.TrimSpace(string(lines)), "\n") {
			payloads = append(payloads, []byte(l))
		}
		bad := []struct {
			file string
			want error
			says string
		}{
			{"invalid_json.json", consumer.ErrBadPayload, "not valid JSON"},
			{"missing_txn_id.json", consumer.ErrNoKey, `"txn_id" not found`},
			{"different_amount.json", dedup.ErrFingerprintMismatch, "another payload"},
			{"oversized.json", consumer.ErrPayloadTooLarge, "the limit is 65536"},
		}
		for _, f := range bad {
			p, err := os.ReadFile("../../testdata/payments/bad/" + f.file)
			if err != nil {
				t.Fatal(err)
			}
			payloads = append(payloads, p)
		}
		// One partition: the fixtures' order is the delivery order.
		var msgs []*consumer.Message
		for i, p := range payloads {
			msgs = append(msgs, consumertest.Message("payments", 0, int64(i), "", string(p)))
		}
		res := b.drive(t, consumertest.Script{}, msgs)
		expected := []payments.Expected{{TxnID: "4200001001", Amount: 2599}, {TxnID: "4200001002", Amount: 1200}, {TxnID: "4200001003", Amount: 2599}}
		r := reconcile(t, b, expected)
		if !r.OK() || r.Credited != 2599+1200+2599 {
			t.Fatalf("%v, credited %d", r, r.Credited)
		}
		if len(res.DeadLetters) != len(bad) {
			t.Fatalf("%d dead letters, want %d: %+v", len(res.DeadLetters), len(bad), res.DeadLetters)
		}
		byOffset := map[int64]consumer.Letter{}
		for _, l := range res.DeadLetters {
			byOffset[l.Message.Offset] = l
		}
		for i, f := range bad {
			l := byOffset[int64(len(payloads)-len(bad)+i)]
			if l.Reason == nil {
				t.Errorf("%s was not dead-lettered", f.file)
				continue
			}
			if !errors.Is(l.Reason, f.want) || !strings.Contains(l.Reason.Error(), f.says) {
				t.Errorf("%s: dead-lettered with %q, want %v saying %q", f.file, l.Reason, f.want, f.says)
			}
		}
		if res.Stats.Duplicates != 3 {
			t.Errorf("duplicates %d, want 3", res.Stats.Duplicates)
		}
	})
}

// TestReconcileCatchesDoubleEffect applies an effect outside idem — a second
// credit — and checks that reconciliation reports it: the check can fail.
func TestReconcileCatchesDoubleEffect(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		s := payments.Generate(20, 9)
		setup(t, b, s.Orders)
		b.drive(t, consumertest.Script{}, messages(s.Payloads))
		if r := reconcile(t, b, s.Expected); !r.OK() {
			t.Fatalf("before the double credit: %v", r)
		}
		b.rawCredit(t, s.Orders[0].Account, s.Orders[0].Amount)
		r := reconcile(t, b, s.Expected)
		if r.OK() || r.DoubleApplied != 1 {
			t.Fatalf("a double credit went unnoticed: %v", r)
		}
		// A lost payment is caught too.
		r, err := payments.Reconcile(context.Background(), b.db, b.dedup, "payments",
			append(s.Expected, payments.Expected{TxnID: "never-sent", Amount: 1}))
		if err != nil {
			t.Fatal(err)
		}
		if r.Lost != 1 {
			t.Fatalf("a lost payment went unnoticed: %v", r)
		}
	})
}

func TestDecode(t *testing.T) {
	for _, p := range []string{`{}`, `{"txn_id":"t","order_id":"o","amount":0,"status":"SUCCESS"}`, `{"txn_id":"t","order_id":"o","amount":5,"status":"CLOSED"}`, `[`} {
		if _, err := payments.Decode([]byte(p)); !errors.Is(err, payments.ErrBadCallback) {
			t.Errorf("Decode(%s): %v", p, err)
		}
	}
}

// TestReconcileCatchesEachCorruption breaks the tables one way at a time and
// checks that the matching check fires: every check can fail.
func TestReconcileCatchesEachCorruption(t *testing.T) {
	cases := []struct {
		name    string
		corrupt func(t *testing.T, b backend, s payments.Stream)
		counter func(r payments.Report) int64
	}{
		{"ledger row without dedup row", func(t *testing.T, b backend, s payments.Stream) {
			b.exec(t, `DELETE FROM `+b.dedup+` WHERE `+b.dedup+`.key = $1`, s.Expected[0].TxnID)
		}, func(r payments.Report) int64 { return r.LedgerNoDedup }},
		{"dedup row without ledger row", func(t *testing.T, b backend, s payments.Stream) {
			b.exec(t, `DELETE FROM ledger WHERE txn_id = $1`, s.Expected[1].TxnID)
		}, func(r payments.Report) int64 { return r.DedupNoLedger }},
		{"paid order without ledger row", func(t *testing.T, b backend, s payments.Stream) {
			b.exec(t, `DELETE FROM ledger WHERE txn_id = $1`, s.Expected[2].TxnID)
		}, func(r payments.Report) int64 { return r.PaidNoLedger }},
		{"ledger row of an unpaid order", func(t *testing.T, b backend, s payments.Stream) {
			b.exec(t, `UPDATE orders SET status = 'UNPAID', paid_txn = NULL WHERE paid_txn = $1`, s.Expected[3].TxnID)
		}, func(r payments.Report) int64 { return r.LedgerNotPaid }},
		{"unexpected ledger row", func(t *testing.T, b backend, s payments.Stream) {
			o := s.Orders[0]
			b.exec(t, `INSERT INTO ledger (txn_id, order_id, account_id, amount, channel) VALUES ('forged', $1, $2, 1, 'card')`, o.ID, o.Account)
		}, func(r payments.Report) int64 { return r.Unexpected }},
		{"sales disagree with paid orders", func(t *testing.T, b backend, s payments.Stream) {
			b.exec(t, `UPDATE inventory SET sold = sold + 1 WHERE sku = $1`, s.Orders[0].SKU)
		}, func(r payments.Report) int64 { return r.DoubleApplied }},
	}
	eachBackend(t, func(t *testing.T, b backend) {
		s := payments.Generate(20, 11)
		setup(t, b, s.Orders)
		b.drive(t, consumertest.Script{}, messages(s.Payloads))
		if r := reconcile(t, b, s.Expected); !r.OK() {
			t.Fatalf("before corruption: %v", r)
		}
		for _, c := range cases {
			c.corrupt(t, b, s)
			r := reconcile(t, b, s.Expected)
			if r.OK() || c.counter(r) == 0 {
				t.Errorf("%s went unnoticed: %v", c.name, r)
			}
		}
	})
}
