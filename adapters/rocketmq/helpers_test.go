package rocketmq_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/adapters/rocketmq"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/dedup/pgstore"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/internal/testenv/bgconsumer"
	"github.com/idemkit/idem/internal/testenv/pgtest"
	"github.com/idemkit/idem/internal/testenv/rmqtest"
)

func TestMain(m *testing.M) {
	testenv.ChildMain(childEnv, (*child).run)
	rmqtest.Main(m, clientLog(), testenv.LogLevel(slog.LevelError))
}

// clientLog is where the RocketMQ client's logs go in tests: nowhere, or
// stderr with IDEM_TEST_LOG set (the client logs errors while it shuts down,
// for requests it cut off itself).
func clientLog() *slog.Logger {
	if os.Getenv("IDEM_TEST_LOG") == "" {
		return slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return slog.New(slog.NewTextHandler(os.Stderr, nil))
}

// name returns a topic or group name unique to this test run.
func name(t testing.TB, what string) string { return testenv.Name(t, what) }

// testLogger is testenv.Logger.
func testLogger(t testing.TB) *slog.Logger { return testenv.Logger(t) }

// mqadmin runs RocketMQ's own admin tool (MQAdminStartup, from the test
// environment's jars) and returns its output. It exits 0 even when the
// command failed: callers check the output.
func mqadmin(args ...string) (string, error) {
	_, file, _, _ := runtime.Caller(0)
	script := filepath.Join(filepath.Dir(file), "..", "..", "scripts", "testenv", "rocketmq.sh")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, script, append([]string{"admin"}, args...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("mqadmin %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// db is one test's Postgres: a fresh schema with the dedup table and an
// append-only effects table (no unique constraint, so that a double effect
// shows up as a second row instead of an error).
type db struct {
	pool    *pgxpool.Pool
	schema  string
	store   *pgstore.Store
	effects string
}

func newDB(t testing.TB) *db {
	t.Helper()
	pool := testenv.Pool(t)
	schema := testenv.Schema(t, pool)
	st := pgtest.Store(t, pool, schema)
	ctx := context.Background()
	effects := pgx.Identifier{schema, "effects"}.Sanitize()
	if _, err := pool.Exec(ctx, `CREATE TABLE `+effects+` (
		id bigserial PRIMARY KEY, key text NOT NULL, amount bigint NOT NULL DEFAULT 0,
		queue text NOT NULL DEFAULT '', seq int NOT NULL DEFAULT 0, run int NOT NULL DEFAULT 0,
		attempt int NOT NULL DEFAULT 0)`); err != nil {
		t.Fatal(err)
	}
	return &db{pool: pool, schema: schema, store: st, effects: effects}
}

func (d *db) count(t testing.TB, where string, args ...any) int {
	t.Helper()
	var n int
	q := `SELECT count(*) FROM ` + d.effects
	if where != "" {
		q += ` WHERE ` + where
	}
	if err := d.pool.QueryRow(context.Background(), q, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// running is a consumer running in the background.
type running = bgconsumer.Running

// start runs a consumer built from cfg until the test stops or kills it (or
// ends: then it is killed).
func start(t testing.TB, cfg consumer.Config[pgx.Tx]) *running {
	t.Helper()
	return bgconsumer.Start(t, cfg)
}

// source builds a Source on the test environment.
func source(t testing.TB, cfg rocketmq.Config) *rocketmq.Source {
	t.Helper()
	cfg.NameServers = rmqtest.Shared(t).NameServers
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t)
	}
	s, err := rocketmq.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// topicCount returns how many messages topic holds.
func topicCount(t testing.TB, topic string) int64 {
	t.Helper()
	n, err := rmqtest.Shared(t).Count(topic)
	if err != nil {
		t.Fatalf("messages in %s: %v", topic, err)
	}
	return n
}
