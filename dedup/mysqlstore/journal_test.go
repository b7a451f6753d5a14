package mysqlstore_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/deduptest"
	"github.com/idemkit/idem/dedup/mysqlstore"
	"github.com/idemkit/idem/internal/testenv"
)

func TestWatermarksConformance(t *testing.T) {
	deduptest.RunWatermarks(t, func(t *testing.T, cfg deduptest.Config) deduptest.WatermarkStore[*sql.Tx] {
		st, _ := newStore(t, mysqlstore.Config{LockTimeout: cfg.LockTimeout, ScopeRetention: cfg.ScopeRetention})
		return st
	})
}

// TestWatermarksConformanceRepeatableRead: under REPEATABLE READ a plain
// read of a watermark would see the snapshot, not what a transaction the
// advance waited for committed; the locking read sees it.
func TestWatermarksConformanceRepeatableRead(t *testing.T) {
	deduptest.RunWatermarks(t, func(t *testing.T, cfg deduptest.Config) deduptest.WatermarkStore[*sql.Tx] {
		st, _ := newStore(t, mysqlstore.Config{LockTimeout: cfg.LockTimeout, ScopeRetention: cfg.ScopeRetention, Isolation: sql.LevelRepeatableRead})
		return st
	})
}

func TestJournalConformance(t *testing.T) {
	deduptest.RunJournal(t, func(t *testing.T, cfg deduptest.Config) dedup.Journal {
		st, _ := newStore(t, mysqlstore.Config{LockTimeout: cfg.LockTimeout, ScopeRetention: cfg.ScopeRetention})
		return st
	})
}

func TestTxStepsConformance(t *testing.T) {
	deduptest.RunTxSteps(t, func(t *testing.T, cfg deduptest.Config) deduptest.TxStepsStore[*sql.Tx] {
		st, _ := newStore(t, mysqlstore.Config{LockTimeout: cfg.LockTimeout, ScopeRetention: cfg.ScopeRetention})
		return st
	})
}

// TestTxStepsConformanceRepeatableRead: the snapshot of a REPEATABLE READ
// transaction sees the steps committed before it.
func TestTxStepsConformanceRepeatableRead(t *testing.T) {
	deduptest.RunTxSteps(t, func(t *testing.T, cfg deduptest.Config) deduptest.TxStepsStore[*sql.Tx] {
		st, _ := newStore(t, mysqlstore.Config{LockTimeout: cfg.LockTimeout, ScopeRetention: cfg.ScopeRetention, Isolation: sql.LevelRepeatableRead})
		return st
	})
}

// TestJournalConformanceRepeatableRead: the journal runs its own READ
// COMMITTED transactions, on a plain pool whose store is configured for
// REPEATABLE READ too (where a locking read of a missing step would take a
// gap lock, and concurrent first callers deadlock).
func TestJournalConformanceRepeatableRead(t *testing.T) {
	deduptest.RunJournal(t, func(t *testing.T, cfg deduptest.Config) dedup.Journal {
		db, err := sql.Open("mysql", testenv.MySQLDatabase(t, testenv.MySQLDSN(t)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		st, err := mysqlstore.New(db, mysqlstore.Config{LockTimeout: cfg.LockTimeout, ScopeRetention: cfg.ScopeRetention, Isolation: sql.LevelRepeatableRead})
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Migrate(context.Background()); err != nil {
			t.Fatal(err)
		}
		return st
	})
}
