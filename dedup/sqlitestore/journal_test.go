package sqlitestore_test

import (
	"testing"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/deduptest"
	"github.com/idemkit/idem/dedup/sqlitestore"
	"github.com/idemkit/idem/internal/testenv/sqlitetest"
)

func TestJournalConformance(t *testing.T) {
	deduptest.RunJournal(t, func(t *testing.T, cfg deduptest.Config) dedup.Journal {
		st, _ := sqlitetest.Store(t, sqlitestore.Config{LockTimeout: cfg.LockTimeout, ScopeRetention: cfg.ScopeRetention})
		return st
	})
}
