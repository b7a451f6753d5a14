package pgstore_test

import (
	"context"
	"fmt"
	"runtime"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/pgstore"
	"github.com/idemkit/idem/internal/testenv"
)

// BenchmarkClaim measures the claim path against the real Postgres of the
// test environment: one transaction claiming batch new keys, committed.
// ns/msg includes the database round trips and COMMIT; allocs/msg counts the
// client's allocations (pgx encoding included).
func BenchmarkClaim(b *testing.B) {
	for _, batch := range []int{1, 100} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			pool := testenv.Pool(b)
			schema := testenv.Schema(b, pool)
			st, err := pgstore.New(pool, pgstore.Config{Schema: schema})
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			if err := st.Migrate(ctx); err != nil {
				b.Fatal(err)
			}
			claims := make([]dedup.Claim, batch)
			results := make([]dedup.Result, batch)
			fp := dedup.FingerprintOf([]byte(`{"txn_id":"x","amount":1}`))
			ids := make([]string, b.N*batch)
			for i := range ids {
				ids[i] = fmt.Sprintf("txn-%09d", i)
			}
			var ms0, ms1 runtime.MemStats
			runtime.ReadMemStats(&ms0)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				for j := range claims {
					claims[j] = dedup.Claim{Key: dedup.Key{Scope: "bench", ID: ids[i*batch+j]}, Fingerprint: fp, Source: "bench"}
				}
				err := st.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
					return st.Claim(ctx, tx, claims, results)
				})
				if err != nil {
					b.Fatal(err)
				}
				if results[0].Status != dedup.StatusNew {
					b.Fatalf("status %v", results[0].Status)
				}
			}
			b.StopTimer()
			runtime.ReadMemStats(&ms1)
			msgs := float64(b.N * batch)
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/msgs, "ns/msg")
			b.ReportMetric(float64(ms1.Mallocs-ms0.Mallocs)/msgs, "allocs/msg")
		})
	}
}
