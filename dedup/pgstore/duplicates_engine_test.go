package pgstore_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/dedup/pgstore"
)

// The consumer's Config.OnDuplicate against real Postgres.

// TestOnDuplicatePanicIsRecovered (issue 25, item 8e): a hook that panics
// on every duplicate took the lane — and the process — down with it. The
// panic is recovered and logged; every payment is applied once, every
// duplicate skipped and acknowledged.
func TestOnDuplicatePanicIsRecovered(t *testing.T) {
	pool, _, st, table := effectsRig(t, pgstore.Config{})
	var mu sync.Mutex
	calls := 0
	res := consumertest.Run(t, consumer.Config[pgx.Tx]{
		Name: "payments", Store: st, Key: consumer.ByJSONField("txn_id"), Handler: insertEffect(table), Logger: quiet,
		OnDuplicate: func(context.Context, consumer.Duplicate) {
			mu.Lock()
			calls++
			mu.Unlock()
			panic("a metrics hook with a bug")
		},
	}, consumertest.Script{MinDeliveries: 2, MaxDeliveries: 2}, paymentMsgs("payments", 1, 10, 0)...)
	if rows, distinct := countEffects(t, pool, table); rows != 10 || distinct != 10 {
		t.Fatalf("effects %d (distinct %d), want 10", rows, distinct)
	}
	mu.Lock()
	defer mu.Unlock()
	if res.Stats.Duplicates != 10 || calls != 10 || res.Source.Acked != 10 || len(res.DeadLetters) != 0 {
		t.Fatalf("%v, %d hook calls; want 10 duplicates skipped, each told to the hook and acknowledged", res, calls)
	}
}

// aheadClock is the system clock two days ahead, sleeping without waiting.
type aheadClock struct{}

func (aheadClock) Now() time.Time                                   { return time.Now().Add(48 * time.Hour) }
func (aheadClock) Sleep(ctx context.Context, _ time.Duration) error { return ctx.Err() }

// TestDuplicateAgeByTheConsumersClock (issue 25, item 8f): a duplicate's
// age was taken from the system clock (time.Since) whatever Config.Clock
// said. With a clock two days ahead of the store's, duplicates are two
// days old, in OnDuplicate and in Stats.DuplicateAge.
func TestDuplicateAgeByTheConsumersClock(t *testing.T) {
	_, _, st, table := effectsRig(t, pgstore.Config{})
	var mu sync.Mutex
	var ages []time.Duration
	res := consumertest.Run(t, consumer.Config[pgx.Tx]{
		Name: "payments", Store: st, Key: consumer.ByJSONField("txn_id"), Handler: insertEffect(table), Logger: quiet,
		Clock: aheadClock{},
		OnDuplicate: func(_ context.Context, d consumer.Duplicate) {
			mu.Lock()
			defer mu.Unlock()
			ages = append(ages, d.Age)
		},
	}, consumertest.Script{MinDeliveries: 2, MaxDeliveries: 2}, paymentMsgs("payments", 1, 5, 0)...)
	mu.Lock()
	defer mu.Unlock()
	if len(ages) != 5 {
		t.Fatalf("%d duplicates told, want 5 (%v)", len(ages), res)
	}
	for _, a := range ages {
		if a < 47*time.Hour || a > 49*time.Hour {
			t.Fatalf("duplicate ages %v, want about 48h by Config.Clock", ages)
		}
	}
	if h := res.Stats.DuplicateAge; h.Max < 47*time.Hour || h.Quantile(1) != 7*24*time.Hour {
		t.Fatalf("Stats.DuplicateAge %+v, want every age in the 1d–7d bucket", h)
	}
}
