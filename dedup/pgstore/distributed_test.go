package pgstore_test

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/deduptest"
	"github.com/idemkit/idem/dedup/pgstore"
	"github.com/idemkit/idem/internal/testenv"
)

// The tests of distributed mode run on testenv.Distributed: real Postgres
// with advisory locks refused, every statement checked for ctid, advisory
// locks, lock_timeout, hashtext and DDL sharing a transaction, and
// SERIALIZABLE the default isolation.

func distributedStore(t *testing.T, d *testenv.Distributed, cfg pgstore.Config) *pgstore.Store {
	t.Helper()
	cfg.Distributed = true
	if cfg.Schema == "" {
		cfg.Schema = d.Schema
	}
	st, err := pgstore.New(d.Pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return st
}

func TestDistributedConformance(t *testing.T) {
	deduptest.RunWith(t, func(t *testing.T, cfg deduptest.Config) dedup.Store[pgx.Tx] {
		d := testenv.NewDistributed(t)
		return distributedStore(t, d, pgstore.Config{LockTimeout: cfg.LockTimeout, ScopeRetention: cfg.ScopeRetention})
	}, deduptest.Options{Serializable: true})
}

func TestDistributedOffsetsConformance(t *testing.T) {
	deduptest.RunOffsets(t, func(t *testing.T, lockTimeout time.Duration) deduptest.OffsetStore[pgx.Tx] {
		return distributedStore(t, testenv.NewDistributed(t), pgstore.Config{LockTimeout: lockTimeout})
	})
}

func TestDistributedEpochsConformance(t *testing.T) {
	deduptest.RunEpochs(t, func(t *testing.T) dedup.EpochStore {
		return distributedStore(t, testenv.NewDistributed(t), pgstore.Config{})
	})
}

func TestDistributedAdmin(t *testing.T) {
	deduptest.RunAdmin(t, func(t *testing.T) (dedup.Store[pgx.Tx], dedup.Admin) {
		d := testenv.NewDistributed(t)
		st := distributedStore(t, d, pgstore.Config{ScopeRetention: map[string]time.Duration{"hour": time.Hour}})
		return st, st.Admin()
	})
}

// TestDistributedRestrictionsBite shows that the environment refuses what
// the default mode does: its Migrate takes an advisory lock, its claim sets
// lock_timeout, its Purge deletes by ctid.
func TestDistributedRestrictionsBite(t *testing.T) {
	d := testenv.NewDistributed(t)
	d.AllowViolations()
	ctx := context.Background()
	var pgErr *pgconn.PgError
	if err := d.Pool.QueryRow(ctx, `SELECT pg_advisory_xact_lock(1)`).Scan(new(bool)); !errors.As(err, &pgErr) || pgErr.Code != "0A000" {
		t.Fatalf("pg_advisory_xact_lock on the restricted pool: %v, want 0A000", err)
	}
	plain, err := pgstore.New(d.Pool, pgstore.Config{Schema: d.Schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := plain.Migrate(ctx); !errors.As(err, &pgErr) || pgErr.Code != "0A000" {
		t.Fatalf("default-mode Migrate on the restricted pool: %v, want the advisory lock refused (0A000)", err)
	}
	// Made by the unrestricted pool, then used through the restricted one.
	made, err := pgstore.New(d.Admin, pgstore.Config{Schema: d.Schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := made.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := claimOnce(ctx, plain, deduptest.Claim("s", "k", "p")); err != nil {
		t.Fatal(err)
	}
	if _, err := plain.Purge(ctx, 10); err != nil {
		t.Fatal(err)
	}
	got := strings.Join(d.Violations(), "\n")
	for _, want := range []string{`"pg_advisory_xact_lock"`, `"lock_timeout"`, `"ctid"`} {
		if !strings.Contains(got, want) {
			t.Errorf("the tracer did not flag %s; it flagged:\n%s", want, got)
		}
	}
}

func claimOnce(ctx context.Context, st *pgstore.Store, cs ...dedup.Claim) ([]dedup.Result, error) {
	res := make([]dedup.Result, len(cs))
	err := st.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error { return st.Claim(ctx, tx, cs, res) })
	return res, err
}

// primaryKey lists the columns of table's primary key in order.
func primaryKey(t *testing.T, d *testenv.Distributed, table string) string {
	t.Helper()
	var cols string
	err := d.Admin.QueryRow(context.Background(), `SELECT string_agg(a.attname, ',' ORDER BY k.ord)
FROM pg_index i CROSS JOIN unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
WHERE i.indrelid = $1::regclass AND i.indisprimary`, table).Scan(&cols)
	if err != nil {
		t.Fatal(err)
	}
	return cols
}

// TestDistributedShardSpreadsMonotonicKeys claims 1,000 increasing keys and
// checks that the primary key starts with the shard, that every row's shard
// is the first hex digit of md5(scope, U+001F, key), and that the keys fill
// all the shards.
func TestDistributedShardSpreadsMonotonicKeys(t *testing.T) {
	d := testenv.NewDistributed(t)
	st := distributedStore(t, d, pgstore.Config{})
	ctx := context.Background()
	if pk := primaryKey(t, d, st.Table()); pk != "shard,scope,key" {
		t.Fatalf("primary key (%s), want (shard,scope,key)", pk)
	}
	var cs []dedup.Claim
	for i := range 1000 {
		cs = append(cs, deduptest.Claim("orders", fmt.Sprintf("%08d", i), "p"))
	}
	if _, err := claimOnce(ctx, st, cs...); err != nil {
		t.Fatal(err)
	}
	rows, err := d.Admin.Query(ctx, `SELECT shard, scope, key FROM `+st.Table())
	if err != nil {
		t.Fatal(err)
	}
	perShard := map[int16]int{}
	n := 0
	for rows.Next() {
		var shard int16
		var scope, key string
		if err := rows.Scan(&shard, &scope, &key); err != nil {
			t.Fatal(err)
		}
		sum := md5.Sum([]byte(scope + "\x1f" + key))
		want := strings.Index("0123456789abcdef", hex.EncodeToString(sum[:])[:1])
		if int(shard) != want {
			t.Fatalf("%s/%s in shard %d, want %d", scope, key, shard, want)
		}
		perShard[shard]++
		n++
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if n != 1000 || len(perShard) != pgstore.Shards {
		t.Fatalf("%d rows over %d shards, want 1000 over %d: %v", n, len(perShard), pgstore.Shards, perShard)
	}
}

// TestDistributedClaimBoundDoesNotBoundHandler: statement_timeout bounds the
// claim's INSERT and is restored for the handler's statements after it.
func TestDistributedClaimBoundDoesNotBoundHandler(t *testing.T) {
	d := testenv.NewDistributed(t)
	st := distributedStore(t, d, pgstore.Config{LockTimeout: 100 * time.Millisecond})
	ctx := context.Background()
	err := st.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		res := make([]dedup.Result, 1)
		if err := st.Claim(ctx, tx, []dedup.Claim{deduptest.Claim("s", "k", "p")}, res); err != nil {
			return err
		}
		var timeout string
		if err := tx.QueryRow(ctx, `SHOW statement_timeout`).Scan(&timeout); err != nil {
			return err
		}
		if timeout != "0" {
			return fmt.Errorf("statement_timeout after the claim is %q, want the session's 0", timeout)
		}
		_, err := tx.Exec(ctx, `SELECT pg_sleep(0.3)`) // three times the claim's bound
		return err
	})
	if err != nil {
		t.Fatalf("a handler statement longer than LockTimeout after a claim: %v", err)
	}
}

func TestDistributedMigrateConcurrently(t *testing.T) {
	d := testenv.NewDistributed(t)
	ctx := context.Background()
	const migrators = 4
	errs := make(chan error, migrators)
	for range migrators {
		go func() {
			st, err := pgstore.New(d.Pool, pgstore.Config{Schema: d.Schema, Table: "dedup_x", Distributed: true})
			if err == nil {
				err = st.Migrate(ctx)
			}
			errs <- err
		}()
	}
	for range migrators {
		if err := <-errs; err != nil {
			t.Fatalf("Migrate: %v", err)
		}
	}
	checkMigrated(t, d, "dedup_x")
}

// checkMigrated checks that table has each migration once, a shard-first
// primary key, passes Check, and that no lock row is left.
func checkMigrated(t *testing.T, d *testenv.Distributed, table string) {
	t.Helper()
	ctx := context.Background()
	var n, versions, last, locks int
	if err := d.Admin.QueryRow(ctx, `SELECT count(*), count(DISTINCT version), max(version) FROM `+pgx.Identifier{d.Schema, "idem_schema_migrations"}.Sanitize()+` WHERE table_name = $1`, table).Scan(&n, &versions, &last); err != nil {
		t.Fatal(err)
	}
	if n != versions || n != last || n < 2 {
		t.Fatalf("%d migration rows for %d versions up to %d: want each of the migrations (two or more) once", n, versions, last)
	}
	if err := d.Admin.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{d.Schema, "idem_schema_lock"}.Sanitize()).Scan(&locks); err != nil {
		t.Fatal(err)
	}
	if locks != 0 {
		t.Fatalf("%d lock rows left behind", locks)
	}
	qualified := pgx.Identifier{d.Schema, table}.Sanitize()
	if pk := primaryKey(t, d, qualified); pk != "shard,scope,key" {
		t.Fatalf("primary key (%s), want (shard,scope,key)", pk)
	}
	st, err := pgstore.New(d.Pool, pgstore.Config{Schema: d.Schema, Table: table, Distributed: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Check(ctx); err != nil {
		t.Fatalf("Check: %v", err)
	}
}

// TestDistributedMigrateAfterCrash: a migrator that crashed leaves its lock
// row (expired, or with a lease still running) or its migration half done.
func TestDistributedMigrateAfterCrash(t *testing.T) {
	d := testenv.NewDistributed(t)
	ctx := context.Background()
	lock := pgx.Identifier{d.Schema, "idem_schema_lock"}.Sanitize()
	migrate := func(ctx context.Context, table string) error {
		st, err := pgstore.New(d.Pool, pgstore.Config{Schema: d.Schema, Table: table, Distributed: true})
		if err != nil {
			t.Fatal(err)
		}
		return st.Migrate(ctx)
	}
	if err := migrate(ctx, "first"); err != nil {
		t.Fatal(err)
	}
	crash := func(lease string) {
		t.Helper()
		if _, err := d.Admin.Exec(ctx, `INSERT INTO `+lock+` (name, holder, expires_at) VALUES ('migrate', 'crashed', now() + $1::interval)`, lease); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("LeaseExpired", func(t *testing.T) {
		crash("-1 second")
		if err := migrate(ctx, "expired"); err != nil {
			t.Fatal(err)
		}
		checkMigrated(t, d, "expired")
	})
	t.Run("LeaseRunning", func(t *testing.T) {
		crash("1 hour")
		// Long enough for Migrate to reach the lock on a loaded machine (300
		// ms failed once at load 13: the deadline ended it before the lock,
		// without the holder in its error); it then waits the rest out.
		short, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		err := migrate(short, "blocked")
		if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), `held by "crashed"`) {
			t.Fatalf("Migrate under another migrator's live lease: %v, want to wait for it until ctx ends", err)
		}
		var exists bool
		if err := d.Admin.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, pgx.Identifier{d.Schema, "blocked"}.Sanitize()).Scan(&exists); err != nil || exists {
			t.Fatalf("table made without the lock: %v, %v", exists, err)
		}
		// The lease runs out (moved to the past here, as time would).
		if _, err := d.Admin.Exec(ctx, `UPDATE `+lock+` SET expires_at = now() - interval '1 second'`); err != nil {
			t.Fatal(err)
		}
		if err := migrate(ctx, "blocked"); err != nil {
			t.Fatal(err)
		}
		checkMigrated(t, d, "blocked")
	})
	t.Run("LeaseRunsOutWhileWaiting", func(t *testing.T) {
		crash("1 second")
		if err := migrate(ctx, "waited"); err != nil {
			t.Fatal(err)
		}
		checkMigrated(t, d, "waited")
	})
	t.Run("HalfDone", func(t *testing.T) {
		// Migration 2 ran to its end but its version row was not written:
		// every statement runs again, the ADD CONSTRAINT finding its
		// constraint.
		if _, err := d.Admin.Exec(ctx, `DELETE FROM `+pgx.Identifier{d.Schema, "idem_schema_migrations"}.Sanitize()+` WHERE table_name = 'first' AND version = 2`); err != nil {
			t.Fatal(err)
		}
		if err := migrate(ctx, "first"); err != nil {
			t.Fatal(err)
		}
		checkMigrated(t, d, "first")
	})
}

// TestDistributedModeMismatch: a table made in one mode is refused by a
// store in the other.
func TestDistributedModeMismatch(t *testing.T) {
	d := testenv.NewDistributed(t)
	ctx := context.Background()
	made, err := pgstore.New(d.Admin, pgstore.Config{Schema: d.Schema, Table: "plain"})
	if err != nil {
		t.Fatal(err)
	}
	if err := made.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	dist, err := pgstore.New(d.Pool, pgstore.Config{Schema: d.Schema, Table: "plain", Distributed: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := dist.Check(ctx); !errors.Is(err, pgstore.ErrModeMismatch) || dist.ClassifyError(err) != dedup.ClassFatal {
		t.Fatalf("distributed Check of a default-mode table: %v", err)
	}
	sharded := distributedStore(t, d, pgstore.Config{Table: "sharded"})
	plain, err := pgstore.New(d.Admin, pgstore.Config{Schema: d.Schema, Table: "sharded"})
	if err != nil {
		t.Fatal(err)
	}
	if err := plain.Check(ctx); !errors.Is(err, pgstore.ErrModeMismatch) {
		t.Fatalf("default-mode Check of a distributed table: %v", err)
	}
	if err := sharded.Check(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestDistributedRefusesHTTP(t *testing.T) {
	d := testenv.NewDistributed(t)
	st := distributedStore(t, d, pgstore.Config{})
	ctx := context.Background()
	c := deduptest.Claim("http", "k", "p")
	_, err := st.RunRequest(ctx, c, time.Hour, func(ctx context.Context, tx pgx.Tx) (dedup.StoredResponse, error) {
		t.Error("the handler ran")
		return dedup.StoredResponse{Status: 200}, nil
	})
	if !errors.Is(err, pgstore.ErrDistributedHTTP) || st.ClassifyError(err) != dedup.ClassFatal {
		t.Fatalf("RunRequest: %v", err)
	}
	if _, err := st.AcquireLease(ctx, c, time.Hour, time.Minute); !errors.Is(err, pgstore.ErrDistributedHTTP) {
		t.Fatalf("AcquireLease: %v", err)
	}
}

// TestDistributedSerializationFailuresRetried drives 500 payments, each
// delivered 2–4 times with crashes after commit, through a consumer on a
// distributed-mode store, with the first 40 effect inserts failing with
// 40001 or 40P01: every payment is applied once, none dead-lettered.
func TestDistributedSerializationFailuresRetried(t *testing.T) {
	d := testenv.NewDistributed(t)
	st := distributedStore(t, d, pgstore.Config{})
	ctx := context.Background()
	table := effectsTable(t, d.Admin, d.Schema)
	injected := d.InjectFailures(t, table, 40)

	const n = 500
	var msgs []*consumer.Message
	for i := range n {
		msgs = append(msgs, consumertest.Message("payments", int32(i%4), int64(i/4), "",
			fmt.Sprintf(`{"txn_id":"T%05d","amount":%d}`, i, 100+i)))
	}
	conflicts := &conflictCounter{}
	res := consumertest.Run(t, consumer.Config[pgx.Tx]{
		Name: "payments", Store: st, Handler: insertEffect(table), Key: consumer.ByJSONField("txn_id"),
		BatchSize: 20, Logger: quiet, Observer: conflicts,
	}, consumertest.Script{MinDeliveries: 2, MaxDeliveries: 4, ReorderWindow: 20, CrashAfterCommitEvery: 5, Seed: 3}, msgs...)
	t.Log(res)

	var rows, distinct, dedupRows int64
	if err := d.Admin.QueryRow(ctx, `SELECT count(*), count(DISTINCT txn_id) FROM `+table).Scan(&rows, &distinct); err != nil {
		t.Fatal(err)
	}
	if err := d.Admin.QueryRow(ctx, `SELECT count(*) FROM `+st.Table()+` WHERE outcome = 'done'`).Scan(&dedupRows); err != nil {
		t.Fatal(err)
	}
	if rows != n || distinct != n || dedupRows != n {
		t.Fatalf("effects %d (distinct %d), dedup rows %d; want %d each", rows, distinct, dedupRows, n)
	}
	if got := injected(); got != 40 {
		t.Fatalf("%d failures injected, want 40", got)
	}
	// Every injected failure rolled a transaction back as a conflict. (Not
	// every one is a retry: a second conflict in a row halves the batch
	// instead of waiting.)
	if got := conflicts.n.Load(); got < 40 || res.Stats.Retries < 1 {
		t.Fatalf("%d transactions rolled back as conflicts, %d retries, for 40 injected failures", got, res.Stats.Retries)
	}
	if res.Stats.Applied != n || len(res.DeadLetters) != 0 {
		t.Fatalf("stats %+v, dead letters %+v", res.Stats, res.DeadLetters)
	}
}

// conflictCounter counts the transactions rolled back as conflicts.
type conflictCounter struct {
	consumer.NopObserver
	n atomic.Int64
}

func (c *conflictCounter) TxEnd(_ context.Context, e consumer.TxEvent) {
	if e.Err != nil && e.Class == dedup.ClassConflict {
		c.n.Add(1)
	}
}

// TestDistributedHundredConcurrentDeliveries: 100 deliveries of one key at
// once through four consumers under SERIALIZABLE.
func TestDistributedHundredConcurrentDeliveries(t *testing.T) {
	d := testenv.NewDistributed(t)
	st := distributedStore(t, d, pgstore.Config{LockTimeout: time.Second})
	raceOneKey(t, st, d.Admin, effectsTable(t, d.Admin, d.Schema))
}

// TestDistributedNextOffsetBounded (issue 25, item 8c): in distributed mode
// a read can wait for a concurrent writer (CockroachDB's reads wait on an
// uncommitted write's intent; here a lock of the offsets table stands in
// for it). NextOffset's wait is bounded as a claim's is: it fails with
// dedup.ErrInFlight after LockTimeout, and leaves statement_timeout as it
// found it for the rest of the transaction.
func TestDistributedNextOffsetBounded(t *testing.T) {
	d := testenv.NewDistributed(t)
	st := distributedStore(t, d, pgstore.Config{LockTimeout: 200 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	p := dedup.Partition{Scope: "orders", Topic: "t", Partition: 0}
	if err := st.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		_, err := st.AdvanceOffset(ctx, tx, p, 0, 5)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	var timeout string
	if err := st.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		next, err := st.NextOffset(ctx, tx, p)
		if err != nil || next != 5 {
			return fmt.Errorf("NextOffset with nothing in the way: %d, %w", next, err)
		}
		return tx.QueryRow(ctx, `SHOW statement_timeout`).Scan(&timeout)
	}); err != nil {
		t.Fatal(err)
	}
	if timeout != "0" {
		t.Fatalf("statement_timeout after NextOffset: %q, want it restored to 0", timeout)
	}

	holder, err := d.Admin.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(context.Background())
	if _, err := holder.Exec(ctx, `LOCK TABLE `+st.OffsetsTable()+` IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	err = st.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		_, err := st.NextOffset(ctx, tx, p)
		return err
	})
	if !errors.Is(err, dedup.ErrInFlight) {
		t.Fatalf("NextOffset behind a writer: %v, want dedup.ErrInFlight after the lock timeout", err)
	}
}
