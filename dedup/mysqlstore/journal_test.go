package mysqlstore_test

import (
	"testing"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/deduptest"
	"github.com/idemkit/idem/dedup/mysqlstore"
)

func TestJournalConformance(t *testing.T) {
	deduptest.RunJournal(t, func(t *testing.T, cfg deduptest.Config) dedup.Journal {
		st, _ := newStore(t, mysqlstore.Config{LockTimeout: cfg.LockTimeout, ScopeRetention: cfg.ScopeRetention})
		return st
	})
}
