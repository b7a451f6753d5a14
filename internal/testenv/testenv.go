// Package testenv connects integration tests to the real services that
// scripts/testenv.sh starts. A missing service skips the test locally, with
// a message saying how to start it, and fails it under CI=true: in CI an
// integration test never skips silently.
//
// It also has what the tests of several packages share: waiting on a
// condition (WaitUntil), unique topic and group names (Name), sampling a
// group's committed offsets (SampleOffsets), the services' scripts
// (Script), private servers for the tests that stop them
// (NewPrivatePostgres, NewPrivateRedis) and the test binary re-executed as
// a child process (Child, ChildMain). The broker clients are in kafkatest
// and rmqtest, apart, so that a test of one broker (or of none) does not
// build the other's client library; the outbox's harness is relaytest, the
// stores' workload ledger.
//
// Everything that exists for tests lives under internal/testenv; the rest
// of internal/ is what the library uses, and imports nothing above dedup
// (TestInternalFloors).
package testenv

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Require returns the value of the environment variable name, or skips (fails
// under CI) when it is unset.
func Require(t testing.TB, name, service string) string {
	t.Helper()
	v := os.Getenv(name)
	if v != "" {
		return v
	}
	msg := fmt.Sprintf("%s is not set: start %s with `eval \"$(scripts/testenv.sh up %s)\"` or run `make test`", name, service, service)
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// useService returns the environment variable env, or skips (fails under
// CI) when it is unset (Require), and holds the tests' lock on the service
// name, shared or exclusive, until the test ends.
func useService(t testing.TB, env, name string, exclusive bool) string {
	t.Helper()
	v := Require(t, env, name)
	lockService(t, name, exclusive)
	return v
}

// PostgresURL returns IDEM_TEST_PG_URL.
func PostgresURL(t testing.TB) string {
	return Require(t, "IDEM_TEST_PG_URL", "postgres")
}

var seq atomic.Int64

// Schema creates a fresh schema for one test and drops it afterwards; tests
// in separate schemas run in parallel.
func Schema(t testing.TB, pool *pgxpool.Pool) string {
	t.Helper()
	name := fmt.Sprintf("t_%s_%d_%d", sanitize(t.Name()), os.Getpid(), seq.Add(1))
	if len(name) > 48 {
		name = fmt.Sprintf("t_%d_%d_%d", time.Now().UnixNano()%1e9, os.Getpid(), seq.Add(1))
	}
	ctx := context.Background()
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatalf("create schema: %v", err)
	}
	t.Cleanup(func() {
		if _, err := pool.Exec(context.Background(), "DROP SCHEMA "+pgx.Identifier{name}.Sanitize()+" CASCADE"); err != nil {
			t.Logf("drop schema %s: %v", name, err)
		}
	})
	return name
}

// Pool opens a pool on IDEM_TEST_PG_URL, closed when the test ends.
func Pool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	url := PostgresURL(t)
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatalf("IDEM_TEST_PG_URL: %v", err)
	}
	cfg.MaxConns = 20
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	t.Cleanup(pool.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := pool.Ping(ctx); err != nil {
		t.Fatalf("postgres at %s: %v", url, err)
	}
	return pool
}

func sanitize(s string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(s) {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	return b.String()
}

// SchemaPool creates a fresh schema and returns a pool whose connections have
// it as their search_path, so unqualified table names land in it.
func SchemaPool(t testing.TB) (*pgxpool.Pool, string) {
	t.Helper()
	schema := Schema(t, Pool(t))
	cfg, err := pgxpool.ParseConfig(PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 20
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool, schema
}
