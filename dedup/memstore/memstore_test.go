package memstore_test

import (
	"testing"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/deduptest"
	"github.com/idemkit/idem/dedup/memstore"
)

func TestConformance(t *testing.T) {
	deduptest.Run(t, func(t *testing.T, cfg deduptest.Config) dedup.Store[*memstore.Tx] {
		return memstore.New(memstore.Config{LockTimeout: cfg.LockTimeout, ScopeRetention: cfg.ScopeRetention})
	})
}

func TestWatermarksConformance(t *testing.T) {
	deduptest.RunWatermarks(t, func(t *testing.T, cfg deduptest.Config) deduptest.WatermarkStore[*memstore.Tx] {
		return memstore.New(memstore.Config{LockTimeout: cfg.LockTimeout, ScopeRetention: cfg.ScopeRetention})
	})
}
