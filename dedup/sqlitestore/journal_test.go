package sqlitestore_test

import (
	"database/sql"
	"testing"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/deduptest"
	"github.com/idemkit/idem/dedup/sqlitestore"
	"github.com/idemkit/idem/internal/testenv/sqlitetest"
)

func TestWatermarksConformance(t *testing.T) {
	deduptest.RunWatermarks(t, func(t *testing.T, cfg deduptest.Config) deduptest.WatermarkStore[*sql.Tx] {
		st, _ := sqlitetest.Store(t, sqlitestore.Config{LockTimeout: cfg.LockTimeout, ScopeRetention: cfg.ScopeRetention})
		return st
	})
}

func TestJournalConformance(t *testing.T) {
	deduptest.RunJournal(t, func(t *testing.T, cfg deduptest.Config) dedup.Journal {
		st, _ := sqlitetest.Store(t, sqlitestore.Config{LockTimeout: cfg.LockTimeout, ScopeRetention: cfg.ScopeRetention})
		return st
	})
}

func TestTxStepsConformance(t *testing.T) {
	deduptest.RunTxSteps(t, func(t *testing.T, cfg deduptest.Config) deduptest.TxStepsStore[*sql.Tx] {
		st, _ := sqlitetest.Store(t, sqlitestore.Config{LockTimeout: cfg.LockTimeout, ScopeRetention: cfg.ScopeRetention})
		return st
	})
}
