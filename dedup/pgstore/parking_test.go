package pgstore_test

import (
	"testing"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/deduptest"
	"github.com/idemkit/idem/dedup/pgstore"
	"github.com/idemkit/idem/internal/testenv"
)

func TestParkingConformance(t *testing.T) {
	deduptest.RunParking(t, func(t *testing.T, cfg deduptest.Config) dedup.Parking {
		return newStore(t, pgstore.Config{LockTimeout: cfg.LockTimeout})
	})
}

// TestDistributedParkingConformance: the parking tables and statements
// keep to what distributed mode allows (no lock_timeout, SERIALIZABLE).
func TestDistributedParkingConformance(t *testing.T) {
	deduptest.RunParking(t, func(t *testing.T, cfg deduptest.Config) dedup.Parking {
		return distributedStore(t, testenv.NewDistributed(t), pgstore.Config{LockTimeout: cfg.LockTimeout})
	})
}
