package memstore_test

import (
	"testing"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/deduptest"
	"github.com/idemkit/idem/dedup/memstore"
)

func TestJournalConformance(t *testing.T) {
	deduptest.RunJournal(t, func(t *testing.T, cfg deduptest.Config) dedup.Journal {
		return memstore.New(memstore.Config{LockTimeout: cfg.LockTimeout, ScopeRetention: cfg.ScopeRetention})
	})
}

func TestTxStepsConformance(t *testing.T) {
	deduptest.RunTxSteps(t, func(t *testing.T, cfg deduptest.Config) deduptest.TxStepsStore[*memstore.Tx] {
		return memstore.New(memstore.Config{LockTimeout: cfg.LockTimeout, ScopeRetention: cfg.ScopeRetention})
	})
}
