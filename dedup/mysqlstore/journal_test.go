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

func TestJournalConformance(t *testing.T) {
	deduptest.RunJournal(t, func(t *testing.T, cfg deduptest.Config) dedup.Journal {
		st, _ := newStore(t, mysqlstore.Config{LockTimeout: cfg.LockTimeout, ScopeRetention: cfg.ScopeRetention})
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
