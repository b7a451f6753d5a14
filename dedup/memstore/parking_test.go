package memstore_test

import (
	"testing"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/deduptest"
	"github.com/idemkit/idem/dedup/memstore"
)

func TestParkingConformance(t *testing.T) {
	deduptest.RunParking(t, func(t *testing.T, cfg deduptest.Config) dedup.Parking {
		return memstore.New(memstore.Config{LockTimeout: cfg.LockTimeout})
	})
}
