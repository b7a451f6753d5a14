package pgstore_test

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/pgstore"
	"github.com/idemkit/idem/internal/testenv"
)

// BenchmarkPurgeUnderClaims purges rows expired keys (10 M, or
// IDEM_BENCH_PURGE_ROWS; IDEM_BENCH_PURGE_MODE=delete or partitions runs
// one way only) from a private, durable Postgres (fsync on) while
// four claimers commit batches of 100 new keys: by DELETE (Purge(10000)
// until done) and by dropping the partition (PartitionWidth 24h). It
// reports the purge's time, its database time (pg_stat_statements, the
// purge running as a role of its own), and the claims per second during
// the purge against a window without one (at least 10 s each; the claim
// transactions' worst latency too). Run it alone, once:
//
//	go test -run '^$' -bench PurgeUnderClaims -benchtime 1x -timeout 2h ./dedup/pgstore/
func BenchmarkPurgeUnderClaims(b *testing.B) {
	rows := 10_000_000
	if s := os.Getenv("IDEM_BENCH_PURGE_ROWS"); s != "" {
		var err error
		if rows, err = strconv.Atoi(s); err != nil {
			b.Fatal(err)
		}
	}
	pg := testenv.NewPrivatePostgres(b, "shared_preload_libraries = 'pg_stat_statements'",
		"shared_buffers = '256MB'", "max_wal_size = '8GB'", "checkpoint_timeout = '30min'")
	ctx := context.Background()
	admin, err := pgxpool.New(ctx, pg.URL())
	if err != nil {
		b.Fatal(err)
	}
	defer admin.Close()
	if _, err := admin.Exec(ctx, `CREATE EXTENSION pg_stat_statements; CREATE ROLE purger LOGIN SUPERUSER`); err != nil {
		b.Fatal(err)
	}
	u, _ := url.Parse(pg.URL())
	u.User = url.User("purger")
	purgePool, err := pgxpool.New(ctx, u.String())
	if err != nil {
		b.Fatal(err)
	}
	defer purgePool.Close()
	for _, mode := range []string{"delete", "partitions"} {
		if m := os.Getenv("IDEM_BENCH_PURGE_MODE"); m != "" && m != mode {
			continue
		}
		b.Run(mode, func(b *testing.B) { benchPurge(b, admin, purgePool, mode, rows) })
	}
}

func benchPurge(b *testing.B, pool, purgePool *pgxpool.Pool, mode string, rows int) {
	ctx := context.Background()
	cfg := pgstore.Config{Schema: "bench_" + mode, Retention: 24 * time.Hour}
	if mode == "partitions" {
		cfg.PartitionWidth = 24 * time.Hour
	}
	st, err := pgstore.New(pool, cfg)
	if err != nil {
		b.Fatal(err)
	}
	if err := st.Migrate(ctx); err != nil {
		b.Fatal(err)
	}
	purger, err := pgstore.New(purgePool, cfg)
	if err != nil {
		b.Fatal(err)
	}
	t := st.Table()
	// Expired rows: yesterday's keys (UTC), in a partition of their own in
	// partitioned mode, like the store makes. Loaded without the primary
	// key, which is built once loaded (a sort, not 10 M index inserts):
	// the load's time is not what is measured.
	day := time.Now().UTC().Truncate(24 * time.Hour).Add(-24 * time.Hour)
	into := t
	if mode == "partitions" {
		into = pgx.Identifier{cfg.Schema, "idem_dedup_p" + strconv.FormatInt(day.Unix(), 10)}.Sanitize()
		if _, err := pool.Exec(ctx, `CREATE TABLE `+into+` (LIKE `+t+` INCLUDING DEFAULTS INCLUDING CONSTRAINTS)`); err != nil {
			b.Fatal(err)
		}
	} else if _, err := pool.Exec(ctx, `ALTER TABLE `+t+` DROP CONSTRAINT idem_dedup_pkey`); err != nil {
		b.Fatal(err)
	}
	began := time.Now()
	const chunk = 1_000_000
	for lo := 0; lo < rows; lo += chunk {
		// Keys of 45 bytes, a 32-byte fingerprint, a source.
		if _, err := pool.Exec(ctx, `INSERT INTO `+into+` (scope, key, fingerprint, source, created_at, expires_at)
SELECT 'payments', 'txn-' || md5(i::text) || '-' || lpad(i::text, 8, '0'), sha256(i::text::bytea), 'payments/' || (i % 12) || '/' || i,
       $1::timestamptz - interval '1 day' + (i % 86400000) * interval '1 millisecond', $1::timestamptz + (i % 86400000) * interval '1 millisecond'
FROM generate_series($2::int, $3::int) AS i`, day, lo, min(lo+chunk, rows)-1); err != nil {
			b.Fatal(err)
		}
	}
	finish := `ALTER TABLE ` + t + ` ADD PRIMARY KEY (scope, key)`
	if mode == "partitions" {
		finish = `ALTER TABLE ` + t + ` ATTACH PARTITION ` + into + ` FOR VALUES FROM ('` + day.Format(time.RFC3339) + `') TO ('` + day.Add(24*time.Hour).Format(time.RFC3339) + `')`
	}
	if _, err := pool.Exec(ctx, `SET maintenance_work_mem = '512MB'; `+finish); err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE `+t); err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CHECKPOINT`); err != nil {
		b.Fatal(err)
	}
	b.Logf("%s: %d expired rows written in %v", mode, rows, time.Since(began).Round(time.Second))

	// Four claimers, batches of 100 new keys of 45 bytes.
	var claimed atomic.Int64
	var mu sync.Mutex
	var lat []time.Duration
	stop := make(chan struct{})
	var wg sync.WaitGroup
	fp := dedup.FingerprintOf([]byte(`{"amount":1}`))
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cs := make([]dedup.Claim, 100)
			res := make([]dedup.Result, 100)
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				for i := range cs {
					cs[i] = dedup.Claim{Key: dedup.Key{Scope: "payments", ID: fmt.Sprintf("live-%d-%010d-%03d-xxxxxxxxxxxxxxxxxxxxxxxx", g, n, i)}, Fingerprint: fp, Source: "payments/0/1"}
				}
				t0 := time.Now()
				err := st.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error { return st.Claim(ctx, tx, cs, res) })
				if err != nil {
					b.Error(err)
					return
				}
				d := time.Since(t0)
				claimed.Add(100)
				mu.Lock()
				lat = append(lat, d)
				mu.Unlock()
			}
		}()
	}
	window := func(run func()) (perSec float64, worst time.Duration, took time.Duration) {
		mu.Lock()
		lat = lat[:0]
		mu.Unlock()
		n0, t0 := claimed.Load(), time.Now()
		run()
		took = time.Since(t0)
		for time.Since(t0) < 10*time.Second {
			time.Sleep(100 * time.Millisecond)
		}
		el := time.Since(t0)
		mu.Lock()
		worst = slices.Max(append(lat, 0))
		mu.Unlock()
		return float64(claimed.Load()-n0) / el.Seconds(), worst, took
	}
	time.Sleep(3 * time.Second) // warm up
	base, baseWorst, _ := window(func() {})
	if _, err := pool.Exec(ctx, `SELECT pg_stat_statements_reset()`); err != nil {
		b.Fatal(err)
	}
	purged := 0
	during, worst, took := window(func() {
		for {
			n, err := purger.Purge(ctx, 10000)
			if err != nil {
				b.Fatal(err)
			}
			purged += n
			if n < 10000 {
				return
			}
		}
	})
	close(stop)
	wg.Wait()
	var dbMs float64
	var calls int64
	if err := pool.QueryRow(ctx, `SELECT coalesce(sum(total_exec_time), 0), coalesce(sum(calls), 0)::int8 FROM pg_stat_statements WHERE userid = 'purger'::regrole`).Scan(&dbMs, &calls); err != nil {
		b.Fatal(err)
	}
	stmts, err := pool.Query(ctx, `SELECT left(regexp_replace(query, '\s+', ' ', 'g'), 70), calls, total_exec_time
FROM pg_stat_statements WHERE userid = 'purger'::regrole ORDER BY total_exec_time DESC LIMIT 6`)
	if err != nil {
		b.Fatal(err)
	}
	var q string
	var n int64
	var ms float64
	if _, err := pgx.ForEachRow(stmts, []any{&q, &n, &ms}, func() error {
		b.Logf("%s:   %8.1f ms %6d× %s", mode, ms, n, q)
		return nil
	}); err != nil {
		b.Fatal(err)
	}
	var left int64
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+t+` WHERE expires_at < now()`).Scan(&left); err != nil {
		b.Fatal(err)
	}
	b.Logf("%s: purged %d rows (%d expired left) in %v; database time %.0f ms in %d statements; claims/s %.0f without purge (worst tx %v), %.0f during (worst tx %v): %+.1f%%",
		mode, purged, left, took.Round(time.Millisecond), dbMs, calls, base, baseWorst.Round(time.Millisecond), during, worst.Round(time.Millisecond), 100*(during-base)/base)
	b.ReportMetric(took.Seconds(), "purge-s")
	b.ReportMetric(dbMs, "purge-db-ms")
	b.ReportMetric(base, "claims/s-idle")
	b.ReportMetric(during, "claims/s-purge")
	if mode == "delete" {
		t0 := time.Now()
		if _, err := pool.Exec(ctx, `VACUUM `+t); err != nil {
			b.Fatal(err)
		}
		b.Logf("delete: the VACUUM after it: %v", time.Since(t0).Round(time.Millisecond))
	}
}
