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
package pgstore

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/dedup"
)

// Config configures a Store. Zero values take the defaults.
type Config struct {
	// Schema holds the table; default "public". Created by Migrate.
	Schema string
	// Table is the dedup table's name; default "idem_dedup". Schema and
	// Table must match [a-z_][a-z0-9_]* and be at most 48 bytes.
	Table string
	// LockTimeout bounds the wait on a key another transaction holds
	// uncommitted; default 5s.
	LockTimeout time.Duration
	// Retention is how long a row is kept; default 0: forever. Payments want
	// forever or months; a queue's redelivery window is minutes.
	Retention time.Duration
	// ScopeRetention overrides Retention for the scopes it names (a scope is
	// the consumer's Name, or Name/tenant).
	ScopeRetention map[string]time.Duration
}

// Store is a dedup.Store[pgx.Tx] on a pgx pool. Safe for concurrent use.
type Store struct {
	pool  *pgxpool.Pool
	cfg   Config
	table string // sanitized schema.table

	lockTimeout string
	insertSQL   string
	selectSQL   string
	failSQL     string
	purgeSQL    string
}

var identRE = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,47}$`)

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
	if !identRE.MatchString(cfg.Schema) {
		return nil, fmt.Errorf("pgstore: Config.Schema %q: want [a-z_][a-z0-9_]*, at most 48 bytes", cfg.Schema)
	}
	if !identRE.MatchString(cfg.Table) {
		return nil, fmt.Errorf("pgstore: Config.Table %q: want [a-z_][a-z0-9_]*, at most 48 bytes", cfg.Table)
	}
	if cfg.LockTimeout < 0 || cfg.Retention < 0 {
		return nil, errors.New("pgstore: Config.LockTimeout and Config.Retention must not be negative")
	}
	for scope, d := range cfg.ScopeRetention {
		if d < 0 {
			return nil, fmt.Errorf("pgstore: Config.ScopeRetention[%q] is negative", scope)
		}
	}
	if cfg.LockTimeout == 0 {
		cfg.LockTimeout = 5 * time.Second
	}
	t := pgx.Identifier{cfg.Schema, cfg.Table}.Sanitize()
	return &Store{
		pool:        pool,
		cfg:         cfg,
		table:       t,
		lockTimeout: strconv.FormatInt(cfg.LockTimeout.Milliseconds(), 10) + "ms",
		insertSQL: `INSERT INTO ` + t + ` (scope, key, fingerprint, source, expires_at)
SELECT u.s, u.k, u.f, u.src, CASE WHEN u.r < 0 THEN NULL ELSE now() + u.r * interval '1 millisecond' END
FROM unnest($1::text[], $2::text[], $3::bytea[], $4::text[], $5::bigint[]) AS u(s, k, f, src, r)
ON CONFLICT (scope, key) DO NOTHING
RETURNING scope, key`,
		selectSQL: `SELECT t.scope, t.key, t.fingerprint, t.outcome, coalesce(t.reason, '')
FROM unnest($1::text[], $2::text[]) AS u(s, k)
JOIN ` + t + ` t ON t.scope = u.s AND t.key = u.k`,
		failSQL: `INSERT INTO ` + t + ` (scope, key, fingerprint, source, outcome, reason, expires_at)
VALUES ($1, $2, $3, $4, 'failed', $5, CASE WHEN $6::bigint < 0 THEN NULL ELSE now() + $6::bigint * interval '1 millisecond' END)
ON CONFLICT (scope, key) DO NOTHING`,
		purgeSQL: `DELETE FROM ` + t + ` WHERE ctid IN (
SELECT ctid FROM ` + t + ` WHERE expires_at < now() LIMIT $1 FOR UPDATE SKIP LOCKED)`,
	}, nil
}

// Table returns the sanitized, schema-qualified table name.
func (s *Store) Table() string { return s.table }

// InTx runs fn in a READ COMMITTED transaction; see dedup.Store.
func (s *Store) InTx(ctx context.Context, fn func(ctx context.Context, tx pgx.Tx) error) error {
	return pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
		if err := fn(ctx, tx); err != nil {
			return err
		}
		return ctx.Err() // never commit work whose caller gave up
	})
}

// retentionMillis returns the retention of scope in ms, -1 for forever.
func (s *Store) retentionMillis(scope string) int64 {
	d := s.cfg.Retention
	if r, ok := s.cfg.ScopeRetention[scope]; ok {
		d = r
	}
	if d <= 0 {
		return -1
	}
	return d.Milliseconds()
}

// Claim claims keys in tx with one INSERT … ON CONFLICT DO NOTHING; see
// dedup.Store. Keys that were not inserted are looked up in a second
// statement, which sees rows committed while the insert waited.
func (s *Store) Claim(ctx context.Context, tx pgx.Tx, claims []dedup.Claim, results []dedup.Result) error {
	n := len(claims)
	if len(results) < n {
		return fmt.Errorf("pgstore: %d results for %d claims", len(results), n)
	}
	if n == 0 {
		return nil
	}
	scopes, keys := make([]string, n), make([]string, n)
	fps, srcs, rets := make([][]byte, n), make([]string, n), make([]int64, n)
	for i := range claims {
		c := &claims[i]
		scopes[i], keys[i], fps[i], srcs[i] = c.Key.Scope, c.Key.ID, c.Fingerprint[:], c.Source
		rets[i] = s.retentionMillis(c.Key.Scope)
	}

	var b pgx.Batch
	b.Queue(`SELECT set_config('lock_timeout', $1, true)`, s.lockTimeout)
	b.Queue(s.insertSQL, scopes, keys, fps, srcs, rets)
	br := tx.SendBatch(ctx, &b)
	if _, err := br.Exec(); err != nil {
		br.Close()
		return s.claimErr(err)
	}
	rows, err := br.Query()
	if err != nil {
		br.Close()
		return s.claimErr(err)
	}
	// first maps each key to the index of its first occurrence; batches of one
	// (the common unbatched case) skip the map.
	var first map[dedup.Key]int
	if n > 1 {
		first = make(map[dedup.Key]int, n)
		for i := n - 1; i >= 0; i-- {
			first[claims[i].Key] = i
		}
	}
	inserted := 0
	var scope, key string
	for rows.Next() {
		if err := rows.Scan(&scope, &key); err != nil {
			rows.Close()
			br.Close()
			return s.claimErr(err)
		}
		i := 0
		if first != nil {
			i = first[dedup.Key{Scope: scope, ID: key}]
		}
		results[i] = dedup.Result{Status: dedup.StatusNew}
		inserted++
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		br.Close()
		return s.claimErr(err)
	}
	if err := br.Close(); err != nil {
		return s.claimErr(err)
	}
	if inserted == n {
		return nil
	}

	// Keys not inserted: repeats within this batch compare with their first
	// occurrence; the rest were committed by others and are looked up.
	var lookS, lookK []string
	for i := range claims {
		if results[i].Status != 0 {
			continue
		}
		if first != nil && first[claims[i].Key] != i {
			continue
		}
		lookS, lookK = append(lookS, claims[i].Key.Scope), append(lookK, claims[i].Key.ID)
	}
	if len(lookS) > 0 {
		rows, err := tx.Query(ctx, s.selectSQL, lookS, lookK)
		if err != nil {
			return s.claimErr(err)
		}
		var fp []byte
		var outcome, reason string
		for rows.Next() {
			if err := rows.Scan(&scope, &key, &fp, &outcome, &reason); err != nil {
				rows.Close()
				return s.claimErr(err)
			}
			i := 0
			if first != nil {
				i = first[dedup.Key{Scope: scope, ID: key}]
			}
			results[i] = existing(claims[i].Fingerprint, fp, outcome, reason)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return s.claimErr(err)
		}
	}
	for i := range claims {
		if results[i].Status != 0 {
			continue
		}
		j := 0
		if first != nil {
			j = first[claims[i].Key]
		}
		if j == i {
			// Not inserted and not found: the row was purged under us.
			return fmt.Errorf("%w: key %s vanished during the claim (purged?)", dedup.ErrInFlight, claims[i].Key)
		}
		if claims[j].Fingerprint != claims[i].Fingerprint {
			results[i] = dedup.Result{Status: dedup.StatusMismatch}
		} else if results[j].Status == dedup.StatusFailed {
			results[i] = results[j]
		} else {
			results[i] = dedup.Result{Status: dedup.StatusDuplicate}
		}
	}
	return nil
}

func existing(want dedup.Fingerprint, have []byte, outcome, reason string) dedup.Result {
	if string(have) != string(want[:]) {
		return dedup.Result{Status: dedup.StatusMismatch}
	}
	if outcome == "failed" {
		return dedup.Result{Status: dedup.StatusFailed, Reason: reason}
	}
	return dedup.Result{Status: dedup.StatusDuplicate}
}

// claimErr turns a lock timeout into dedup.ErrInFlight.
func (s *Store) claimErr(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "55P03" {
		return fmt.Errorf("%w (lock_timeout %s): %w", dedup.ErrInFlight, s.lockTimeout, err)
	}
	return fmt.Errorf("pgstore: claim: %w", err)
}

// RecordFailure inserts a 'failed' row in its own transaction; see
// dedup.Store.
func (s *Store) RecordFailure(ctx context.Context, c dedup.Claim, reason string) error {
	_, err := s.pool.Exec(ctx, s.failSQL, c.Key.Scope, c.Key.ID, c.Fingerprint[:], c.Source,
		dedup.ShortReason(reason), s.retentionMillis(c.Key.Scope))
	if err != nil {
		return fmt.Errorf("pgstore: record failure: %w", err)
	}
	return nil
}

// Purge deletes at most limit expired rows (by the database clock), skipping
// rows other transactions hold; see dedup.Store.
func (s *Store) Purge(ctx context.Context, limit int) (int, error) {
	if limit <= 0 {
		return 0, nil
	}
	tag, err := s.pool.Exec(ctx, s.purgeSQL, limit)
	if err != nil {
		return 0, fmt.Errorf("pgstore: purge: %w", err)
	}
	return int(tag.RowsAffected()), nil
}

// ClassifyError classifies Postgres errors by SQLSTATE; see Classify.
func (s *Store) ClassifyError(err error) dedup.ErrorClass { return Classify(err) }

// Classify sorts a Postgres error:
//   - 40001 serialization failure, 40P01 deadlock, 55P03 lock not available,
//     57014 statement timeout: retryable;
//   - 57P01..57P03 (shutdown, cannot connect now), 53300 too many
//     connections, class 08 (connection exceptions), a lost or refused
//     connection: unavailable (waited out, never dead-lettered);
//   - class 23 (integrity constraint violation), class 22 (data exception),
//     and pgx.ErrTxCommitRollback (a COMMIT that became ROLLBACK because a
//     statement failed and the error was swallowed): permanent.
func Classify(err error) dedup.ErrorClass {
	if err == nil {
		return dedup.ClassUnknown
	}
	if errors.Is(err, pgx.ErrTxCommitRollback) {
		return dedup.ClassPermanent
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch code := pgErr.Code; {
		case code == "40001", code == "40P01", code == "55P03", code == "57014":
			return dedup.ClassRetryable
		case code == "57P01", code == "57P02", code == "57P03", code == "53300", code[:2] == "08":
			return dedup.ClassUnavailable
		case code[:2] == "23", code[:2] == "22":
			return dedup.ClassPermanent
		}
		return dedup.ClassUnknown
	}
	var connErr *pgconn.ConnectError
	if errors.As(err, &connErr) || pgconn.SafeToRetry(err) || pgconn.Timeout(err) {
		return dedup.ClassUnavailable
	}
	if errors.Is(err, pgx.ErrTxClosed) || isConnLoss(err) {
		return dedup.ClassUnavailable
	}
	return dedup.ClassUnknown
}

var _ dedup.Store[pgx.Tx] = (*Store)(nil)
