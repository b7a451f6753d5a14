package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/deduptest"
	"github.com/idemkit/idem/dedup/pgstore"
	"github.com/idemkit/idem/internal/testenv"
)

// partitionedStore is newStore in partitioned mode, one partition a day
// unless cfg says otherwise. It waits out the last minute of a day (UTC)
// first: a test whose rows expire in the current partition expects them
// to be deleted one by one, which a partition dropped at midnight would
// not say.
func partitionedStore(t *testing.T, cfg pgstore.Config) *pgstore.Store {
	t.Helper()
	if cfg.PartitionWidth == 0 {
		cfg.PartitionWidth = 24 * time.Hour
	}
	for {
		next := time.Now().Truncate(cfg.PartitionWidth).Add(cfg.PartitionWidth)
		if time.Until(next) > time.Minute || cfg.PartitionWidth < time.Hour {
			break
		}
		time.Sleep(time.Until(next) + time.Second)
	}
	return newStore(t, cfg)
}

func TestPartitionedConformance(t *testing.T) {
	deduptest.Run(t, func(t *testing.T, cfg deduptest.Config) dedup.Store[pgx.Tx] {
		return partitionedStore(t, pgstore.Config{LockTimeout: cfg.LockTimeout, ScopeRetention: cfg.ScopeRetention})
	})
}

func TestPartitionedAdmin(t *testing.T) {
	deduptest.RunAdmin(t, func(t *testing.T) (dedup.Store[pgx.Tx], dedup.Admin) {
		st := partitionedStore(t, pgstore.Config{ScopeRetention: map[string]time.Duration{"hour": time.Hour}})
		return st, st.Admin()
	})
}

func TestPartitionedOffsetsConformance(t *testing.T) {
	deduptest.RunOffsets(t, func(t *testing.T, lockTimeout time.Duration) deduptest.OffsetStore[pgx.Tx] {
		return partitionedStore(t, pgstore.Config{LockTimeout: lockTimeout})
	})
}

// partitionOf returns the partition that holds each row of scope, by key.
func partitionOf(t *testing.T, st *pgstore.Store, scope string) map[string][]string {
	t.Helper()
	rows, err := testenv.Pool(t).Query(context.Background(), `SELECT key, tableoid::regclass::text FROM `+st.Table()+` WHERE scope = $1`, scope)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	var key, part string
	if _, err := pgx.ForEachRow(rows, []any{&key, &part}, func() error {
		out[key] = append(out[key], part)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestPartitionedRaceAcrossBoundary: eight claimers race for the same keys
// through two stores of one table whose retentions put a key's row in two
// different partitions (two hours apart, partitions of an hour), in batches
// of random order and size (one key: the single-key path) and through
// RecordFailure. Each key is new to exactly one claimer and has exactly
// one row: the primary key (scope, key, expires_at) would take both rows;
// the key's advisory lock and the look across partitions keep the second
// out.
func TestPartitionedRaceAcrossBoundary(t *testing.T) {
	short := partitionedStore(t, pgstore.Config{PartitionWidth: time.Hour, Retention: time.Hour})
	schema := strings.Trim(strings.Split(short.Table(), ".")[0], `"`)
	long, err := pgstore.New(testenv.Pool(t), pgstore.Config{Schema: schema, PartitionWidth: time.Hour, Retention: 3 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := long.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	const keys, claimers, rounds = 200, 8, 6
	var mu sync.Mutex
	news := map[string]int{}
	var wg sync.WaitGroup
	errs := make(chan error, claimers)
	for g := range claimers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 29))
			st := short
			if g%2 == 1 {
				st = long
			}
			for range rounds {
				order := rng.Perm(keys)
				for len(order) > 0 {
					n := min(len(order), 1+rng.IntN(40))
					if rng.IntN(4) == 0 {
						n = 1
					}
					cs := make([]dedup.Claim, n)
					for i, k := range order[:n] {
						cs[i] = deduptest.Claim("race", fmt.Sprintf("key-%03d", k), "p")
					}
					order = order[n:]
					if rng.IntN(20) == 0 {
						if err := st.RecordFailure(ctx, cs[0], "raced"); err != nil {
							errs <- err
							return
						}
						continue
					}
					res, err := claimOnce(ctx, st, cs...)
					if errors.Is(err, dedup.ErrInFlight) {
						continue // a lock wait ran out: the consumer would retry
					}
					if err != nil {
						errs <- err
						return
					}
					mu.Lock()
					for i, r := range res {
						if r.Status == dedup.StatusNew {
							news[cs[i].Key.ID]++
						}
					}
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	parts := partitionOf(t, short, "race")
	used := map[string]bool{}
	for k := 0; k < keys; k++ {
		id := fmt.Sprintf("key-%03d", k)
		if len(parts[id]) != 1 || news[id] > 1 {
			t.Errorf("key %s: new to %d claimers, rows in %v", id, news[id], parts[id])
		}
		for _, p := range parts[id] {
			used[p] = true
		}
	}
	if len(used) < 2 {
		t.Fatalf("the keys' rows are all in %v: the race did not cross a partition boundary", used)
	}
}

// TestPartitionedPurgeDropsPartitions: partitions of a second, rows of a
// second (and one kept for ever). Once the upper bound of the rows'
// partition has passed, one Purge of limit 1 drops it with its 50 rows;
// their keys are new again, the row kept for ever stays, and the
// partitions ahead too. Rows that expire in a partition still live are
// deleted one by one, as without partitions.
func TestPartitionedPurgeDropsPartitions(t *testing.T) {
	st := partitionedStore(t, pgstore.Config{PartitionWidth: time.Second, Retention: time.Second,
		ScopeRetention: map[string]time.Duration{"kept": 0, "brief": time.Millisecond}})
	ctx := context.Background()
	pool := testenv.Pool(t)
	var cs []dedup.Claim
	for i := range 50 {
		cs = append(cs, deduptest.Claim("s", fmt.Sprint("k", i), "p"))
	}
	res, err := claimOnce(ctx, st, append(cs, deduptest.Claim("kept", "k0", "p"))...)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if r.Status != dedup.StatusNew {
			t.Fatalf("claim %d: %v", i, r.Status)
		}
	}
	var part string
	if err := pool.QueryRow(ctx, `SELECT DISTINCT tableoid::regclass::text FROM `+st.Table()+` WHERE scope = 's'`).Scan(&part); err != nil {
		t.Fatal(err)
	}
	testenv.WaitUntil(t, 30*time.Second, "the partition's upper bound passed", func() bool {
		var past bool
		err := pool.QueryRow(ctx, `SELECT (regexp_match(pg_get_expr(relpartbound, oid), 'TO \(''([^'']*)''\)'))[1]::timestamptz <= now()
FROM pg_class WHERE oid = $1::regclass`, part).Scan(&past)
		if err != nil {
			t.Fatal(err)
		}
		return past
	})
	if n, err := st.Purge(ctx, 1); err != nil || n != 50 {
		t.Fatalf("Purge(1) once the partition expired: %d, %v: want its 50 rows dropped", n, err)
	}
	var gone bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NULL`, part).Scan(&gone); err != nil || !gone {
		t.Errorf("partition %s still there (%v) after Purge", part, err)
	}
	var ahead int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = $1::regclass AND pg_get_expr(c.relpartbound, c.oid) NOT LIKE '%MAXVALUE%'`, st.Table()).Scan(&ahead); err != nil || ahead < 2 {
		t.Errorf("%d partitions of a second left, want those ahead (%v)", ahead, err)
	}
	res, err = claimOnce(ctx, st, cs[0], deduptest.Claim("kept", "k0", "p"), deduptest.Claim("brief", "b", "p"))
	if err != nil || res[0].Status != dedup.StatusNew || res[1].Status != dedup.StatusDuplicate {
		t.Fatalf("after the purge: %v, %v: want the purged key new, the kept one a duplicate", res, err)
	}
	// The brief row expires a millisecond later, in a live partition.
	testenv.WaitUntil(t, 30*time.Second, "the brief row deleted", func() bool {
		if _, err := st.Purge(ctx, 1); err != nil {
			t.Fatal(err)
		}
		var left int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+st.Table()+` WHERE scope = 'brief'`).Scan(&left); err != nil {
			t.Fatal(err)
		}
		return left == 0
	})
}

// TestPartitionedClaimBeyondPartitions: a store whose retention reaches past
// the partitions another store made creates them before its claim, and a
// claim whose partition went missing after that (dropped by hand here) is
// in flight, not failed: the store creates the partition, and the retry
// claims the key.
func TestPartitionedClaimBeyondPartitions(t *testing.T) {
	short := partitionedStore(t, pgstore.Config{PartitionWidth: time.Hour, Retention: time.Hour})
	schema := strings.Trim(strings.Split(short.Table(), ".")[0], `"`)
	long, err := pgstore.New(testenv.Pool(t), pgstore.Config{Schema: schema, PartitionWidth: time.Hour, Retention: 30 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	res, err := claimOnce(ctx, long, deduptest.Claim("s", "a", "p"))
	if err != nil || res[0].Status != dedup.StatusNew {
		t.Fatalf("claim 30 hours ahead of the partitions: %v, %v", res, err)
	}
	pool := testenv.Pool(t)
	var part string
	if err := pool.QueryRow(ctx, `SELECT tableoid::regclass::text FROM `+short.Table()+` WHERE key = 'a'`).Scan(&part); err != nil {
		t.Fatal(err)
	}
	var later string
	if err := pool.QueryRow(ctx, `SELECT c.oid::regclass::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = $1::regclass AND c.relname > $2 AND c.relname NOT LIKE '%forever' ORDER BY c.relname LIMIT 1`, short.Table(), strings.Split(part, ".")[1]).Scan(&later); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `DROP TABLE `+later+`; DROP TABLE `+part); err != nil {
		t.Fatal(err)
	}
	_, err = claimOnce(ctx, long, deduptest.Claim("s", "b", "p"), deduptest.Claim("s", "c", "p"))
	if !errors.Is(err, dedup.ErrInFlight) || long.ClassifyError(err) == dedup.ClassPermanent {
		t.Fatalf("claim into a dropped partition: %v (%v), want dedup.ErrInFlight", err, long.ClassifyError(err))
	}
	res, err = claimOnce(ctx, long, deduptest.Claim("s", "b", "p"), deduptest.Claim("s", "c", "p"))
	if err != nil || res[0].Status != dedup.StatusNew || res[1].Status != dedup.StatusNew {
		t.Fatalf("the retry: %v, %v", res, err)
	}
}

// TestPartitionedRefusals: the mode refuses Distributed, widths that are
// not whole seconds, httpidem's requests, a claim in a transaction that is
// not READ COMMITTED, and a table of the other layout.
func TestPartitionedRefusals(t *testing.T) {
	pool := testenv.Pool(t)
	for _, cfg := range []pgstore.Config{
		{PartitionWidth: time.Hour, Distributed: true},
		{PartitionWidth: 1500 * time.Millisecond},
		{PartitionWidth: -time.Hour},
		{PartitionsAhead: 3},
	} {
		if _, err := pgstore.New(pool, cfg); err == nil || !strings.Contains(err.Error(), "Config.Partition") {
			t.Errorf("New(%+v): %v, want an error naming the field", cfg, err)
		}
	}
	st := partitionedStore(t, pgstore.Config{})
	ctx := context.Background()
	c := deduptest.Claim("http", "k", "p")
	if _, err := st.RunRequest(ctx, c, time.Hour, nil); !errors.Is(err, pgstore.ErrPartitionedHTTP) || st.ClassifyError(err) != dedup.ClassFatal {
		t.Errorf("RunRequest: %v", err)
	}
	if _, err := st.AcquireLease(ctx, c, time.Hour, time.Minute); !errors.Is(err, pgstore.ErrPartitionedHTTP) {
		t.Errorf("AcquireLease: %v", err)
	}
	err := pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead}, func(tx pgx.Tx) error {
		return st.Claim(ctx, tx, []dedup.Claim{c}, make([]dedup.Result, 1))
	})
	if !errors.Is(err, pgstore.ErrPartitionedIsolation) || st.ClassifyError(err) != dedup.ClassFatal {
		t.Errorf("a claim under REPEATABLE READ: %v", err)
	}
	schema := strings.Trim(strings.Split(st.Table(), ".")[0], `"`)
	plain, err := pgstore.New(pool, pgstore.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := plain.Check(ctx); !errors.Is(err, pgstore.ErrModeMismatch) {
		t.Errorf("Check of a partitioned table without PartitionWidth: %v", err)
	}
	if err := plain.Migrate(ctx); !errors.Is(err, pgstore.ErrModeMismatch) {
		t.Errorf("Migrate of a partitioned table without PartitionWidth: %v", err)
	}
	unpart := newStore(t, pgstore.Config{})
	schema = strings.Trim(strings.Split(unpart.Table(), ".")[0], `"`)
	part, err := pgstore.New(pool, pgstore.Config{Schema: schema, PartitionWidth: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := part.Check(ctx); !errors.Is(err, pgstore.ErrModeMismatch) || !strings.Contains(err.Error(), "docs/partitions.md") {
		t.Errorf("Check of a plain table with PartitionWidth: %v", err)
	}
}

// moveSQL is docs/partitions.md's move of a table's rows into a
// partitioned one, steps 2 and 4, with the schema public replaced.
const (
	moveAsideSQL = `CREATE SCHEMA idem_old;
ALTER TABLE public.idem_dedup SET SCHEMA idem_old;
DELETE FROM public.idem_schema_migrations WHERE table_name = 'idem_dedup' AND version IN (1, 2);`
	moveRowsSQL = `INSERT INTO public.idem_dedup (scope, key, fingerprint, outcome, reason, source, created_at, expires_at)
SELECT scope, key, fingerprint, outcome, reason, source, created_at, coalesce(expires_at, 'infinity')
FROM idem_old.idem_dedup
WHERE expires_at IS NULL OR expires_at > now();`
)

// TestPartitionedMoveFromPlainTable runs docs/partitions.md's steps on a
// table with a key kept for ever, one for an hour, a failed one and an
// expired one: after them, the partitioned store knows the first three as
// they were and the expired key is new.
func TestPartitionedMoveFromPlainTable(t *testing.T) {
	pool := testenv.Pool(t)
	schema := testenv.Schema(t, pool)
	ctx := context.Background()
	plain, err := pgstore.New(pool, pgstore.Config{Schema: schema, ScopeRetention: map[string]time.Duration{"hour": time.Hour, "brief": time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	if err := plain.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	keys := []dedup.Claim{deduptest.Claim("forever", "a", "p"), deduptest.Claim("hour", "b", "p"), deduptest.Claim("brief", "c", "p")}
	if _, err := claimOnce(ctx, plain, keys...); err != nil {
		t.Fatal(err)
	}
	failed := deduptest.Claim("hour", "f", "p")
	if err := plain.RecordFailure(ctx, failed, "account closed"); err != nil {
		t.Fatal(err)
	}
	old := "t_old_" + schema[2:]
	in := func(sql string) string {
		sql = strings.ReplaceAll(sql, "public.", `"`+schema+`".`)
		return strings.ReplaceAll(strings.ReplaceAll(sql, "idem_old.", old+"."), "SCHEMA idem_old", "SCHEMA "+old)
	}
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+old+` CASCADE`) })
	if _, err := pool.Exec(ctx, in(moveAsideSQL)); err != nil {
		t.Fatal(err)
	}
	part, err := pgstore.New(pool, pgstore.Config{Schema: schema, PartitionWidth: time.Hour, ScopeRetention: map[string]time.Duration{"hour": time.Hour, "brief": time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	if err := part.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, in(moveRowsSQL)); err != nil {
		t.Fatal(err)
	}
	if err := part.Check(ctx); err != nil {
		t.Fatal(err)
	}
	all := append(keys, failed)
	res, err := claimOnce(ctx, part, all...)
	if err != nil {
		t.Fatal(err)
	}
	want := []dedup.Status{dedup.StatusDuplicate, dedup.StatusDuplicate, dedup.StatusNew, dedup.StatusFailed}
	for i, r := range res {
		if r.Status != want[i] {
			t.Errorf("%s after the move: %v, want %v", all[i].Key, r.Status, want[i])
		}
	}
}

// partitionedEngine names TestPartitionedEngine, under which effectsRig
// makes its stores partitioned.
const partitionedEngine = "TestPartitionedEngine"

// TestPartitionedEngine runs the consumer's tests on the store in
// partitioned mode: effectively once under redelivery and concurrency,
// failed outcomes, redriven copies (lineage and release), and offsets in
// the store with message-ID and business keys.
func TestPartitionedEngine(t *testing.T) {
	for name, test := range map[string]func(*testing.T){
		"ThousandMessagesDeliveredManyTimesApplyOnce": TestThousandMessagesDeliveredManyTimesApplyOnce,
		"HundredConcurrentDeliveriesOfOneKey":         TestHundredConcurrentDeliveriesOfOneKey,
		"ConstraintViolationSwallowedByHandler":       TestConstraintViolationSwallowedByHandler,
		"RedrivenCopiesApplyOnce":                     TestRedrivenCopiesApplyOnce,
		"OffsetsRedeliveriesAndLostAcksApplyOnce":     TestOffsetsRedeliveriesAndLostAcksApplyOnce,
		"OffsetsWithBusinessKeys":                     TestOffsetsWithBusinessKeys,
		"OffsetsDeadLetterAdvances":                   TestOffsetsDeadLetterAdvances,
		"OffsetsHeldBackAtARefusedMessage":            TestOffsetsHeldBackAtARefusedMessage,
	} {
		t.Run(name, test)
	}
}

// TestPurgeRefusesAPartitionedTableWithoutWidth: a store without
// PartitionWidth (the idem command's) refuses to purge a partitioned
// table, whose ctids repeat across partitions, and leaves its rows.
func TestPurgeRefusesAPartitionedTableWithoutWidth(t *testing.T) {
	st := partitionedStore(t, pgstore.Config{ScopeRetention: map[string]time.Duration{"brief": time.Millisecond}})
	ctx := context.Background()
	if _, err := claimOnce(ctx, st, deduptest.Claim("brief", "a", "p"), deduptest.Claim("kept", "b", "p")); err != nil {
		t.Fatal(err)
	}
	schema := strings.Trim(strings.Split(st.Table(), ".")[0], `"`)
	plain, err := pgstore.New(testenv.Pool(t), pgstore.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := plain.Admin().Purge(ctx, 100); !errors.Is(err, pgstore.ErrModeMismatch) || n != 0 {
		t.Fatalf("Purge of a partitioned table without PartitionWidth: %d, %v", n, err)
	}
	var rows int
	if err := testenv.Pool(t).QueryRow(ctx, `SELECT count(*) FROM `+st.Table()).Scan(&rows); err != nil || rows != 2 {
		t.Fatalf("%d rows left (%v), want 2", rows, err)
	}
}

// TestPartitionedMigrateOnOneConnection: Migrate creates the first
// partitions on a pool of one connection (BenchmarkClaim's), which the
// partitions' transaction holds.
func TestPartitionedMigrateOnOneConnection(t *testing.T) {
	cfg, err := pgxpool.ParseConfig(testenv.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	st, err := pgstore.New(pool, pgstore.Config{Schema: testenv.Schema(t, testenv.Pool(t)), PartitionWidth: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Migrate(testenv.Context(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
}

// TestPartitionedPurgeDropsStepsWithTheirKeys (39.8): a partition dropped
// by Purge takes the succeeded step of its committed key with it, in the
// same transaction, and leaves the unknown step of another of its keys and
// the succeeded step of a key that has no row (its message never
// committed), finished before the partition's end.
func TestPartitionedPurgeDropsStepsWithTheirKeys(t *testing.T) {
	st := partitionedStore(t, pgstore.Config{PartitionWidth: time.Second, Retention: time.Second})
	ctx := context.Background()
	pool := testenv.Pool(t)
	if _, err := claimOnce(ctx, st, deduptest.Claim("s", "done", "p"), deduptest.Claim("s", "open", "p")); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		id    string
		state dedup.StepState
	}{{"done", dedup.StepSucceeded}, {"open", dedup.StepUnknown}, {"uncommitted", dedup.StepSucceeded}} {
		ref := deduptest.Step("s", c.id, "call")
		r, err := st.BeginStep(ctx, ref, "pk-"+c.id, dedup.Fingerprint{}, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if err := st.FinishStep(ctx, ref, r.Token, dedup.StepOutcome{State: c.state}); err != nil {
			t.Fatal(err)
		}
	}
	var part string
	var finished time.Time
	if err := pool.QueryRow(ctx, `SELECT DISTINCT tableoid::regclass::text, now() FROM `+st.Table()+` WHERE scope = 's'`).Scan(&part, &finished); err != nil {
		t.Fatal(err)
	}
	testenv.WaitUntil(t, 30*time.Second, "the partition's upper bound and the retention passed", func() bool {
		var past bool
		err := pool.QueryRow(ctx, `SELECT (regexp_match(pg_get_expr(relpartbound, oid), 'TO \(''([^'']*)''\)'))[1]::timestamptz <= now()
    AND now() > $2::timestamptz + interval '1 second'
FROM pg_class WHERE oid = $1::regclass`, part, finished).Scan(&past)
		if err != nil {
			t.Fatal(err)
		}
		return past
	})
	if n, err := st.Purge(ctx, 100); err != nil || n != 3 {
		t.Fatalf("Purge once the partition expired: %d, %v: want its 2 rows and the committed key's step", n, err)
	}
	var gone bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NULL`, part).Scan(&gone); err != nil || !gone {
		t.Fatalf("partition %s still there (%v) after Purge", part, err)
	}
	for id, kept := range map[string]bool{"done": false, "open": true, "uncommitted": true} {
		if _, ok, err := st.Step(ctx, deduptest.Step("s", id, "call")); err != nil || ok != kept {
			t.Errorf("step of key %s after the drop: found %v, %v; want found %v", id, ok, err, kept)
		}
	}
}
