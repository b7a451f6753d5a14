package pgstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/internal/testenv/pgtest"
)

// BenchmarkCheckParked measures CheckParked of a batch of 100 messages of
// distinct keys, with 1,000 other keys parked: none of the batch's keys
// parked (the common case, one statement), or one of them (a transaction
// that locks the batch's keys and adds a follower).
func BenchmarkCheckParked(b *testing.B) {
	for _, parked := range []int{0, 1} {
		b.Run(fmt.Sprintf("batch=100/parked=%d", parked), func(b *testing.B) { benchCheckParked(b, parked) })
	}
}

func benchCheckParked(b *testing.B, parked int) {
	pool := testenv.Pool(b)
	st := pgtest.Store(b, pool, testenv.Schema(b, pool))
	ctx, now := context.Background(), time.Now()
	for i := range 1000 {
		if err := st.Park(ctx, dedup.ParkRef{ParkKey: dedup.ParkKey{Scope: "bench", Topic: "payments", Key: fmt.Sprint("other-", i)}, ID: "p0/1"}, time.Second, now); err != nil {
			b.Fatal(err)
		}
	}
	refs := make([]dedup.ParkRef, 100)
	out := make([]dedup.ParkDecision, len(refs))
	for i := range refs {
		refs[i] = dedup.ParkRef{ParkKey: dedup.ParkKey{Scope: "bench", Topic: "payments", Key: fmt.Sprint("cust-", i)}, ID: fmt.Sprint("p0/", 100+i)}
	}
	for i := range parked {
		if err := st.Park(ctx, dedup.ParkRef{ParkKey: refs[i].ParkKey, ID: "p0/1"}, time.Second, now); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for b.Loop() {
		if err := st.CheckParked(ctx, refs, dedup.ParkLimits{}, now, out); err != nil {
			b.Fatal(err)
		}
	}
}
