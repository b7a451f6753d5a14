package redisfront_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/deduptest"
	"github.com/idemkit/idem/dedup/mysqlstore"
	"github.com/idemkit/idem/dedup/pgstore"
	"github.com/idemkit/idem/dedup/redisfront"
	"github.com/idemkit/idem/dedup/sqlitestore"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/internal/testenv/sqlitetest"
)

func TestMain(m *testing.M) {
	// The drivers log broken connections; the fault tests break them.
	redis.SetLogger(silent{})
	_ = mysql.SetLogger(silent{})
	goleak.VerifyTestMain(m)
}

type silent struct{}

func (silent) Printf(context.Context, string, ...any) {}
func (silent) Print(...any)                           {}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

var prefixes atomic.Int64

// newClient connects to the test environment's shared Redis (a test that
// kills, flushes or pauses Redis has a testenv.PrivateRedis instead).
func newClient(t testing.TB) *redis.Client {
	t.Helper()
	addr := testenv.RedisAddr(t)
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, MaxRetries: -1, DialTimeout: time.Second})
	t.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("redis at %s: %v", addr, err)
	}
	return c
}

// frontConfig is a front with keys of its own (a prefix unique to the
// test). Its timeout is generous: on a loaded machine a Redis round trip
// can outlast the default 50ms, and a test that counts what Redis answered
// must not depend on that; the fault tests set their own.
func frontConfig(c *redis.Client, retention map[string]time.Duration) redisfront.Config {
	return redisfront.Config{
		Client: c, Prefix: fmt.Sprintf("idemtest:%d:%d:", os.Getpid(), prefixes.Add(1)),
		ScopeRetention: retention, Logger: quiet, Timeout: 10 * time.Second,
	}
}

// sqliteInner is a fresh SQLite store.
func sqliteInner(t testing.TB, cfg deduptest.Config) *sqlitestore.Store {
	st, _ := sqliteInnerDB(t, cfg)
	return st
}

func sqliteInnerDB(t testing.TB, cfg deduptest.Config) (*sqlitestore.Store, *sql.DB) {
	return sqlitetest.Store(t, sqlitestore.Config{LockTimeout: cfg.LockTimeout, Synchronous: sqlitestore.SynchronousNormal, ScopeRetention: cfg.ScopeRetention})
}

func mysqlInner(t testing.TB, cfg deduptest.Config) *mysqlstore.Store {
	dsn := testenv.MySQLDatabase(t, testenv.MySQLDSN(t))
	mcfg := mysqlstore.Config{LockTimeout: cfg.LockTimeout, ScopeRetention: cfg.ScopeRetention}
	db, err := mysqlstore.Open(dsn, mcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	st, err := mysqlstore.New(db, mcfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return st
}

func postgresInner(t testing.TB, cfg deduptest.Config) *pgstore.Store {
	pool := testenv.Pool(t)
	st, err := pgstore.New(pool, pgstore.Config{Schema: testenv.Schema(t, pool), LockTimeout: cfg.LockTimeout, ScopeRetention: cfg.ScopeRetention})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return st
}

func front[TTx any](t testing.TB, inner dedup.Store[TTx], cfg redisfront.Config) *redisfront.Store[TTx] {
	t.Helper()
	f, err := redisfront.New(inner, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// TestConformance runs deduptest on the front over the server stores, with
// a real Redis, and with AlwaysTransact over SQLite: the front keeps every
// promise of the store behind it.
func TestConformance(t *testing.T) {
	t.Run("mariadb", func(t *testing.T) {
		deduptest.Run(t, func(t *testing.T, cfg deduptest.Config) dedup.Store[*sql.Tx] {
			return front(t, dedup.Store[*sql.Tx](mysqlInner(t, cfg)), frontConfig(newClient(t), cfg.ScopeRetention))
		})
	})
	t.Run("postgres", func(t *testing.T) {
		deduptest.Run(t, func(t *testing.T, cfg deduptest.Config) dedup.Store[pgx.Tx] {
			return front(t, dedup.Store[pgx.Tx](postgresInner(t, cfg)), frontConfig(newClient(t), cfg.ScopeRetention))
		})
	})
	t.Run("sqlite always transact", func(t *testing.T) {
		deduptest.Run(t, func(t *testing.T, cfg deduptest.Config) dedup.Store[*sql.Tx] {
			fc := frontConfig(newClient(t), cfg.ScopeRetention)
			fc.AlwaysTransact = true
			return front(t, dedup.Store[*sql.Tx](sqliteInner(t, cfg)), fc)
		})
	})
}

// counting counts the inner store's transactions and claims.
type counting[TTx any] struct {
	dedup.Store[TTx]
	txs, claims atomic.Int64
}

// The release epochs are the store's: the front needs them.
func (c *counting[TTx]) Epochs(ctx context.Context) (map[string]dedup.Epoch, error) {
	return c.Store.(dedup.EpochStore).Epochs(ctx)
}

func (c *counting[TTx]) AdvanceEpoch(ctx context.Context, scope string) (int64, error) {
	return c.Store.(dedup.EpochStore).AdvanceEpoch(ctx, scope)
}

func (c *counting[TTx]) BeginRelease(ctx context.Context, scope string, hold time.Duration) (int64, error) {
	return c.Store.(dedup.EpochStore).BeginRelease(ctx, scope, hold)
}

func (c *counting[TTx]) EndRelease(ctx context.Context, scope string, token int64) error {
	return c.Store.(dedup.EpochStore).EndRelease(ctx, scope, token)
}

func (c *counting[TTx]) InTx(ctx context.Context, fn func(context.Context, TTx) error) error {
	c.txs.Add(1)
	return c.Store.InTx(ctx, fn)
}

func (c *counting[TTx]) Claim(ctx context.Context, tx TTx, cs []dedup.Claim, rs []dedup.Result) error {
	c.claims.Add(int64(len(cs)))
	return c.Store.Claim(ctx, tx, cs, rs)
}

func claimTx[TTx any](t *testing.T, st dedup.Store[TTx], cs ...dedup.Claim) []dedup.Result {
	t.Helper()
	res := make([]dedup.Result, len(cs))
	if err := st.InTx(context.Background(), func(ctx context.Context, tx TTx) error {
		return st.Claim(ctx, tx, cs, res)
	}); err != nil {
		t.Fatal(err)
	}
	return res
}

func statuses(rs []dedup.Result) []dedup.Status {
	var out []dedup.Status
	for _, r := range rs {
		out = append(out, r.Status)
	}
	return out
}

// TestDuplicatesSkipTheDatabase: a batch Redis knows entirely opens no
// transaction; a mixed batch sends only the unknown claims to the store; a
// known key with another payload goes to the store, which says mismatch;
// the release epochs cost one read per EpochTTL, not one per claim.
func TestDuplicatesSkipTheDatabase(t *testing.T) {
	began := time.Now()
	inner := &counting[*sql.Tx]{Store: sqliteInner(t, deduptest.Config{})}
	f := front(t, dedup.Store[*sql.Tx](inner), frontConfig(newClient(t), nil))
	a, b, c := deduptest.Claim("pay", "a", "1"), deduptest.Claim("pay", "b", "2"), deduptest.Claim("pay", "c", "3")
	claimTx(t, f, a, b)
	if inner.txs.Load() != 1 || f.Stats().Writes != 2 {
		t.Fatalf("first claim: %d transactions, stats %+v", inner.txs.Load(), f.Stats())
	}
	res := claimTx(t, f, a, b, a)
	if got := statuses(res); got[0] != dedup.StatusDuplicate || got[1] != dedup.StatusDuplicate || got[2] != dedup.StatusDuplicate {
		t.Fatalf("known keys: %v", got)
	}
	if res[0].FirstAt.IsZero() || time.Since(res[0].FirstAt) > time.Minute {
		t.Fatalf("FirstAt %v", res[0].FirstAt)
	}
	if inner.txs.Load() != 1 || f.Stats().Skipped != 1 {
		t.Fatalf("a batch of known duplicates opened a transaction: %d, stats %+v", inner.txs.Load(), f.Stats())
	}
	claims := inner.claims.Load()
	res = claimTx(t, f, c, a, deduptest.Claim("pay", "b", "other"))
	if got := statuses(res); got[0] != dedup.StatusNew || got[1] != dedup.StatusDuplicate || got[2] != dedup.StatusMismatch {
		t.Fatalf("mixed batch: %v", got)
	}
	if inner.txs.Load() != 2 || inner.claims.Load()-claims != 2 {
		t.Fatalf("mixed batch: %d transactions, %d claims to the store, want 2 and 2", inner.txs.Load(), inner.claims.Load()-claims)
	}
	// The release epochs are read once per EpochTTL (1s: read again after
	// four fifths of it), not per claim.
	if reads, most := f.Stats().EpochReads, 1+int64(time.Since(began)/(800*time.Millisecond)); reads < 1 || reads > most {
		t.Fatalf("%d reads of the release epochs in %v, want 1 to %d", reads, time.Since(began), most)
	}
}

// TestNoEntryBeforeCommit: while a claim is uncommitted, and after it rolled
// back, Redis holds nothing for the key (the in-progress state is the
// database's row lock, never a Redis record).
func TestNoEntryBeforeCommit(t *testing.T) {
	c := newClient(t)
	cfg := frontConfig(c, nil)
	f := front(t, dedup.Store[*sql.Tx](sqliteInner(t, deduptest.Config{})), cfg)
	k := deduptest.Claim("pay", "k", "p")
	keys := func() int {
		ks, err := c.Keys(context.Background(), cfg.Prefix+"*").Result()
		if err != nil {
			t.Fatal(err)
		}
		return len(ks)
	}
	errRollback := fmt.Errorf("roll back")
	err := f.InTx(context.Background(), func(ctx context.Context, tx *sql.Tx) error {
		if err := f.Claim(ctx, tx, []dedup.Claim{k}, make([]dedup.Result, 1)); err != nil {
			return err
		}
		if n := keys(); n != 0 {
			t.Errorf("%d Redis keys while the claim is uncommitted", n)
		}
		return errRollback
	})
	if err != errRollback {
		t.Fatal(err)
	}
	if n := keys(); n != 0 {
		t.Fatalf("%d Redis keys after a rollback", n)
	}
	if res := claimTx(t, f, k); res[0].Status != dedup.StatusNew {
		t.Fatalf("after the rollback: %v", res[0].Status)
	}
	if n := keys(); n != 1 {
		t.Fatalf("%d Redis keys after the commit, want 1", n)
	}
}

// TestRelease: a released key runs again, and so does every key of a
// released scope; a row deleted by hand stays a duplicate in Redis until
// Forget; a second release of a scope during the first is refused before
// it deletes anything. (A transaction that read a row before its release
// and commits after it: TestReleasedKeyWhileATransactionHeldItsRow.)
func TestRelease(t *testing.T) {
	inner, db := sqliteInnerDB(t, deduptest.Config{})
	cfg := frontConfig(newClient(t), nil)
	cfg.EpochTTL = 100 * time.Millisecond
	f := front(t, dedup.Store[*sql.Tx](inner), cfg)
	ctx := context.Background()
	k := deduptest.Claim("pay", "k", "p")
	claimTx(t, f, k)
	deleteRow := func(id string) func(ctx context.Context) error {
		return func(ctx context.Context) error {
			_, err := db.ExecContext(ctx, `DELETE FROM idem_dedup WHERE key = ?`, id)
			return err
		}
	}

	// By hand: the stale entry still answers, until Forget.
	if err := deleteRow("k")(ctx); err != nil {
		t.Fatal(err)
	}
	if res := claimTx(t, f, k); res[0].Status != dedup.StatusDuplicate {
		t.Fatalf("a row deleted by hand: %v from Redis (the documented stale entry)", res[0].Status)
	}
	if err := f.Forget(ctx, k.Key); err != nil {
		t.Fatal(err)
	}
	if res := claimTx(t, f, k); res[0].Status != dedup.StatusNew {
		t.Fatalf("after Forget: %v, want new", res[0].Status)
	}

	// Release.
	k2 := deduptest.Claim("pay", "k2", "p")
	claimTx(t, f, k2)
	if res := claimTx(t, f, k2); res[0].Status != dedup.StatusDuplicate || f.Stats().Hits == 0 {
		t.Fatalf("k2 before its release: %v, stats %+v", res[0].Status, f.Stats())
	}
	if err := f.Release(ctx, []dedup.Key{k2.Key}, deleteRow("k2")); err != nil {
		t.Fatal(err)
	}
	if res := claimTx(t, f, k2); res[0].Status != dedup.StatusNew {
		t.Fatalf("a released key: %v, want new", res[0].Status)
	}

	// A release during another one of the same scope.
	inside := make(chan error, 1)
	if err := f.Release(ctx, []dedup.Key{k2.Key}, func(ctx context.Context) error {
		inside <- f.Release(ctx, []dedup.Key{k.Key}, func(context.Context) error {
			t.Error("the second release's deleteRows ran")
			return nil
		})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := <-inside; !errors.Is(err, dedup.ErrReleaseInProgress) {
		t.Fatalf("a release of a scope during another one: %v, want ErrReleaseInProgress", err)
	}

	// A whole scope.
	claimTx(t, f, deduptest.Claim("other", "x", "p"), deduptest.Claim("other", "y", "p"))
	if err := f.ReleaseScope(ctx, "other", func(ctx context.Context) error {
		_, err := db.ExecContext(ctx, `DELETE FROM idem_dedup WHERE scope = 'other'`)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if res := claimTx(t, f, deduptest.Claim("other", "x", "p")); res[0].Status != dedup.StatusNew {
		t.Fatalf("a released scope: %v, want new", res[0].Status)
	}
}

func TestConfigErrors(t *testing.T) {
	inner := sqliteInner(t, deduptest.Config{})
	noCtx := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer noCtx.Close()
	ok := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true})
	defer ok.Close()
	for _, cfg := range []redisfront.Config{
		{},
		{Client: noCtx},
		{Client: ok, Prefix: "a{b"},
		{Client: ok, Timeout: -1},
		{Client: ok, ScopeRetention: map[string]time.Duration{"x": -1}},
		{Client: ok, EpochTTL: -1},
		{Client: ok, EpochTTL: time.Minute, ReleaseHold: time.Minute},
	} {
		if _, err := redisfront.New(dedup.Store[*sql.Tx](inner), cfg); err == nil {
			t.Errorf("New(%+v) accepted", cfg)
		}
	}
	if _, err := redisfront.New[*sql.Tx](nil, redisfront.Config{Client: ok}); err == nil {
		t.Error("a nil inner store accepted")
	}
	// A store without release epochs (a wrapper that hides them) is
	// refused, unless Config.Epochs names them.
	wrapped := dedup.Store[*sql.Tx](struct{ dedup.Store[*sql.Tx] }{inner})
	if _, err := redisfront.New(wrapped, redisfront.Config{Client: ok}); err == nil || !strings.Contains(err.Error(), "Config.Epochs") {
		t.Errorf("an inner store without epochs: %v, want an error naming Config.Epochs", err)
	}
	if _, err := redisfront.New(wrapped, redisfront.Config{Client: ok, Epochs: inner}); err != nil {
		t.Errorf("an inner store with Config.Epochs: %v", err)
	}
}
