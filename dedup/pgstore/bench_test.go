package pgstore_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/pgstore"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/internal/testenv/pgtest"
)

// BenchmarkClaim measures the claim path against the real Postgres of the
// test environment: one transaction claiming batch keys, committed; new
// keys, or (repeat) keys committed before. ns/msg includes the database
// round trips and COMMIT; allocs/msg counts the client's allocations (pgx
// encoding included); pg-µs/msg is the CPU time of the one server process
// serving the benchmark, when it runs on this machine (from /proc).
//
// The partitioned variants keep keys 90 days in partitions of a week (16
// partitions, one index probe each per key) or of a day (93).
func BenchmarkClaim(b *testing.B) {
	for _, layout := range []struct {
		name string
		cfg  pgstore.Config
	}{
		{"", pgstore.Config{}},
		{"partitions=16/", pgstore.Config{Retention: 90 * 24 * time.Hour, PartitionWidth: 7 * 24 * time.Hour}},
		{"partitions=93/", pgstore.Config{Retention: 90 * 24 * time.Hour, PartitionWidth: 24 * time.Hour}},
	} {
		for _, batch := range []int{1, 100} {
			for _, repeat := range []bool{false, true} {
				name := fmt.Sprintf("%sbatch=%d", layout.name, batch)
				if repeat {
					name += "/repeat"
				}
				b.Run(name, func(b *testing.B) { benchClaim(b, layout.cfg, batch, repeat) })
			}
		}
	}
}

func benchClaim(b *testing.B, layout pgstore.Config, batch int, repeat bool) {
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
	st := pgtest.Store(b, pool, schema)
	if layout.PartitionWidth != 0 {
		layout.Schema = testenv.Schema(b, testenv.Pool(b))
		if st, err = pgstore.New(pool, layout); err != nil {
			b.Fatal(err)
		}
		if err := st.Migrate(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
	ctx := context.Background()
	var backend int
	if err := pool.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&backend); err != nil {
		b.Fatal(err)
	}
	claims := make([]dedup.Claim, batch)
	results := make([]dedup.Result, batch)
	fp := dedup.FingerprintOf([]byte(`{"txn_id":"x","amount":1}`))
	ids := make([]string, b.N*batch)
	for i := range ids {
		ids[i] = fmt.Sprintf("txn-%09d", i)
	}
	claim := func(i int) error {
		for j := range claims {
			claims[j] = dedup.Claim{Key: dedup.Key{Scope: "bench", ID: ids[i*batch+j]}, Fingerprint: fp, Source: "bench"}
		}
		return st.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
			return st.Claim(ctx, tx, claims, results)
		})
	}
	want := dedup.StatusNew
	if repeat {
		want = dedup.StatusDuplicate
		for i := 0; i < b.N; i++ {
			if err := claim(i); err != nil {
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
		if results[0].Status != want {
			b.Fatalf("status %v, want %v", results[0].Status, want)
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

// processCPU is the user and system CPU time of a process on this machine
// (Linux, /proc, ticks of 10 ms), -1 when it cannot be read.
func processCPU(pid int) time.Duration {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return -1
	}
	s := string(stat)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return -1
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	k, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return -1
	}
	return time.Duration(u+k) * 10 * time.Millisecond
}
