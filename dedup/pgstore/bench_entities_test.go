package pgstore_test

import (
	"context"
	"fmt"
	"runtime"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/internal/testenv/pgtest"
)

// BenchmarkClaimWithWatermarks measures what entity watermarks cost a
// claim: one transaction claiming a batch of new keys, committed, without
// AdvanceEntities (none), and with it for as many distinct entities as
// keys — entities seen for the first time (new: their rows inserted), or
// seen once before, at a lower version (existing: their rows locked and
// updated: a trade's second status). The metrics are BenchmarkClaim's.
func BenchmarkClaimWithWatermarks(b *testing.B) {
	for _, batch := range []int{1, 100} {
		for _, entities := range []string{"none", "new", "existing"} {
			b.Run(fmt.Sprintf("batch=%d/entities=%s", batch, entities), func(b *testing.B) { benchWatermarks(b, batch, entities) })
		}
	}
}

func benchWatermarks(b *testing.B, batch int, entities string) {
	cfg, err := pgxpool.ParseConfig(testenv.PostgresURL(b))
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = 1 // one server process, whose CPU time is read
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	st := pgtest.Store(b, pool, testenv.Schema(b, testenv.Pool(b)))
	ctx := context.Background()
	var backend int
	if err := pool.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&backend); err != nil {
		b.Fatal(err)
	}
	claims := make([]dedup.Claim, batch)
	results := make([]dedup.Result, batch)
	events := make([]dedup.EntityEvent, batch)
	advances := make([]dedup.Advance, batch)
	fp := dedup.FingerprintOf([]byte(`{"txn_id":"x","amount":1}`))
	ids := make([]string, b.N*batch)
	for i := range ids {
		ids[i] = fmt.Sprintf("txn-%09d", i)
	}
	claim := func(i int) error {
		for j := range claims {
			id := ids[i*batch+j]
			claims[j] = dedup.Claim{Key: dedup.Key{Scope: "bench", ID: id}, Fingerprint: fp, Source: "bench"}
			events[j] = dedup.EntityEvent{Key: claims[j].Key, Entity: "trade-" + id, Version: dedup.Version{Major: 2}}
		}
		return st.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
			if err := st.Claim(ctx, tx, claims, results); err != nil {
				return err
			}
			if entities == "none" {
				return nil
			}
			return st.AdvanceEntities(ctx, tx, events, advances)
		})
	}
	if entities == "existing" { // the entities' rows exist, at version 1, before the timer
		for i := 0; i < b.N; i++ {
			for j := range events {
				events[j] = dedup.EntityEvent{Key: dedup.Key{Scope: "bench", ID: "warm"}, Entity: "trade-" + ids[i*batch+j], Version: dedup.Version{Major: 1}}
			}
			if err := st.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
				return st.AdvanceEntities(ctx, tx, events, advances)
			}); err != nil {
				b.Fatal(err)
			}
		}
	}
	var ms0, ms1 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	cpu0 := processCPU(backend)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := claim(i); err != nil {
			b.Fatal(err)
		}
		if results[0].Status != dedup.StatusNew {
			b.Fatalf("status %v, want new", results[0].Status)
		}
		if a := advances[batch-1]; entities != "none" && (a.Stale || a.Had != (entities == "existing")) {
			b.Fatalf("advance %+v, want applied over a watermark: %v", a, entities == "existing")
		}
	}
	b.StopTimer()
	cpu1 := processCPU(backend)
	runtime.ReadMemStats(&ms1)
	msgs := float64(b.N * batch)
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/msgs, "ns/msg")
	b.ReportMetric(float64(ms1.Mallocs-ms0.Mallocs)/msgs, "allocs/msg")
	if cpu0 >= 0 && cpu1 >= 0 {
		b.ReportMetric(float64((cpu1-cpu0).Microseconds())/msgs, "pg-µs/msg")
	}
}
