package sqlitestore_test

import (
	"testing"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/deduptest"
	"github.com/idemkit/idem/dedup/sqlitestore"
	"github.com/idemkit/idem/internal/testenv/sqlitetest"
)

func TestParkingConformance(t *testing.T) {
	deduptest.RunParking(t, func(t *testing.T, cfg deduptest.Config) dedup.Parking {
		st, _ := sqlitetest.Store(t, sqlitestore.Config{LockTimeout: cfg.LockTimeout})
		return st
	})
}
