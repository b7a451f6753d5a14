// Package pgstore is the Postgres dedup.Store, on pgx/v5.
//
// A claim is one set-based statement in the caller's transaction:
//
//	INSERT INTO idem_dedup (scope, key, fingerprint, ...)
//	SELECT ... FROM unnest($1, $2, ...) ON CONFLICT DO NOTHING RETURNING scope, key
//
// A key another transaction has claimed but not committed makes Postgres wait
// on the primary key; that wait is bounded by Config.LockTimeout
// (lock_timeout, SQLSTATE 55P03) and surfaces as dedup.ErrInFlight, which the
// consumer retries. Expiry times come from the database clock (now()).
//
// Config.Distributed adapts the store to CockroachDB and YugabyteDB, which
// lack ctid and (some releases) advisory locks, limit DDL in transactions and
// do not all honour lock_timeout; docs/distributed.md lists the differences
// and how the mode meets each.
//
// Config.PartitionWidth partitions the table by range of expires_at, so
// that Purge drops a partition of expired keys instead of deleting them
// one by one; a key stays unique across partitions through an advisory
// lock per key taken before the claim's INSERT (partitions.go,
// docs/partitions.md).
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

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/internal/retention"
	"github.com/idemkit/idem/internal/storekit/pgerr"
	"github.com/idemkit/idem/internal/storekit/sqlmigrate"
)

// Config configures a Store. Zero values take the defaults.
type Config struct {
	// Schema holds the table; default "public". Created by Migrate.
	Schema string
	// Table is the dedup table's name; default "idem_dedup". Schema and
	// Table must match [a-z_][a-z0-9_]* and be at most 48 bytes.
	Table string
	// LockTimeout bounds the wait on a key another transaction holds
	// uncommitted; default 5s. It is set with SET LOCAL, so it also bounds
	// the handler's own lock waits in the same transaction (55P03,
	// retryable).
	LockTimeout time.Duration
	// Retention is how long a row is kept; default 0: forever. Payments want
	// forever or months; a queue's redelivery window is minutes.
	Retention time.Duration
	// ScopeRetention overrides Retention for the scopes it names (a scope is
	// the consumer's Name, or Name/tenant).
	ScopeRetention map[string]time.Duration
	// Distributed adapts the store to Postgres-wire distributed SQL
	// databases (CockroachDB, YugabyteDB); default false: plain Postgres.
	// docs/distributed.md lists each difference and its source. In this mode the
	// store
	//   - runs InTx under SERIALIZABLE (CockroachDB's default; YugabyteDB
	//     supports it); a serialization failure (40001) or deadlock (40P01)
	//     is a conflict the consumer retries whole;
	//   - gives the table a hash shard column first in its primary key
	//     (shard, scope, key), so that monotonic keys spread over ranges;
	//   - purges by primary key in batches of Purge's limit, and moves
	//     entity watermarks by primary key, without ctid;
	//   - migrates under a lock row with a lease instead of an advisory
	//     lock, one DDL statement per transaction;
	//   - bounds the wait on an in-flight key with statement_timeout set
	//     around the claim's INSERT alone, not lock_timeout (LockTimeout
	//     then bounds the whole INSERT, not only its wait);
	//   - refuses httpidem's RunRequest and AcquireLease
	//     (ErrDistributedHTTP): they need advisory locks.
	// The mode is the table's: Check refuses a table made in the other one.
	Distributed bool
	// PartitionWidth, when set, partitions the table by range of
	// expires_at, one partition per PartitionWidth (a whole number of
	// seconds; a day, a week), and Purge drops the partitions whose time
	// has passed instead of deleting their rows one by one; default 0:
	// one table. docs/partitions.md says how a key stays unique across
	// partitions, what the mode refuses (Distributed, httpidem's
	// requests) and how to move an existing table's rows. Like
	// Distributed, the mode is the table's: Check refuses a table made
	// in the other one.
	PartitionWidth time.Duration
	// PartitionsAhead is how many partitions beyond the longest retention
	// the store keeps created (at Migrate, at each Purge, and before a
	// claim that finds them short); default 2.
	PartitionsAhead int
}

// Store is a dedup.Store[pgx.Tx] on a pgx pool. Safe for concurrent use.
type Store struct {
	pool    *pgxpool.Pool
	cfg     Config
	table   string // sanitized schema.table
	offsets string // sanitized schema.table_offsets: see offsets.go
	offSQL  offsetQueries
	epochs  string // sanitized schema.table_epochs: see epochs.go
	audit   string // sanitized schema.table_audit: see audit.go
	locks   string // sanitized schema.table_locks: see lock.go
	stepTab string // sanitized schema.table_steps: see journal.go
	steps   stepQueries
	// Entity watermarks (entities.go): schema.table_watermarks and
	// schema.table_stale.
	marksTab, staleTab string
	marks              markQueries
	// Parked keys (parking.go): schema.table_parked_keys and
	// schema.table_parked.
	parkKeysTab, parkedTab string
	park                   parkQueries
	part                   *partitions // partitioned mode (partitions.go); nil without
	lockSQL                string      // partitioned mode: the claim's key locks
	plainOK                atomic.Bool // without partitions: the table was found not partitioned

	lockTimeout string
	boundSQL    [3]string // the statements around the claim's INSERT that bound its wait
	insertSQL   string
	lookupSQL   string
	bufs        sync.Pool
	failSQL     string
	purgeSQL    string
	http        httpQueries // http.go

	// One key (claimOne): a plain INSERT … VALUES, and the stored row by
	// primary key.
	insertOneSQL, lookupOneSQL string

	// lostAt is when a transaction of this store last lost its connection
	// or could not get one (monotonic nanoseconds since epoch), 0 when never.
	lostAt atomic.Int64
	epoch  time.Time
}

// New returns a Store on pool. Call Migrate before the first claim.
func New(pool *pgxpool.Pool, cfg Config) (*Store, error) {
	if pool == nil {
		return nil, errors.New("pgstore: pool is nil")
	}
	if cfg.Schema == "" {
		cfg.Schema = "public"
	}
	if cfg.Table == "" {
		cfg.Table = "idem_dedup"
	}
	if err := sqlmigrate.CheckName("pgstore", "Schema", cfg.Schema); err != nil {
		return nil, err
	}
	if err := sqlmigrate.CheckName("pgstore", "Table", cfg.Table); err != nil {
		return nil, err
	}
	if cfg.LockTimeout < 0 || cfg.Retention < 0 {
		return nil, errors.New("pgstore: Config.LockTimeout and Config.Retention must not be negative")
	}
	if err := retention.CheckScopes("pgstore", cfg.ScopeRetention); err != nil {
		return nil, err
	}
	if cfg.LockTimeout == 0 {
		cfg.LockTimeout = 5 * time.Second
	}
	t := pgx.Identifier{cfg.Schema, cfg.Table}.Sanitize()
	part, err := newPartitions(cfg, t)
	if err != nil {
		return nil, err
	}
	st := &Store{
		part:        part,
		pool:        pool,
		cfg:         cfg,
		table:       t,
		lockTimeout: strconv.FormatInt(cfg.LockTimeout.Milliseconds(), 10) + "ms",
	}
	// The primary key, and in distributed mode the shard computed from the
	// key (see shardOf).
	pk, shardCol, shardIns, shardFail, shardJoin := "scope, key", "", "", "", ""
	if cfg.Distributed {
		pk, shardCol = "shard, scope, key", "shard, "
		shardIns = shardOf("s", "k") + ", "
		shardFail = shardOf("$1::text", "$2::text") + ", "
		shardJoin = "t.shard = " + shardOf("input.s", "input.k") + " AND "
	}
	st.insertSQL = `WITH input AS (` + inputSQL + `),
ins AS (
    INSERT INTO ` + t + ` (` + shardCol + `scope, key, fingerprint, source, expires_at)
    SELECT ` + shardIns + `s, k, f, src, CASE WHEN r IS NULL THEN NULL ELSE now() + r * interval '1 millisecond' END
    FROM input ORDER BY s, k, i -- one lock order for every transaction: no claim deadlocks
    ON CONFLICT (` + pk + `) DO NOTHING
    RETURNING scope, key)
SELECT min(input.i)::int4 FROM input JOIN ins ON ins.scope = input.s AND ins.key = input.k
GROUP BY input.s, input.k`
	st.lookupSQL = `WITH input AS (` + inputSQL + `)
SELECT input.i::int4, t.fingerprint = input.f, t.outcome = 'failed', coalesce(t.reason, ''), t.created_at
FROM input JOIN ` + t + ` t ON ` + shardJoin + `t.scope = input.s AND t.key = input.k
WHERE input.i = ANY (string_to_array($6, ',')::int8[])`
	st.insertOneSQL = `INSERT INTO ` + t + ` (` + shardCol + `scope, key, fingerprint, source, expires_at)
VALUES (` + shardFail + `$1, $2, $3, $4, CASE WHEN $5::bigint < 0 THEN NULL ELSE now() + $5::bigint * interval '1 millisecond' END)
ON CONFLICT (` + pk + `) DO NOTHING`
	shardWhere := ""
	if cfg.Distributed {
		shardWhere = "shard = " + shardOf("$1::text", "$2::text") + " AND "
	}
	st.lookupOneSQL = `SELECT fingerprint = $3, outcome = 'failed', coalesce(reason, ''), created_at FROM ` + t + `
WHERE ` + shardWhere + `scope = $1 AND key = $2`
	st.failSQL = `INSERT INTO ` + t + ` (` + shardCol + `scope, key, fingerprint, source, outcome, reason, expires_at)
VALUES (` + shardFail + `$1, $2, $3, $4, 'failed', $5, CASE WHEN $6::bigint < 0 THEN NULL ELSE now() + $6::bigint * interval '1 millisecond' END)
ON CONFLICT (` + pk + `) DO NOTHING`
	if cfg.Distributed {
		// By primary key: CockroachDB and YugabyteDB have no ctid. Without
		// SKIP LOCKED (YugabyteDB refuses it under SERIALIZABLE): a row
		// another transaction holds makes this purge wait or fail with a
		// conflict, and the next call goes on.
		st.purgeSQL = `DELETE FROM ` + t + ` WHERE (shard, scope, key) IN (
SELECT shard, scope, key FROM ` + t + ` WHERE ` + purgeable + ` LIMIT $1)`
		// statement_timeout, saved and restored around the INSERT, so that
		// it bounds the claim's wait and not the handler's statements.
		st.boundSQL = [3]string{
			`SELECT set_config('idem.saved_statement_timeout', current_setting('statement_timeout'), true)`,
			`SELECT set_config('statement_timeout', $1, true)`,
			`SELECT set_config('statement_timeout', current_setting('idem.saved_statement_timeout'), true)`,
		}
	} else {
		st.purgeSQL = `DELETE FROM ` + t + ` WHERE ctid IN (
SELECT ctid FROM ` + t + ` WHERE ` + purgeable + ` LIMIT $1 FOR UPDATE SKIP LOCKED)`
	}
	if part != nil {
		st.partitionedSQL(t) // replaces the inserts and the purge
	}
	st.bufs.New = func() any { return new(claimBuf) }
	st.http = newHTTPQueries(t)
	st.offsets = pgx.Identifier{cfg.Schema, cfg.Table + "_offsets"}.Sanitize()
	st.offSQL = newOffsetQueries(st.offsets)
	st.epochs = pgx.Identifier{cfg.Schema, cfg.Table + "_epochs"}.Sanitize()
	st.audit = pgx.Identifier{cfg.Schema, cfg.Table + "_audit"}.Sanitize()
	st.locks = pgx.Identifier{cfg.Schema, cfg.Table + "_locks"}.Sanitize()
	st.stepTab = pgx.Identifier{cfg.Schema, cfg.Table + "_steps"}.Sanitize()
	st.steps = newStepQueries(st.stepTab)
	st.marksTab = pgx.Identifier{cfg.Schema, cfg.Table + "_watermarks"}.Sanitize()
	st.staleTab = pgx.Identifier{cfg.Schema, cfg.Table + "_stale"}.Sanitize()
	st.marks = newMarkQueries(st.marksTab, st.staleTab, cfg.Distributed)
	st.parkKeysTab = pgx.Identifier{cfg.Schema, cfg.Table + "_parked_keys"}.Sanitize()
	st.parkedTab = pgx.Identifier{cfg.Schema, cfg.Table + "_parked"}.Sanitize()
	st.park = newParkQueries(st.parkKeysTab, st.parkedTab, cfg.Distributed)
	if !cfg.Distributed { // distributed mode has no journal
		st.purgeSQL = purgeWithSteps(st.purgeSQL, st.stepTab)
	}
	st.epoch = time.Now()
	return st, nil
}

// shardCount is the number of hash shards of a distributed-mode table.
const shardCount = 16

// shardOf is the SQL of a key's shard, 0 to shardCount-1: the first hex digit
// of md5(scope, U+001F, key). md5, left and strpos are in Postgres,
// CockroachDB and YugabyteDB alike (hashtext is not in CockroachDB), and
// the value is computed in each INSERT rather than by a generated column,
// which older YugabyteDB releases lack.
func shardOf(scope, key string) string {
	return `(strpos('0123456789abcdef', left(md5(` + scope + ` || E'\x1f' || ` + key + `), 1)) - 1)::int2`
}

// Table returns the sanitized, schema-qualified table name.
func (s *Store) Table() string { return s.table }

// InTx runs fn in a transaction of the database's default isolation (READ
// COMMITTED on Postgres), or SERIALIZABLE in distributed mode; see
// dedup.Store.
//
// When the transaction fails because its connection died (or no connection
// could be had), the error is wrapped in a *dedup.ConnLostError, which
// ClassifyError reports as dedup.ClassUnavailable: the consumer waits the database out
// instead of blaming the message. Other errors, the handler's included, are
// returned as they are.
//
// A context error while ctx itself is live — a deadline or cancellation fn
// derived (consumer.Timeout), which pgx enforces by closing the connection —
// is ambiguous: the handler overran, or its statement hung because the
// database went away. It is the database's failure (a lost connection) when
// another transaction of this store lost its connection while this one ran,
// or when the database does not answer a ping within pingTimeout. Only when
// neither holds is it returned as the handler's own error, counted against
// the message. The first rule keeps the verdict from depending on timing: an
// outage that ended before the ping still shows in the connections it broke.
func (s *Store) InTx(ctx context.Context, fn func(ctx context.Context, tx pgx.Tx) error) (err error) {
	began := s.now()
	var opts pgx.TxOptions
	if s.cfg.Distributed {
		opts.IsoLevel = pgx.Serializable
	}
	if s.part != nil {
		opts.IsoLevel = pgx.ReadCommitted // whatever the database's default: ErrPartitionedIsolation
	}
	// The connection is held until the deferred function is done with it:
	// a pool transaction hands its connection back to the pool in Commit,
	// also a failed one (40001 at COMMIT under SERIALIZABLE), and asking it
	// then whether it is closed would read another transaction's connection.
	pc, err := s.pool.Acquire(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return err
		}
		s.markLost()
		return connLost(err)
	}
	tx, err := pc.BeginTx(ctx, opts)
	if err != nil {
		pc.Release() // destroyed by the pool when broken
		if ctx.Err() != nil {
			return err
		}
		s.markLost()
		return connLost(err)
	}
	defer func() {
		// Always: also when fn panicked or called runtime.Goexit (t.Fatal);
		// a no-op after COMMIT; closes a broken connection.
		closed := err != nil && pc.Conn().IsClosed()
		_ = tx.Rollback(ctx)
		pc.Release()
		if !closed || ctx.Err() != nil {
			return
		}
		switch {
		case !isContextErr(err):
			s.markLost() // direct evidence: the connection died under the statement
			err = connLost(err)
		case s.lostSince(began) || !s.answers(ctx):
			// Evidence from elsewhere (answers marks a failed ping). Not
			// marked again: a verdict is no evidence, and marking it would
			// let overrunning handlers excuse each other for ever.
			err = connLost(err)
		}
	}()
	if err = fn(ctx, tx); err != nil {
		return txEnded(err)
	}
	if err = ctx.Err(); err != nil {
		return err // never commit work whose caller gave up
	}
	return txEnded(tx.Commit(ctx))
}

// txEnded names the mistake behind pgx.ErrTxClosed: the handler committed
// or rolled back the transaction the consumer owns.
func txEnded(err error) error {
	if errors.Is(err, pgx.ErrTxClosed) {
		return fmt.Errorf("%w (commit and rollback are the consumer's): %w", dedup.ErrTxEnded, err)
	}
	return err
}

// Check reports whether the table is migrated to this version of the store;
// see dedup.Store.
func (s *Store) Check(ctx context.Context) error {
	ms, err := s.migrations()
	if err != nil {
		return err
	}
	versions := pgx.Identifier{s.cfg.Schema, "idem_schema_migrations"}.Sanitize()
	var have int32
	var table *string
	var sharded bool
	err = s.pool.QueryRow(ctx, `SELECT coalesce((SELECT max(version) FROM `+versions+` WHERE table_name = $1), 0), to_regclass($2)::text,
    EXISTS (SELECT 1 FROM information_schema.columns WHERE table_schema = $3 AND table_name = $1 AND column_name = 'shard')`,
		s.cfg.Table, s.table, s.cfg.Schema).Scan(&have, &table, &sharded)
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == "42P01":
		return fmt.Errorf("%w: pgstore: %s does not exist: call Store.Migrate before Run", dedup.ErrNotMigrated, versions)
	case err != nil:
		var connErr *pgconn.ConnectError
		if ctx.Err() == nil && !errors.As(err, &pgErr) && !errors.As(err, &connErr) {
			return connLost(err) // the pool's connection died under the query
		}
		return fmt.Errorf("pgstore: check: %w", err) // ClassifyError reads the SQLSTATE or the failed connect
	case table == nil || int(have) < sqlmigrate.Latest(ms):
		return sqlmigrate.Check("pgstore", s.table, table != nil, int(have), ms, "Store.Migrate before Run")
	case sharded != s.cfg.Distributed:
		return s.mismatch(sharded)
	}
	if s.cfg.Distributed {
		return nil
	}
	return s.checkLayout(ctx)
}

// ErrModeMismatch: the table was made in another mode than the store's
// Config.Distributed or Config.PartitionWidth. The modes' primary keys
// differ; a table does not change mode.
var ErrModeMismatch = errors.New("pgstore: the table and the store's mode disagree")

func (s *Store) mismatch(sharded bool) error {
	if sharded {
		return fmt.Errorf("%w: %s has a shard column (made with Distributed: true), the store has Distributed: false", ErrModeMismatch, s.table)
	}
	return fmt.Errorf("%w: %s has no shard column (made with Distributed: false), the store has Distributed: true", ErrModeMismatch, s.table)
}

func (s *Store) now() int64 { return int64(time.Since(s.epoch)) + 1 }

func (s *Store) markLost() { s.lostAt.Store(s.now()) }

// lostSince reports whether a transaction lost its connection at or after t.
func (s *Store) lostSince(t int64) bool { return s.lostAt.Load() >= t }

// pingTimeout bounds the ping that tells a handler's overrun deadline from a
// database that stopped answering.
const pingTimeout = 5 * time.Second

// answers reports whether the database answers a ping within pingTimeout.
func (s *Store) answers(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, pingTimeout)
	defer cancel()
	if s.pool.Ping(ctx) != nil {
		s.markLost()
		return false
	}
	return true
}

// isContextErr reports a context's deadline or cancellation. pgx's default
// context watcher interrupts a statement by setting a deadline on the socket,
// which closes the connection, and reports ctx's error (DeadlineExceeded
// wrapped in a timeout error, or Canceled). pgconn.Timeout would not do here:
// it is also true of a read that failed with ETIMEDOUT (TCP keepalive or
// tcp_user_timeout giving up on an unreachable server), which is a lost
// connection.
func isContextErr(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)
}

// connLost is a transaction that failed because its connection to Postgres
// was lost or could not be had. When it happened during COMMIT the outcome
// is unknown: the retry's claim finds out.
func connLost(err error) error { return &dedup.ConnLostError{Store: "pgstore", Err: err} }

// purgeable says which rows Purge deletes: expired ones, but never a
// request in processing whose lease runs (see http.go).
const purgeable = `expires_at < now() AND (state IS DISTINCT FROM 'processing' OR lease_expires_at <= now())`

// Purge deletes at most limit expired rows (by the database clock), skipping
// rows other transactions hold and HTTP requests whose lease runs; see
// dedup.Store. With each key row it deletes, in the same statement, the
// effect journal's succeeded and failed steps of that key: a step lives as
// long as its message's key row. A step whose key has no row (its message
// never committed) and an unresolved step are never purged; see
// dedup.Journal. The count returned includes the steps. Within what is
// left of limit it then deletes the entity watermarks untouched, and the
// stale records kept, for longer than their scope's retention (counted
// too): a watermark is forgotten as a key is, and the entity's next event
// applies whatever its version; see dedup.Watermarks.
//
// In partitioned mode (Config.PartitionWidth) it first creates the
// partitions ahead and drops the partitions whose upper bound has passed,
// whole, whatever limit says, each in one transaction with the succeeded
// and failed steps of its keys: the count returned includes their rows
// (estimated for a partition of 100,000 rows or more). Then it deletes at
// most limit expired rows of the partitions still live, as without
// partitions.
func (s *Store) Purge(ctx context.Context, limit int) (int, error) {
	if limit <= 0 {
		return 0, nil
	}
	dropped := 0
	if err := s.purgeLayout(ctx); err != nil {
		return 0, err
	}
	if s.part != nil {
		if err := s.ensurePartitions(ctx); err != nil {
			return 0, err
		}
		n, err := s.dropExpired(ctx)
		if err != nil {
			return n, fmt.Errorf("pgstore: purge: drop partitions: %w", err)
		}
		dropped = n
	}
	if s.cfg.Distributed {
		tag, err := s.pool.Exec(ctx, s.purgeSQL, limit)
		if err != nil {
			return dropped, fmt.Errorf("pgstore: purge: %w", err)
		}
		m, err := s.purgeEntities(ctx, limit-int(tag.RowsAffected()))
		return dropped + int(tag.RowsAffected()) + m, err
	}
	var n int64
	if err := s.pool.QueryRow(ctx, s.purgeSQL, limit).Scan(&n); err != nil {
		return dropped, fmt.Errorf("pgstore: purge: %w", err)
	}
	m, err := s.purgeEntities(ctx, limit-int(n))
	return dropped + int(n) + m, err
}

// ClassifyError classifies Postgres errors by SQLSTATE (see
// internal/storekit/pgerr: conflicts, unavailability, permanent and fatal codes), a
// *dedup.ConnLostError as dedup.ClassUnavailable, and ErrDistributedHTTP,
// ErrDistributedJournal, ErrPartitionedHTTP, ErrPartitionedIsolation and ErrModeMismatch as
// dedup.ClassFatal.
func (s *Store) ClassifyError(err error) dedup.ErrorClass {
	if errors.Is(err, ErrDistributedHTTP) || errors.Is(err, ErrDistributedJournal) || errors.Is(err, ErrPartitionedHTTP) || errors.Is(err, ErrPartitionedIsolation) || errors.Is(err, ErrModeMismatch) {
		return dedup.ClassFatal
	}
	return pgerr.Classify(err)
}

var _ dedup.Store[pgx.Tx] = (*Store)(nil)
