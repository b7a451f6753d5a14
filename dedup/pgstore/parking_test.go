package pgstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

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

// TestParkingWaitIsBounded: a key's row another transaction holds makes
// CheckParked, Park and Unpark of the key wait at most LockTimeout, then
// fail with dedup.ErrInFlight, which the consumer retries; once the
// holder is gone they go through.
func TestParkingWaitIsBounded(t *testing.T) {
	pool := testenv.Pool(t)
	schema := testenv.Schema(t, pool)
	st := newStore(t, pgstore.Config{Schema: schema, LockTimeout: 200 * time.Millisecond})
	ctx := testenv.Context(t, time.Minute)
	now := time.Now()
	h := deduptest.Ref("orders", "payments", "cust-1", "p/0/1")
	f := deduptest.Ref("orders", "payments", "cust-1", "p/0/2")
	if err := st.Park(ctx, h, time.Second, now); err != nil {
		t.Fatal(err)
	}
	holder, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(context.Background())
	if _, err := holder.Exec(ctx, "SELECT 1 FROM "+pgx.Identifier{schema, "idem_dedup_parked_keys"}.Sanitize()+" FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	callCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for name, call := range map[string]func() error{
		"CheckParked": func() error {
			return st.CheckParked(callCtx, []dedup.ParkRef{f}, dedup.ParkLimits{}, now, make([]dedup.ParkDecision, 1))
		},
		"Park":   func() error { return st.Park(callCtx, f, time.Second, now) },
		"Unpark": func() error { return st.Unpark(callCtx, h, now) },
	} {
		if err := call(); !errors.Is(err, dedup.ErrInFlight) {
			t.Errorf("%s of a key whose row another transaction holds: %v, want ErrInFlight after the 200ms lock timeout", name, err)
		}
	}
	if err := holder.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	out := make([]dedup.ParkDecision, 1)
	if err := st.CheckParked(ctx, []dedup.ParkRef{f}, dedup.ParkLimits{}, now, out); err != nil || out[0].Action != dedup.ParkFollow {
		t.Fatalf("CheckParked once the holder is gone: %v, %v; want follow", out[0].Action, err)
	}
}
