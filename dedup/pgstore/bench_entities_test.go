package pgstore_test

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/pgstore"
	"github.com/idemkit/idem/internal/testenv"
)

// BenchmarkClaimWithWatermarks measures what entity watermarks cost a
// claim: one transaction claiming a batch of new keys, committed, without
// AdvanceEntities (none), and with it for as many distinct entities as
// keys — entities seen for the first time (new: their rows inserted), or
// seen once before, at a lower version (existing: their rows locked and
// updated: a trade's second status) — with the keys and watermarks kept
// for ever (retention=none: no expires_at) or for 7 days (retention=7d,
// as a payments consumer keeps them). The metrics are BenchmarkClaim's,
// and hot-%, the share of the watermarks' updates Postgres made HOT (no
// new index entries), from pg_stat_user_tables.
func BenchmarkClaimWithWatermarks(b *testing.B) {
	for _, batch := range []int{1, 100} {
		for _, entities := range []string{"none", "new", "existing"} {
			for _, retention := range []time.Duration{0, 7 * 24 * time.Hour} {
				name := "none"
				if retention > 0 {
					name = "7d"
				}
				b.Run(fmt.Sprintf("batch=%d/entities=%s/retention=%s", batch, entities, name), func(b *testing.B) { benchWatermarks(b, batch, entities, retention) })
			}
		}
	}
}

func benchWatermarks(b *testing.B, batch int, entities string, retention time.Duration) {
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
	schema := testenv.Schema(b, testenv.Pool(b))
	st, err := pgstore.New(pool, pgstore.Config{Schema: schema, Retention: retention})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	if err := st.Migrate(ctx); err != nil {
		b.Fatal(err)
	}
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
	upd0, hot0 := markUpdates(b, pool, schema)
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
	upd1, hot1 := markUpdates(b, pool, schema)
	runtime.ReadMemStats(&ms1)
	msgs := float64(b.N * batch)
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/msgs, "ns/msg")
	b.ReportMetric(float64(ms1.Mallocs-ms0.Mallocs)/msgs, "allocs/msg")
	if cpu0 >= 0 && cpu1 >= 0 {
		b.ReportMetric(float64((cpu1-cpu0).Microseconds())/msgs, "pg-µs/msg")
	}
	if upd1 > upd0 {
		b.ReportMetric(100*float64(hot1-hot0)/float64(upd1-upd0), "hot-%")
	}
}

// markUpdates returns the updates of the watermarks table in schema so
// far, and how many of them were HOT, after flushing the statistics of
// pool's one connection.
func markUpdates(b *testing.B, pool *pgxpool.Pool, schema string) (upd, hot int64) {
	b.Helper()
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `SELECT pg_stat_force_next_flush()`); err != nil {
		b.Fatal(err)
	}
	err := pool.QueryRow(ctx, `SELECT coalesce(sum(n_tup_upd), 0), coalesce(sum(n_tup_hot_upd), 0) FROM pg_stat_user_tables
WHERE schemaname = $1 AND relname = 'idem_dedup_watermarks'`, schema).Scan(&upd, &hot)
	if err != nil {
		b.Fatal(err)
	}
	return upd, hot
}
