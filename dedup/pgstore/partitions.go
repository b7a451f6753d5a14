package pgstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Partitioned retention (Config.PartitionWidth, docs/partitions.md).
//
// The table is partitioned by range of expires_at, one partition per
// PartitionWidth of expiry times, <table>_p<unix seconds of its lower
// bound>, and one more, <table>_pforever, FROM ('infinity') TO
// (MAXVALUE), for the rows kept for ever (expires_at 'infinity' in this
// mode, NULL in the other). Purge detaches and drops the partitions whose
// upper bound has passed: a day of keys goes with one DROP TABLE instead
// of a DELETE per row.
//
// Postgres makes a unique index of a partitioned table include the
// partition key, so the primary key is (scope, key, expires_at): it does
// not keep a key from having two rows in two partitions. The store does,
// with two steps in every transaction that inserts a key (Claim,
// RecordFailure):
//
//  1. a transaction-scoped advisory lock on a 64-bit hash of (scope, key),
//     seeded with the table's name (lockSeed, the lock the HTTP requests
//     of an unpartitioned table take), in a statement of its own; a batch
//     takes its keys' locks in one statement, in the order of their hashes,
//     so that two batches never wait on each other in a cycle;
//  2. then the INSERT, which inserts a key only where no row of it exists
//     in any partition (NOT EXISTS over the whole table).
//
// Under READ COMMITTED each statement takes a fresh snapshot: an INSERT
// that ran after its lock was granted sees every row committed by the
// transaction that held the lock before (Postgres makes a commit visible
// before it releases the committing transaction's locks). So of two
// transactions claiming one key, the second waits for the first's end and
// then finds its row (a duplicate) or, after a rollback, none (new). The
// wait is bounded by LockTimeout like the wait on the primary key in the
// other mode (SQLSTATE 55P03, dedup.ErrInFlight). Two keys with one hash
// only wait for each other. TestPartitionedRaceAcrossBoundary races
// claims of the same keys written into two partitions.
//
// The partitions ahead: Migrate and Purge keep partitions created up to
// now + the longest retention configured + PartitionsAhead widths, and a
// claim that finds the store's horizon closer than that (a store that
// nobody purged for a while) creates them first, outside its transaction.
// There is no DEFAULT partition: it would have to be scanned by each new
// partition attached and forbids DETACH CONCURRENTLY. A row nonetheless
// beyond the last partition (a retention longer than any store's
// configuration has seen) fails its INSERT with 23514; the claim reports
// it as dedup.ErrInFlight, so the consumer retries after the store has
// created the partitions.

// ErrPartitionedHTTP: RunRequest and AcquireLease of a store with
// Config.PartitionWidth. A request's lease moves its row's expires_at,
// which in this mode moves the row to another partition, and its
// statements rely on a unique (scope, key). Keep HTTP Idempotency-Keys in
// a store without PartitionWidth.
var ErrPartitionedHTTP = errors.New("pgstore: httpidem needs a unique (scope, key), which Config.PartitionWidth does without: keep HTTP Idempotency-Keys in a Store without PartitionWidth")

// partitions is the partitioned mode's state.
type partitions struct {
	width   time.Duration
	ahead   int
	longest time.Duration // the longest finite retention configured
	seed    int64         // lockSeed of the table

	mu      sync.Mutex   // one ensure at a time in this process
	horizon atomic.Int64 // unix nanoseconds: partitions exist up to here; 0 unknown
}

const foreverSuffix = "_pforever"

// lockKeysSQL takes the advisory locks of a claim's keys: $1 scopes, $2
// keys, separated by U+001F (one key: no separator), in the order of their
// hashes.
const lockKeysSQL = `SELECT count(pg_advisory_xact_lock(h)), current_setting('transaction_isolation') FROM (
    SELECT DISTINCT hashtextextended(s || E'\x1f' || k, %d) AS h
    FROM unnest(string_to_array($1::text, E'\x1f'), string_to_array($2::text, E'\x1f')) AS u(s, k)
    ORDER BY 1) AS l`

// newPartitions validates the mode's configuration.
func newPartitions(cfg Config, table string) (*partitions, error) {
	if cfg.PartitionWidth < 0 || cfg.PartitionsAhead < 0 {
		return nil, errors.New("pgstore: Config.PartitionWidth and Config.PartitionsAhead must not be negative")
	}
	if cfg.PartitionWidth == 0 {
		if cfg.PartitionsAhead != 0 {
			return nil, errors.New("pgstore: Config.PartitionsAhead needs Config.PartitionWidth")
		}
		return nil, nil
	}
	if cfg.PartitionWidth < time.Second || cfg.PartitionWidth%time.Second != 0 {
		return nil, fmt.Errorf("pgstore: Config.PartitionWidth %v: want a whole number of seconds", cfg.PartitionWidth)
	}
	if cfg.Distributed {
		return nil, errors.New("pgstore: Config.PartitionWidth with Config.Distributed: the distributed databases partition tables their own way (and lack DETACH CONCURRENTLY)")
	}
	p := &partitions{width: cfg.PartitionWidth, ahead: cfg.PartitionsAhead, longest: cfg.Retention, seed: lockSeed(table)}
	if p.ahead == 0 {
		p.ahead = 2
	}
	for _, d := range cfg.ScopeRetention {
		p.longest = max(p.longest, d)
	}
	return p, nil
}

// partitionsSQL lists the table's partitions: name, upper bound (NULL for
// the forever partition), whether a DETACH CONCURRENTLY of it was
// interrupted, and the database's clock.
const partitionsSQL = `SELECT c.relname::text,
    (regexp_match(pg_get_expr(c.relpartbound, c.oid), 'FROM \(''([^'']*)''\) TO \(''([^'']*)''\)'))[1]::timestamptz,
    (regexp_match(pg_get_expr(c.relpartbound, c.oid), 'FROM \(''([^'']*)''\) TO \(''([^'']*)''\)'))[2]::timestamptz,
    i.inhdetachpending, now()
FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = $1::regclass
ORDER BY 2, 3`

type partition struct {
	name    string
	lower   *time.Time
	upper   *time.Time
	pending bool
}

type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// lower and upper are NULL for the forever partition.
// listPartitions returns the table's partitions and the database's clock.
func (s *Store) listPartitions(ctx context.Context, q querier) ([]partition, time.Time, error) {
	rows, err := q.Query(ctx, partitionsSQL, s.table)
	if err != nil {
		return nil, time.Time{}, err
	}
	defer rows.Close()
	var out []partition
	var now time.Time
	for rows.Next() {
		var p partition
		if err := rows.Scan(&p.name, &p.lower, &p.upper, &p.pending, &now); err != nil {
			return nil, time.Time{}, err
		}
		out = append(out, p)
	}
	if err := rows.Err(); err != nil {
		return nil, time.Time{}, err
	}
	if now.IsZero() { // no partitions; on q: the pool may have no other connection
		err = q.QueryRow(ctx, `SELECT now()`).Scan(&now)
	}
	return out, now, err
}

// partitionName is the name of the partition whose lower bound is lo.
func (s *Store) partitionName(lo time.Time) string {
	return s.cfg.Table + "_p" + strconv.FormatInt(lo.Unix(), 10)
}

func (s *Store) qualified(name string) string { return pgx.Identifier{s.cfg.Schema, name}.Sanitize() }

func bound(t time.Time) string { return "'" + t.UTC().Format("2006-01-02 15:04:05Z07:00") + "'" }

// ensurePartitions creates the partitions missing up to now + the longest
// retention + PartitionsAhead widths, and the forever partition, in one
// transaction under an advisory lock (migrators and purgers of other
// processes alike). Each is created apart and attached: ATTACH PARTITION
// takes a SHARE UPDATE EXCLUSIVE lock of the table, which claims do not
// wait for (CREATE TABLE … PARTITION OF would take an ACCESS EXCLUSIVE
// one).
func (s *Store) ensurePartitions(ctx context.Context) error {
	p := s.part
	p.mu.Lock()
	defer p.mu.Unlock()
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		// Bounded, as a claim's wait: a claim may be waiting for this.
		if _, err := tx.Exec(ctx, `SELECT set_config('lock_timeout', $1, true), pg_advisory_xact_lock($2)`, s.lockTimeout, p.seed+1); err != nil {
			return err
		}
		parts, now, err := s.listPartitions(ctx, tx)
		if err != nil {
			return err
		}
		width := p.width
		want := now.Add(p.longest + time.Duration(p.ahead)*width)
		// From the current bucket on, fill each gap before, between and
		// after the partitions (sorted by bounds) up to want, one width at
		// a time, a last one shorter where a gap ends at a partition.
		fill := func(from, to time.Time) error {
			for lo := from; lo.Before(to); {
				hi := lo.Add(width)
				if hi.After(to) {
					hi = to
				}
				if err := s.attach(ctx, tx, s.partitionName(lo), bound(lo), bound(hi)); err != nil {
					return err
				}
				lo = hi
			}
			return nil
		}
		cursor := now.Truncate(width)
		forever := false
		for _, q := range parts {
			switch {
			case q.upper == nil:
				forever = true
				continue
			case !q.upper.After(cursor):
				continue
			case q.lower.After(cursor) && cursor.Before(want):
				if err := fill(cursor, *q.lower); err != nil {
					return err
				}
			}
			cursor = *q.upper
		}
		lo := cursor
		for !lo.After(want) {
			lo = lo.Add(width)
		}
		if err := fill(cursor, lo); err != nil {
			return err
		}
		if !forever {
			if err := s.attach(ctx, tx, s.cfg.Table+foreverSuffix, "'infinity'", "MAXVALUE"); err != nil {
				return err
			}
		}
		p.horizon.Store(lo.UnixNano())
		return nil
	})
	if err != nil {
		return fmt.Errorf("pgstore: create partitions: %w", err)
	}
	return nil
}

func (s *Store) attach(ctx context.Context, tx pgx.Tx, name, from, to string) error {
	q := s.qualified(name)
	if _, err := tx.Exec(ctx, `CREATE TABLE `+q+` (LIKE `+s.table+` INCLUDING DEFAULTS INCLUDING CONSTRAINTS)`); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, `ALTER TABLE `+s.table+` ATTACH PARTITION `+q+` FOR VALUES FROM (`+from+`) TO (`+to+`)`)
	return err
}

// partitionsReady makes sure, before a claim, that the partitions exist
// for the longest retention from now, by this process's clock with a
// width to spare.
func (s *Store) partitionsReady(ctx context.Context) error {
	p := s.part
	h := p.horizon.Load()
	if h != 0 && time.Now().Add(p.longest+p.width).UnixNano() < h {
		return nil
	}
	err := s.ensurePartitions(ctx)
	if err != nil && h != 0 && time.Now().Add(p.longest).UnixNano() < h {
		return nil // still covered: the next claim or Purge tries again
	}
	return err
}

// checkLayout refuses a table partitioned when the store is not, and the
// reverse.
func (s *Store) checkLayout(ctx context.Context) error {
	var partitioned bool
	if err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_partitioned_table WHERE partrelid = to_regclass($1))`, s.table).Scan(&partitioned); err != nil {
		return fmt.Errorf("pgstore: check: %w", err)
	}
	switch {
	case partitioned && s.part == nil:
		return fmt.Errorf("%w: %s is partitioned (made with PartitionWidth), the store has no PartitionWidth", ErrModeMismatch, s.table)
	case !partitioned && s.part != nil:
		return fmt.Errorf("%w: %s is not partitioned (made without PartitionWidth), the store has PartitionWidth %v: docs/partitions.md says how to move its rows", ErrModeMismatch, s.table, s.part.width)
	}
	return nil
}

// afterMigrate checks the table's layout and, when partitioned, creates
// its partitions.
func (s *Store) afterMigrate(ctx context.Context) error {
	if err := s.checkLayout(ctx); err != nil {
		return err
	}
	if s.part == nil {
		return nil
	}
	return s.ensurePartitions(ctx)
}

// dropExpired detaches (CONCURRENTLY: claims do not wait) and drops the
// partitions whose upper bound is past, and finishes a detach that was
// interrupted. Each is dropped in one transaction with the succeeded and
// failed steps of its keys. It returns the rows they held (counted when
// fewer than countLimit, otherwise the planner's estimate) and the steps.
// One purger at a time: the others skip this step (a session advisory
// lock, tried).
func (s *Store) dropExpired(ctx context.Context) (int, error) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return 0, err
	}
	defer conn.Release()
	var got bool
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, s.part.seed+2).Scan(&got); err != nil {
		return 0, err
	}
	if !got {
		return 0, nil
	}
	defer func() {
		_, _ = conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1)`, s.part.seed+2)
	}()
	parts, now, err := s.listPartitions(ctx, conn)
	if err != nil {
		return 0, err
	}
	total := 0
	for _, p := range parts {
		if p.upper == nil || p.upper.After(now) {
			continue
		}
		q := s.qualified(p.name)
		n, err := countRows(ctx, conn, q)
		if err != nil {
			return total, err
		}
		detach := `ALTER TABLE ` + s.table + ` DETACH PARTITION ` + q + ` CONCURRENTLY`
		if p.pending {
			detach = `ALTER TABLE ` + s.table + ` DETACH PARTITION ` + q + ` FINALIZE`
		}
		if _, err := conn.Exec(ctx, detach); err != nil {
			return total, err
		}
		// The partition's keys take their succeeded and failed steps with
		// them, in one transaction: a step lives as long as its key row.
		err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			tag, err := tx.Exec(ctx, s.dropStepsOf(q))
			if err != nil {
				return err
			}
			n += int(tag.RowsAffected())
			_, err = tx.Exec(ctx, `DROP TABLE `+q)
			return err
		})
		if err != nil {
			return total, err
		}
		total += n
	}
	return total, nil
}

// countLimit: a partition with fewer rows is counted before it is
// dropped; a larger one reports its estimate (pg_class.reltuples, or the
// statistics' live rows when it was never analysed).
const countLimit = 100000

func countRows(ctx context.Context, conn *pgxpool.Conn, q string) (int, error) {
	var n int64
	err := conn.QueryRow(ctx, `SELECT count(*) FROM (SELECT 1 FROM `+q+` LIMIT `+strconv.Itoa(countLimit)+`) AS x`).Scan(&n)
	if err != nil || n < countLimit {
		return int(n), err
	}
	var est float64
	err = conn.QueryRow(ctx, `SELECT greatest(c.reltuples, coalesce(s.n_live_tup, 0), $2)::float8
FROM pg_class c LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid WHERE c.oid = $1::regclass`, q, countLimit).Scan(&est)
	return int(est), err
}

// noPartition reports the INSERT of a row beyond the last partition.
func noPartition(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23514" && pgErr.ConstraintName == ""
}

// foreverSQL is the expires_at of a row kept for ever in this mode.
const foreverSQL = `'infinity'::timestamptz`

// partitionedSQL sets the partitioned mode's statements: the inserts
// insert a key only where no partition holds it (each runs after the key's
// lock, lockSQL), a row kept for ever expires at 'infinity', and the
// purge's DELETE finds rows by primary key (a ctid is a partition's).
func (s *Store) partitionedSQL(t string) {
	s.lockSQL = fmt.Sprintf(lockKeysSQL, s.part.seed)
	absent := func(scope, key string) string {
		return `NOT EXISTS (SELECT 1 FROM ` + t + ` d WHERE d.scope = ` + scope + ` AND d.key = ` + key + `)`
	}
	s.insertSQL = `WITH input AS (` + inputSQL + `),
ins AS (
    INSERT INTO ` + t + ` (scope, key, fingerprint, source, expires_at)
    SELECT s, k, f, src, CASE WHEN r IS NULL THEN ` + foreverSQL + ` ELSE now() + r * interval '1 millisecond' END
    FROM input WHERE ` + absent("input.s", "input.k") + `
    ORDER BY s, k, i
    ON CONFLICT (scope, key, expires_at) DO NOTHING -- the same key twice in the batch
    RETURNING scope, key)
SELECT min(input.i)::int4 FROM input JOIN ins ON ins.scope = input.s AND ins.key = input.k
GROUP BY input.s, input.k`
	s.insertOneSQL = `INSERT INTO ` + t + ` (scope, key, fingerprint, source, expires_at)
SELECT $1::text, $2::text, $3::bytea, $4::text, CASE WHEN $5::bigint < 0 THEN ` + foreverSQL + ` ELSE now() + $5::bigint * interval '1 millisecond' END
WHERE ` + absent("$1::text", "$2::text")
	s.failSQL = `INSERT INTO ` + t + ` (scope, key, fingerprint, source, outcome, reason, expires_at)
SELECT $1::text, $2::text, $3::bytea, $4::text, 'failed', $5::text, CASE WHEN $6::bigint < 0 THEN ` + foreverSQL + ` ELSE now() + $6::bigint * interval '1 millisecond' END
WHERE ` + absent("$1::text", "$2::text")
	s.purgeSQL = `DELETE FROM ` + t + ` WHERE (scope, key, expires_at) IN (
SELECT scope, key, expires_at FROM ` + t + ` WHERE ` + purgeable + ` LIMIT $1 FOR UPDATE SKIP LOCKED)`
}

// purgeLayout refuses, once per store, to purge a partitioned table
// without PartitionWidth (idem purge, say): the plain purge deletes by
// ctid, which a partitioned table repeats in each partition.
func (s *Store) purgeLayout(ctx context.Context) error {
	if s.part != nil || s.cfg.Distributed || s.plainOK.Load() {
		return nil
	}
	if err := s.checkLayout(ctx); err != nil {
		return fmt.Errorf("pgstore: purge: %w", err)
	}
	s.plainOK.Store(true)
	return nil
}
