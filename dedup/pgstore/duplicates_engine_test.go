package pgstore_test

import (
	"context"
	"sync"
	"testing"

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
