package mysqlstore_test

import (
	"database/sql"
	"testing"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/deduptest"
	"github.com/idemkit/idem/dedup/mysqlstore"
)

func TestParkingConformance(t *testing.T) {
	deduptest.RunParking(t, func(t *testing.T, cfg deduptest.Config) dedup.Parking {
		st, _ := newStore(t, mysqlstore.Config{LockTimeout: cfg.LockTimeout})
		return st
	})
}

// TestParkingConformanceRepeatableRead: under REPEATABLE READ the reads
// that decide are locking reads or follow them, so they see what the
// key's last holder committed, and no gap lock is taken on a key not
// parked.
func TestParkingConformanceRepeatableRead(t *testing.T) {
	deduptest.RunParking(t, func(t *testing.T, cfg deduptest.Config) dedup.Parking {
		st, _ := newStore(t, mysqlstore.Config{LockTimeout: cfg.LockTimeout, Isolation: sql.LevelRepeatableRead})
		return st
	})
}
