package ledger_test

import (
	"context"
	"database/sql"
	"errors"
	"io"
	"log/slog"
	"testing"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/mysqlstore"
	"github.com/idemkit/idem/dedup/sqlitestore"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/internal/testenv/ledger"
	"github.com/idemkit/idem/internal/testenv/sqlitetest"
)

// TestStreamReconciles runs the workload with duplicates and crashes after
// commit on SQLite and on MySQL: every credit booked once, the bad and
// conflicting messages dead-lettered; then a credit outside idem makes
// Reconcile report a double effect.
func TestStreamReconciles(t *testing.T) {
	t.Run("sqlite", func(t *testing.T) {
		st, db := sqlitetest.Store(t, sqlitestore.Config{})
		check(t, db, st, `"idem_dedup"`)
	})
	t.Run("mysql", func(t *testing.T) {
		db, err := mysqlstore.Open(testenv.MySQLDatabase(t, testenv.MySQLDSN(t)), mysqlstore.Config{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		st, err := mysqlstore.New(db, mysqlstore.Config{})
		if err != nil {
			t.Fatal(err)
		}
		check(t, db, st, st.Table())
	})
}

type store interface {
	dedup.Store[*sql.Tx]
	Migrate(context.Context) error
}

func check(t *testing.T, db *sql.DB, st store, table string) {
	ctx := context.Background()
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	s := ledger.Generate(400, 3)
	if err := ledger.Setup(ctx, db, s.Accounts); err != nil {
		t.Fatal(err)
	}
	res := consumertest.Run(t, consumer.Config[*sql.Tx]{
		Name: "ledger", Store: st, Handler: ledger.Handler(), Key: consumer.ByJSONField(ledger.KeyField),
		MaxPayloadBytes: ledger.MaxPayload, BatchSize: 20, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}, consumertest.Script{MinDeliveries: 1, MaxDeliveries: 3, CrashAfterCommitEvery: 4, Seed: 5}, ledger.Messages("ledger", s.Payloads)...)
	r, err := ledger.Reconcile(ctx, db, table, "ledger", s.Expected)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(res, r)
	if !r.OK() || r.Entries != 400 || res.Stats.Applied != 400 || res.Stats.Duplicates == 0 {
		t.Fatalf("%v: %d entries, stats %+v; want 400 applied and duplicates", r, r.Entries, res.Stats)
	}
	dead := map[string]bool{}
	badCredit := false
	for _, l := range res.DeadLetters {
		dead[l.Message.ID] = true
		badCredit = badCredit || errors.Is(l.Reason, ledger.ErrBadCredit)
	}
	if want := s.Bad + s.Conflicting; len(dead) != want || !badCredit {
		t.Fatalf("%d messages dead-lettered (one for a bad credit: %v), want %d (bad %d, conflicting %d)", len(dead), badCredit, want, s.Bad, s.Conflicting)
	}

	if _, err := db.ExecContext(ctx, `UPDATE accounts SET balance = balance + 1 WHERE id = ?`, s.Accounts[0]); err != nil {
		t.Fatal(err)
	}
	if r, err := ledger.Reconcile(ctx, db, table, "ledger", s.Expected); err != nil || r.OK() || r.DoubleApplied != 1 {
		t.Fatalf("after a credit outside idem: %v, %v; want one account that disagrees", r, err)
	}
}
