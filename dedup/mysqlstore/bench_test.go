package mysqlstore_test

import (
	"context"
	"database/sql"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/mysqlstore"
)

// BenchmarkClaim measures the claim path against the real MariaDB of the
// test environment, as pgstore's BenchmarkClaim does against Postgres: one
// transaction claiming batch new keys, committed. ns/msg includes the round
// trips and COMMIT; allocs/msg counts the client's allocations.
func BenchmarkClaim(b *testing.B) {
	for _, batch := range []int{1, 100} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			st, _ := newStore(b, mysqlstore.Config{})
			claimLoop(b, st, batch, "new")
		})
	}
}

// claimLoop claims batches of new keys ("new") or of keys claimed before
// ("dup"), one committed transaction each.
func claimLoop(b *testing.B, st *mysqlstore.Store, batch int, kind string) {
	ctx := context.Background()
	claims := make([]dedup.Claim, batch)
	results := make([]dedup.Result, batch)
	fp := dedup.FingerprintOf([]byte(`{"txn_id":"x","amount":1}`))
	n := b.N * batch
	if kind == "dup" {
		n = batch // the same keys, again and again
	}
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("txn-%09d", i)
	}
	want := dedup.StatusNew
	if kind == "dup" {
		want = dedup.StatusDuplicate
		fill(claims, ids, 0, fp)
		if err := st.InTx(ctx, func(ctx context.Context, tx *sql.Tx) error { return st.Claim(ctx, tx, claims, results) }); err != nil {
			b.Fatal(err)
		}
	}
	var ms0, ms1 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if kind == "new" {
			fill(claims, ids, i*batch, fp)
		}
		err := st.InTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
			return st.Claim(ctx, tx, claims, results)
		})
		if err != nil {
			b.Fatal(err)
		}
		if results[0].Status != want {
			b.Fatalf("status %v, want %v", results[0].Status, want)
		}
	}
	b.StopTimer()
	runtime.ReadMemStats(&ms1)
	msgs := float64(b.N * batch)
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/msgs, "ns/msg")
	b.ReportMetric(float64(ms1.Mallocs-ms0.Mallocs)/msgs, "allocs/msg")
}

func fill(claims []dedup.Claim, ids []string, from int, fp dedup.Fingerprint) {
	for j := range claims {
		claims[j] = dedup.Claim{Key: dedup.Key{Scope: "bench", ID: ids[from+j]}, Fingerprint: fp, Source: "bench"}
	}
}

// BenchmarkClaimVariants measures the claim statement chosen, INSERT IGNORE,
// against INSERT … ON DUPLICATE KEY UPDATE: batches of 100 new keys, of 100
// duplicates, and of 100 duplicates claimed by 8 transactions at once (the
// same keys: a replayed stream on several consumers). A duplicate takes a
// shared lock under IGNORE, an exclusive one under the no-op UPDATE.
func BenchmarkClaimVariants(b *testing.B) {
	for _, variant := range []string{"ignore", "upsert"} {
		for _, kind := range []string{"new", "dup"} {
			b.Run(fmt.Sprintf("%s/%s", variant, kind), func(b *testing.B) {
				st, _ := newStore(b, mysqlstore.Config{})
				if variant == "upsert" {
					mysqlstore.UseUpsert(st)
				}
				claimLoop(b, st, 100, kind)
			})
		}
		b.Run(variant+"/dup-concurrent", func(b *testing.B) {
			st, db := newStore(b, mysqlstore.Config{})
			if variant == "upsert" {
				mysqlstore.UseUpsert(st)
			}
			ctx := context.Background()
			fp := dedup.FingerprintOf([]byte(`{}`))
			claims := make([]dedup.Claim, 100)
			for j := range claims {
				claims[j] = dedup.Claim{Key: dedup.Key{Scope: "bench", ID: fmt.Sprintf("txn-%09d", j)}, Fingerprint: fp}
			}
			if err := st.InTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
				return st.Claim(ctx, tx, claims, make([]dedup.Result, 100))
			}); err != nil {
				b.Fatal(err)
			}
			var batches atomic.Int64
			waits0 := rowLockWaits(b, db)
			b.SetParallelism(4) // 8 goroutines on 2 cores
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				results := make([]dedup.Result, 100)
				for pb.Next() {
					err := st.InTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
						return st.Claim(ctx, tx, claims, results)
					})
					if err != nil {
						b.Error(err)
						return
					}
					batches.Add(1)
				}
			})
			b.StopTimer()
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(batches.Load()*100), "ns/msg")
			// The server's count of row lock waits (all sessions): a
			// duplicate waits for another's lock only under the upsert.
			b.ReportMetric(float64(rowLockWaits(b, db)-waits0)/float64(batches.Load()), "lock-waits/batch")
		})
	}
}

func rowLockWaits(b *testing.B, db *sql.DB) int64 {
	var name string
	var n int64
	if err := db.QueryRow(`SHOW GLOBAL STATUS LIKE 'Innodb_row_lock_waits'`).Scan(&name, &n); err != nil {
		b.Fatal(err)
	}
	return n
}
