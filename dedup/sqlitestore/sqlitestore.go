// Package sqlitestore is an embedded dedup.Store on SQLite, through the
// pure-Go driver modernc.org/sqlite: no server, no cgo. It serves the
// zero-setup quickstart and single-node consumers.
//
// SQLite has one writer at a time. Transactions begin IMMEDIATE (the DSN
// Open builds sets _txlock=immediate), so a second claim of a key waits for
// the first transaction to finish — at most Config.LockTimeout (SQLite's
// busy_timeout) — and then sees the committed row. Every writer waits so,
// whatever its keys: a wait that runs out surfaces as dedup.ErrStoreBusy
// (the database is busy, not the key known to be in flight), which the
// consumer retries and httpidem answers 503 with Retry-After.
package sqlitestore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"github.com/idemkit/idem/internal/shorten"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/internal/retention"
	"github.com/idemkit/idem/internal/retry"
	"github.com/idemkit/idem/internal/storekit/sqlmigrate"
)

// Config configures a Store. Zero values take the defaults.
type Config struct {
	// Table is the dedup table's name; default "idem_dedup". Must match
	// [a-z_][a-z0-9_]*, at most 48 bytes.
	Table string
	// LockTimeout bounds the wait for the database's write lock; default 5s.
	// Open sets it as busy_timeout.
	LockTimeout time.Duration
	// Synchronous trades durability for speed; default SynchronousFull.
	// Open sets it.
	Synchronous Synchronous
	// Retention is how long a row is kept; default 0: forever.
	Retention time.Duration
	// ScopeRetention overrides Retention for the scopes it names.
	ScopeRetention map[string]time.Duration
}

// Synchronous is SQLite's synchronous setting for a WAL database.
type Synchronous uint8

const (
	// SynchronousFull (the default) syncs the WAL on every COMMIT: a
	// committed transaction survives a power loss or an OS crash.
	SynchronousFull Synchronous = iota
	// SynchronousNormal syncs the WAL only at checkpoints. Faster, and a
	// committed transaction survives a crash of the process, but SQLite
	// documents that after a power loss or an OS crash the most recent
	// transactions can roll back. The broker was acknowledged after those
	// commits, so their messages are lost for good: choose it only where the
	// messages can be replayed from elsewhere (tests, demos, a stream whose
	// producer can re-send from a known point).
	SynchronousNormal
)

// Open opens (creating it when missing) the SQLite database at path with
// the settings a Store with cfg needs: WAL journal, IMMEDIATE transactions,
// a busy timeout of cfg.LockTimeout, and cfg.Synchronous — by default
// synchronous=FULL, so that a transaction that returned from COMMIT
// survives a power loss or an OS crash. The consumer acknowledges the
// broker right after COMMIT: with anything less durable a crash of the
// machine can lose both the effect and the message. Pass the same cfg to
// New.
//
// Open switches the file to WAL before it returns, waiting up to
// cfg.LockTimeout while other processes opening it at the same time hold
// it busy.
func Open(path string, cfg Config) (*sql.DB, error) {
	if err := cfg.normalize(); err != nil {
		return nil, err
	}
	sync := "FULL"
	if cfg.Synchronous == SynchronousNormal {
		sync = "NORMAL"
	}
	q := url.Values{}
	q.Set("_txlock", "immediate")
	q.Add("_pragma", "busy_timeout("+strconv.FormatInt(cfg.LockTimeout.Milliseconds(), 10)+")")
	q.Add("_pragma", "synchronous("+sync+")")
	q.Add("_pragma", "foreign_keys(ON)")
	db, err := sql.Open("sqlite", "file:"+path+"?"+q.Encode())
	if err != nil {
		return nil, fmt.Errorf("sqlitestore: open %s: %w", path, err)
	}
	if err := walMode(db, cfg.LockTimeout); err != nil {
		db.Close()
		return nil, fmt.Errorf("sqlitestore: open %s: %w", path, err)
	}
	return db, nil
}

// walMode switches db to WAL, once: the mode is the file's, so every
// connection opened after it has it. It is not a pragma of each new
// connection because SQLite answers the switch with SQLITE_BUSY at once,
// without waiting busy_timeout, while another connection has the file open
// (several processes opening a new database together, or one pool's
// connections). The switch is tried again on SQLITE_BUSY and SQLITE_LOCKED,
// with jittered exponential backoff, for up to timeout of waiting.
func walMode(db *sql.DB, timeout time.Duration) error {
	wait := retry.Policy{Initial: time.Millisecond, Max: 50 * time.Millisecond, Multiplier: 2, Jitter: 0.5,
		MaxElapsed: timeout, Clock: retry.SystemClock{}}.New()
	for {
		var mode string
		err := db.QueryRow(`PRAGMA journal_mode=WAL`).Scan(&mode)
		switch {
		case err == nil:
			return nil
		case Classify(err) != dedup.ClassConflict:
			return fmt.Errorf("journal_mode=WAL: %w", err)
		}
		if more, _ := wait.Wait(context.Background()); !more {
			return fmt.Errorf("journal_mode=WAL, still busy after %v: %w", timeout, err)
		}
	}
}

// Store is a dedup.Store[*sql.Tx] on SQLite. Safe for concurrent use.
type Store struct {
	db     *sql.DB
	cfg    Config
	table  string
	tokens string   // the counter of lease tokens: see http.go
	locks  sync.Map // name → chan struct{}: Admin.Lock of an in-memory database
}

// normalize validates cfg and fills in its defaults.
func (c *Config) normalize() error {
	if c.Table == "" {
		c.Table = "idem_dedup"
	}
	if err := sqlmigrate.CheckName("sqlitestore", "Table", c.Table); err != nil {
		return err
	}
	if c.LockTimeout < 0 || c.Retention < 0 {
		return errors.New("sqlitestore: Config.LockTimeout and Config.Retention must not be negative")
	}
	if err := retention.CheckScopes("sqlitestore", c.ScopeRetention); err != nil {
		return err
	}
	if c.LockTimeout == 0 {
		c.LockTimeout = 5 * time.Second
	}
	if c.Synchronous != SynchronousFull && c.Synchronous != SynchronousNormal {
		return fmt.Errorf("sqlitestore: Config.Synchronous %d is not SynchronousFull or SynchronousNormal", c.Synchronous)
	}
	return nil
}

// New returns a Store on db, which should come from Open with the same
// cfg. Call Migrate before the first claim.
func New(db *sql.DB, cfg Config) (*Store, error) {
	if db == nil {
		return nil, errors.New("sqlitestore: db is nil")
	}
	if err := cfg.normalize(); err != nil {
		return nil, err
	}
	return &Store{db: db, cfg: cfg, table: `"` + cfg.Table + `"`, tokens: `"` + cfg.Table + `_tokens"`}, nil
}

// Table returns the table's name, quoted, as SQL names it.
func (s *Store) Table() string { return s.table }

// nowMillis is SQLite's clock in Unix milliseconds.
const nowMillis = `CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)`

// InTx runs fn in an IMMEDIATE transaction; see dedup.Store.
func (s *Store) InTx(ctx context.Context, fn func(ctx context.Context, tx *sql.Tx) error) (err error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return s.wrap("begin", err)
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	if err := fn(ctx, tx); err != nil {
		return txEnded(err)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return txEnded(s.wrap("commit", err))
	}
	return nil
}

// txEnded names the mistake behind sql.ErrTxDone: the handler committed or
// rolled back the transaction the consumer owns.
func txEnded(err error) error {
	if errors.Is(err, sql.ErrTxDone) {
		return fmt.Errorf("%w (commit and rollback are the consumer's): %w", dedup.ErrTxEnded, err)
	}
	return err
}

func (s *Store) retentionMillis(scope string) any {
	d, ok := retention.Of(s.cfg.Retention, s.cfg.ScopeRetention, scope)
	if !ok {
		return nil
	}
	return d.Milliseconds()
}

// claimChunk bounds the claims of one statement: five variables each,
// under SQLite's limit of 32766 variables per statement.
const claimChunk = 5000

// Claim claims keys in tx with INSERT … ON CONFLICT DO NOTHING RETURNING,
// one statement per 5,000 claims; see dedup.Store. Every claim not inserted
// is compared with the stored row (which, for a key first claimed earlier in
// the same batch, is that claim's), as the Postgres store does.
func (s *Store) Claim(ctx context.Context, tx *sql.Tx, claims []dedup.Claim, results []dedup.Result) error {
	n := len(claims)
	if len(results) < n {
		return fmt.Errorf("sqlitestore: %d results for %d claims", len(results), n)
	}
	if n == 0 {
		return nil
	}
	clear(results[:n]) // a result left from an earlier batch must not stand
	first := make(map[dedup.Key]int, n)
	for i := n - 1; i >= 0; i-- {
		first[claims[i].Key] = i
	}
	var q strings.Builder
	args := make([]any, 0, 5*min(n, claimChunk))
	inserted := 0
	for start := 0; start < n; start += claimChunk {
		chunk := claims[start:min(n, start+claimChunk)]
		q.Reset()
		args = args[:0]
		// The clock is read once per statement: an expression per row would
		// make SQLite's code generator compare every pair of them.
		q.WriteString(`INSERT INTO ` + s.table + ` (scope, key, fingerprint, source, expires_at)
SELECT v.column1, v.column2, v.column3, v.column4, v.column5 + n.now FROM (VALUES `)
		for i := range chunk {
			c := &chunk[i]
			if i > 0 {
				q.WriteByte(',')
			}
			q.WriteString(`(?, ?, ?, ?, ?)`)
			args = append(args, c.Key.Scope, c.Key.ID, c.Fingerprint[:], c.Source, s.retentionMillis(c.Key.Scope))
		}
		// WHERE true: SQLite's parser needs it before an upsert clause.
		q.WriteString(`) AS v, (SELECT ` + nowMillis + ` AS now) AS n WHERE true ON CONFLICT (scope, key) DO NOTHING RETURNING scope, key`)
		rows, err := tx.QueryContext(ctx, q.String(), args...)
		if err != nil {
			return s.wrap("claim", err)
		}
		for rows.Next() {
			var k dedup.Key
			if err := rows.Scan(&k.Scope, &k.ID); err != nil {
				rows.Close()
				return s.wrap("claim", err)
			}
			results[first[k]] = dedup.Result{Status: dedup.StatusNew}
			inserted++
		}
		if err := rows.Close(); err != nil {
			return s.wrap("claim", err)
		}
		if err := rows.Err(); err != nil {
			return s.wrap("claim", err)
		}
	}
	if inserted == n {
		return nil
	}

	type row struct {
		fp      []byte
		failed  bool
		reason  string
		created int64 // ms since the epoch
		present bool
	}
	var look []dedup.Key
	seen := make(map[dedup.Key]bool)
	for i := range claims {
		if results[i].Status == 0 && !seen[claims[i].Key] {
			seen[claims[i].Key] = true
			look = append(look, claims[i].Key)
		}
	}
	stored := make(map[dedup.Key]row, len(look))
	for start := 0; start < len(look); start += 2 * claimChunk {
		chunk := look[start:min(len(look), start+2*claimChunk)]
		q.Reset()
		args = args[:0]
		q.WriteString(`WITH v(s, k) AS (VALUES `)
		for i, k := range chunk {
			if i > 0 {
				q.WriteByte(',')
			}
			q.WriteString(`(?, ?)`)
			args = append(args, k.Scope, k.ID)
		}
		// A join on the primary key: one index lookup per key.
		q.WriteString(`) SELECT t.scope, t.key, t.fingerprint, t.outcome, coalesce(t.reason, ''), t.created_at FROM v JOIN ` + s.table + ` t ON t.scope = v.s AND t.key = v.k`)
		rows, err := tx.QueryContext(ctx, q.String(), args...)
		if err != nil {
			return s.wrap("claim", err)
		}
		for rows.Next() {
			var k dedup.Key
			var r row
			var outcome string
			if err := rows.Scan(&k.Scope, &k.ID, &r.fp, &outcome, &r.reason, &r.created); err != nil {
				rows.Close()
				return s.wrap("claim", err)
			}
			r.failed, r.present = outcome == "failed", true
			stored[k] = r
		}
		if err := rows.Close(); err != nil {
			return s.wrap("claim", err)
		}
		if err := rows.Err(); err != nil {
			return s.wrap("claim", err)
		}
	}
	for i := range claims {
		if results[i].Status != 0 {
			continue
		}
		r := stored[claims[i].Key]
		first := time.UnixMilli(r.created)
		switch {
		case !r.present:
			return fmt.Errorf("%w: key %s vanished during the claim (purged?)", dedup.ErrInFlight, claims[i].Key)
		case string(r.fp) != string(claims[i].Fingerprint[:]):
			results[i] = dedup.Result{Status: dedup.StatusMismatch, FirstAt: first}
		case r.failed:
			results[i] = dedup.Result{Status: dedup.StatusFailed, Reason: r.reason, FirstAt: first}
		default:
			results[i] = dedup.Result{Status: dedup.StatusDuplicate, FirstAt: first}
		}
	}
	return nil
}

// RecordFailure inserts a 'failed' row in its own transaction; see
// dedup.Store.
func (s *Store) RecordFailure(ctx context.Context, c dedup.Claim, reason string) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO `+s.table+` (scope, key, fingerprint, source, outcome, reason, expires_at)
VALUES (?, ?, ?, ?, 'failed', ?, ? + `+nowMillis+`) ON CONFLICT (scope, key) DO NOTHING`,
		c.Key.Scope, c.Key.ID, c.Fingerprint[:], c.Source, shorten.Reason(reason), s.retentionMillis(c.Key.Scope))
	return s.wrap("record failure", err)
}

// Purge deletes at most limit expired rows, but no HTTP request whose lease
// runs; see dedup.Store. In the same transaction it deletes the effect
// journal's succeeded and failed steps of the keys it deleted (counted
// too): a step lives as long as its message's key row, and a step whose
// key has no row is never purged (see dedup.Journal). Within what is left
// of limit it then deletes the entity watermarks untouched, and the stale
// records kept, for longer than their scope's retention (counted too): a
// watermark is forgotten as a key is, and the entity's next event applies
// whatever its version (see dedup.Watermarks).
func (s *Store) Purge(ctx context.Context, limit int) (n int, err error) {
	if limit <= 0 {
		return 0, nil
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, s.wrap("purge", err)
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	// Never a request in processing whose lease runs (see http.go).
	rows, err := tx.QueryContext(ctx, `DELETE FROM `+s.table+` WHERE (scope, key) IN (
SELECT scope, key FROM `+s.table+` WHERE expires_at < `+nowMillis+`
    AND (state IS NOT 'processing' OR lease_expires_at <= `+nowMillis+`) LIMIT ?)
RETURNING scope, key`, limit)
	if err != nil {
		return 0, s.wrap("purge", err)
	}
	var gone []dedup.Key
	for rows.Next() {
		var k dedup.Key
		if err := rows.Scan(&k.Scope, &k.ID); err != nil {
			rows.Close()
			return 0, s.wrap("purge", err)
		}
		gone = append(gone, k)
	}
	if err := rows.Err(); err != nil {
		return 0, s.wrap("purge", err)
	}
	steps, err := s.purgeSteps(ctx, tx, gone) // journal.go
	if err != nil {
		return 0, err
	}
	marks, err := s.purgeEntities(ctx, tx, limit-len(gone)) // entities.go
	if err != nil {
		return 0, err
	}
	if err := tx.Commit(); err != nil {
		return 0, s.wrap("purge", err)
	}
	return len(gone) + steps + marks, nil
}

// wrap names the operation and turns a busy database into
// dedup.ErrStoreBusy: SQLITE_BUSY and SQLITE_LOCKED are a wait for the
// database's lock, which says nothing about any key.
func (s *Store) wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	if Classify(err) == dedup.ClassConflict {
		return fmt.Errorf("%w: sqlitestore: %s: %w", dedup.ErrStoreBusy, op, err)
	}
	return fmt.Errorf("sqlitestore: %s: %w", op, err)
}

// ClassifyError classifies SQLite result codes; see Classify.
func (s *Store) ClassifyError(err error) dedup.ErrorClass { return Classify(err) }

// Classify sorts an SQLite error: SQLITE_BUSY and SQLITE_LOCKED are
// conflicts, SQLITE_CONSTRAINT is permanent; a missing table or column, a
// syntax error, a read-only or refused database are fatal (a broken
// deployment stops the consumer).
func Classify(err error) dedup.ErrorClass {
	var se *sqlite.Error
	if !errors.As(err, &se) {
		return dedup.ClassUnknown
	}
	switch se.Code() & 0xff {
	case sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED:
		return dedup.ClassConflict
	case sqlite3.SQLITE_CONSTRAINT:
		return dedup.ClassPermanent
	case sqlite3.SQLITE_READONLY, sqlite3.SQLITE_PERM, sqlite3.SQLITE_AUTH:
		return dedup.ClassFatal
	case sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR, sqlite3.SQLITE_NOMEM, sqlite3.SQLITE_CANTOPEN:
		// A full disk, an I/O error, no memory: the database cannot take
		// writes now; waited out, never a message's fault.
		return dedup.ClassUnavailable
	case sqlite3.SQLITE_ERROR:
		// SQLite reports a missing table or column only in the message
		// (SQLITE_ERROR is also a syntax error): all of them are a broken
		// deployment, which every message would meet the same way.
		msg := se.Error()
		if strings.Contains(msg, "no such table") || strings.Contains(msg, "no such column") || strings.Contains(msg, "syntax error") {
			return dedup.ClassFatal
		}
	}
	return dedup.ClassUnknown
}

var _ dedup.Store[*sql.Tx] = (*Store)(nil)
