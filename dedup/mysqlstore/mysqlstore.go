// Package mysqlstore is the MySQL and MariaDB dedup.Store, on
// go-sql-driver/mysql and database/sql (Store[*sql.Tx]), for InnoDB tables.
//
// A claim inserts the batch's keys in one statement, in (scope, key) order:
//
//	INSERT IGNORE INTO idem_dedup (scope, `key`, fingerprint, source, claim_token, created_at, expires_at)
//	VALUES (...), (...) -- sorted by (scope, key)
//
// Keys are utf8mb4 with a binary collation that does not pad
// (utf8mb4_nopad_bin on MariaDB, utf8mb4_0900_bin on MySQL), so keys compare
// byte for byte: "k", "K" and "k " are three keys.
//
// New rows and old ones are told apart by the affected-row count — all of
// the batch's keys inserted, the common case, needs nothing more — and
// otherwise by a random token the statement writes into the rows it
// inserts: one read of the batch's rows then says which are this claim's,
// and gives the fingerprint, outcome and creation time of the others. INSERT IGNORE rather than INSERT … ON
// DUPLICATE KEY UPDATE: a duplicate found by IGNORE takes a shared lock on
// the existing row, so concurrent duplicates of one key do not wait for each
// other; the no-op UPDATE takes an exclusive one, and they queue (see
// BenchmarkClaimVariants). IGNORE also turns other errors into warnings, so
// Claim validates what it inserts first (dedup.Key.Validate, valid UTF-8
// audit strings cut to their columns).
//
// A key another transaction has inserted but not committed makes InnoDB wait
// on its row lock; that wait is the in-flight state, bounded by
// innodb_lock_wait_timeout (Config.LockTimeout, whole seconds) and reported
// as dedup.ErrInFlight (error 1205). Deadlocks (1213) are conflicts, retried
// whole by the consumer; claims alone never deadlock, since every claim
// takes its rows in the primary key's order.
//
// Isolation. Transactions run READ COMMITTED by default; Config.Isolation
// chooses REPEATABLE READ (InnoDB's default). The claim itself takes the
// same locks under both: the key is the primary key, so the duplicate check
// locks index records only, never the gaps between them, and the read that
// follows takes no locks. The difference is the handler's: under REPEATABLE READ its locking
// reads and range updates take next-key (gap) locks, which block other
// transactions' inserts into those gaps — other lanes' claims and effects
// included — until COMMIT; under READ COMMITTED they lock the rows they
// find, and each statement reads the latest committed data. Purge always
// runs READ COMMITTED, with SKIP LOCKED, so that it never holds a gap of the
// expiry index against new claims.
//
// Times come from the database clock (UTC_TIMESTAMP(6)), stored as
// DATETIME(6) in UTC.
package mysqlstore

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"github.com/idemkit/idem/internal/shorten"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/go-sql-driver/mysql"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/internal/retention"
	"github.com/idemkit/idem/internal/storekit/sqlmigrate"
)

// Config configures a Store. Zero values take the defaults.
type Config struct {
	// Database holds the table; default: the connection's database (the
	// DSN's). Database and Table must match [a-z_][a-z0-9_]* and be at most
	// 48 bytes.
	Database string
	// Table is the dedup table's name; default "idem_dedup".
	Table string
	// LockTimeout bounds the wait on a key another transaction holds
	// uncommitted; default 5s. It is InnoDB's innodb_lock_wait_timeout,
	// counted in whole seconds: rounded up, at least 1s. It is the session's
	// setting, so it also bounds the handler's own lock waits in the
	// transaction (error 1205, a conflict).
	LockTimeout time.Duration
	// Isolation is the transactions' isolation level:
	// sql.LevelReadCommitted (the default) or sql.LevelRepeatableRead.
	Isolation sql.IsolationLevel
	// Retention is how long a row is kept; default 0: forever.
	Retention time.Duration
	// ScopeRetention overrides Retention for the scopes it names.
	ScopeRetention map[string]time.Duration
}

// session is what every connection of a Store's transactions is set to.
type session struct {
	isolation   string // READ COMMITTED, REPEATABLE READ
	lockTimeout int    // innodb_lock_wait_timeout, seconds
}

func (c *Config) normalize() (session, error) {
	if c.Table == "" {
		c.Table = "idem_dedup"
	}
	if c.Database != "" {
		if err := sqlmigrate.CheckName("mysqlstore", "Database", c.Database); err != nil {
			return session{}, err
		}
	}
	if err := sqlmigrate.CheckName("mysqlstore", "Table", c.Table); err != nil {
		return session{}, err
	}
	if c.LockTimeout < 0 || c.Retention < 0 {
		return session{}, errors.New("mysqlstore: Config.LockTimeout and Config.Retention must not be negative")
	}
	if err := retention.CheckScopes("mysqlstore", c.ScopeRetention); err != nil {
		return session{}, err
	}
	if c.LockTimeout == 0 {
		c.LockTimeout = 5 * time.Second
	}
	var sess session
	switch c.Isolation {
	case sql.LevelDefault, sql.LevelReadCommitted:
		c.Isolation, sess.isolation = sql.LevelReadCommitted, "READ COMMITTED"
	case sql.LevelRepeatableRead:
		sess.isolation = "REPEATABLE READ"
	default:
		return session{}, fmt.Errorf("mysqlstore: Config.Isolation %v: want sql.LevelReadCommitted or sql.LevelRepeatableRead", c.Isolation)
	}
	sess.lockTimeout = int((c.LockTimeout + time.Second - 1) / time.Second)
	return sess, nil
}

// Open opens a pool on dsn (go-sql-driver/mysql's format, user:pass@tcp(host:port)/db)
// set up for a Store with cfg: every connection is put into cfg's isolation
// level and lock wait timeout when it connects, so that a transaction begins
// in one round trip, and statements' parameters are interpolated by the
// driver (interpolateParams), one round trip per statement instead of
// prepare, execute and close. Pass the same cfg to New.
func Open(dsn string, cfg Config) (*sql.DB, error) {
	sess, err := cfg.normalize()
	if err != nil {
		return nil, err
	}
	mc, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, fmt.Errorf("mysqlstore: open: %w", err)
	}
	mc.InterpolateParams = true
	base, err := mysql.NewConnector(mc)
	if err != nil {
		return nil, fmt.Errorf("mysqlstore: open: %w", err)
	}
	return sql.OpenDB(&connector{base: base, drv: &sessionDriver{session: sess}}), nil
}

// connector sets up each new connection for the store's session.
type connector struct {
	base driver.Connector
	drv  *sessionDriver
}

func (c *connector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.base.Connect(ctx)
	if err != nil {
		return nil, err
	}
	ex, ok := conn.(driver.ExecerContext)
	if !ok {
		conn.Close()
		return nil, errors.New("mysqlstore: the driver's connection cannot execute statements")
	}
	for _, q := range c.drv.session.statements() {
		if _, err := ex.ExecContext(ctx, q, nil); err != nil {
			conn.Close()
			return nil, err
		}
	}
	return conn, nil
}

func (c *connector) Driver() driver.Driver { return c.drv }

func (s session) statements() []string {
	return []string{
		"SET SESSION TRANSACTION ISOLATION LEVEL " + s.isolation,
		"SET SESSION innodb_lock_wait_timeout = " + strconv.Itoa(s.lockTimeout),
	}
}

// sessionDriver is the driver of a pool from Open: New recognises it, and
// then skips setting up each transaction.
type sessionDriver struct {
	mysql.MySQLDriver
	session session
}

// Store is a dedup.Store[*sql.Tx] on MySQL or MariaDB. Safe for concurrent
// use.
type Store struct {
	db       *sql.DB
	cfg      Config
	session  session
	preset   bool // db comes from Open with this session: nothing to set per transaction
	variant  claimVariant
	table    string // quoted, with the database when configured
	versions string
	epochs   string // the release epochs' table: see epochs.go
	tokens   string // the counter of the journal's tokens: see journal.go
	steps    string // the effect journal's table: see journal.go
	marks    string // the entity watermarks' table: see entities.go
	stale    string // the stale events' table: see entities.go
	// The parked keys' tables: see parking.go.
	parkedKeys, parked string
	// lookupSQL reads a claim's rows; the first parameter is the token.
	lookupSQL string

	// lostAt is when a transaction of this store last lost its connection
	// or could not get one (monotonic nanoseconds since epoch), 0 when never.
	lostAt atomic.Int64
	epoch  time.Time
}

// New returns a Store on db. A db from Open with the same cfg has its
// connections set up already; any other *sql.DB works too, at the cost of
// two statements more per transaction (SET TRANSACTION ISOLATION LEVEL, SET
// SESSION innodb_lock_wait_timeout, which stays set on the connection). Call
// Migrate before the first claim.
func New(db *sql.DB, cfg Config) (*Store, error) {
	if db == nil {
		return nil, errors.New("mysqlstore: db is nil")
	}
	sess, err := cfg.normalize()
	if err != nil {
		return nil, err
	}
	s := &Store{db: db, cfg: cfg, session: sess, epoch: time.Now()}
	if d, ok := db.Driver().(*sessionDriver); ok && d.session == sess {
		s.preset = true
	}
	s.table, s.versions, s.epochs = quote(cfg.Table), quote("idem_schema_migrations"), quote(cfg.Table+"_epochs")
	s.tokens, s.steps = quote(cfg.Table+"_tokens"), quote(cfg.Table+"_steps")
	s.marks, s.stale = quote(cfg.Table+"_watermarks"), quote(cfg.Table+"_stale")
	s.parkedKeys, s.parked = quote(cfg.Table+"_parked_keys"), quote(cfg.Table+"_parked")
	if cfg.Database != "" {
		db := quote(cfg.Database) + "."
		s.table, s.versions, s.epochs = db+s.table, db+s.versions, db+s.epochs
		s.tokens, s.steps = db+s.tokens, db+s.steps
		s.marks, s.stale = db+s.marks, db+s.stale
		s.parkedKeys, s.parked = db+s.parkedKeys, db+s.parked
	}
	s.lookupSQL = "SELECT scope, `key`, fingerprint, outcome = 'failed', coalesce(reason, ''), " +
		"TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', created_at), claim_token = ? FROM " + s.table
	return s, nil
}

func quote(ident string) string { return "`" + ident + "`" }

// Table returns the quoted table name, with its database when configured.
func (s *Store) Table() string { return s.table }

// InTx runs fn in one transaction at the configured isolation level; see
// dedup.Store.
//
// When the transaction fails because its connection died (or no connection
// could be had), the error is wrapped in a *dedup.ConnLostError, which Classify
// reports as dedup.ClassUnavailable: the consumer waits the database out
// instead of blaming the message. A network error a handler got from
// somewhere else leaves the connection alive and is returned as it is.
//
// The driver interrupts a statement whose context ends by closing its
// connection. When that context was fn's own (a handler's timeout) the
// error is the handler's, unless another transaction of this store lost
// its connection meanwhile or the database does not answer a ping: then it
// is the database's (as in pgstore).
func (s *Store) InTx(ctx context.Context, fn func(ctx context.Context, tx *sql.Tx) error) (err error) {
	began := s.now()
	var opts *sql.TxOptions
	if !s.preset {
		opts = &sql.TxOptions{Isolation: s.cfg.Isolation}
	}
	tx, err := s.db.BeginTx(ctx, opts)
	if err != nil {
		return s.beginErr(ctx, err)
	}
	committed := false
	defer func() {
		if committed {
			return
		}
		// Always: also when fn panicked or called runtime.Goexit.
		rbErr := tx.Rollback()
		if err == nil || ctx.Err() != nil || !connDead(rbErr) {
			return
		}
		if !isContextErr(err) || s.lostSince(began) || !s.answers(ctx) {
			s.markLost()
			err = connLost(err)
		}
	}()
	if !s.preset {
		if _, err = tx.ExecContext(ctx, "SET SESSION innodb_lock_wait_timeout = "+strconv.Itoa(s.session.lockTimeout)); err != nil {
			return err
		}
	}
	if err = fn(ctx, tx); err != nil {
		return txEnded(err)
	}
	if err = ctx.Err(); err != nil {
		return err // never commit work whose caller gave up
	}
	if err = tx.Commit(); err != nil {
		if errors.Is(err, sql.ErrTxDone) {
			return txEnded(err)
		}
		committed = true // nothing left to roll back
		var me *mysql.MySQLError
		if errors.As(err, &me) || ctx.Err() != nil {
			return err
		}
		// The connection broke during COMMIT: the outcome is unknown, and
		// the redelivery's claim finds out.
		s.markLost()
		return connLost(err)
	}
	committed = true
	return nil
}

// beginErr: a server that refuses (too many connections, denied) answers
// with a MySQL error, classified by number; anything else is a connection
// that could not be had.
func (s *Store) beginErr(ctx context.Context, err error) error {
	var me *mysql.MySQLError
	if ctx.Err() != nil || errors.As(err, &me) {
		return err
	}
	s.markLost()
	return connLost(err)
}

// connDead reports whether a Rollback failed because the connection is gone
// (the driver answers ErrInvalidConn or the error that broke it), rather
// than because the transaction had ended (sql.ErrTxDone) or the server
// refused.
func connDead(rbErr error) bool {
	var me *mysql.MySQLError
	return rbErr != nil && !errors.Is(rbErr, sql.ErrTxDone) && !errors.As(rbErr, &me)
}

// txEnded names the mistake behind sql.ErrTxDone: the handler committed or
// rolled back the transaction the consumer owns.
func txEnded(err error) error {
	if errors.Is(err, sql.ErrTxDone) {
		return fmt.Errorf("%w (commit and rollback are the consumer's): %w", dedup.ErrTxEnded, err)
	}
	return err
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
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), pingTimeout)
	defer cancel()
	if s.db.PingContext(ctx) != nil {
		s.markLost()
		return false
	}
	return true
}

func isContextErr(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)
}

// connLost is a store operation that failed because its connection to the
// database was lost or could not be had. When it happened during COMMIT the
// outcome is unknown: the retry's claim finds out.
func connLost(err error) error { return &dedup.ConnLostError{Store: "mysqlstore", Err: err} }

// connErr wraps an error of the store's own statements outside InTx
// (Check, Migrate, RecordFailure, Purge): a MySQL error or a context error
// as it is, anything else (a broken or refused connection) as a
// *dedup.ConnLostError.
func (s *Store) connErr(op string, err error) error {
	var me *mysql.MySQLError
	if errors.As(err, &me) || isContextErr(err) {
		return fmt.Errorf("mysqlstore: %s: %w", op, err)
	}
	s.markLost()
	return connLost(fmt.Errorf("%s: %w", op, err))
}

// Check reports whether the table is migrated to this version of the store;
// see dedup.Store.
func (s *Store) Check(ctx context.Context) error {
	ms, err := s.migrations("")
	if err != nil {
		return err
	}
	schema := "DATABASE()"
	if s.cfg.Database != "" {
		schema = "'" + s.cfg.Database + "'"
	}
	var have, tables int
	err = s.db.QueryRowContext(ctx, `SELECT
    (SELECT coalesce(max(version), 0) FROM `+s.versions+` WHERE table_name = ?),
    (SELECT count(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = `+schema+` AND TABLE_NAME = ?)`,
		s.cfg.Table, s.cfg.Table).Scan(&have, &tables)
	var me *mysql.MySQLError
	switch {
	case errors.As(err, &me) && me.Number == 1146:
		return fmt.Errorf("%w: mysqlstore: %s does not exist: call Store.Migrate before Run", dedup.ErrNotMigrated, s.versions)
	case err != nil:
		return s.connErr("check", err)
	}
	return sqlmigrate.Check("mysqlstore", s.table, tables > 0, have, ms, "Store.Migrate before Run")
}

// retention returns the retention of scope in µs, nil for forever.
func (s *Store) retention(scope string) any {
	d, ok := retention.Of(s.cfg.Retention, s.cfg.ScopeRetention, scope)
	if !ok {
		return nil
	}
	return d.Microseconds()
}

// chunk bounds the rows of one statement: a prepared statement takes at
// most 65,535 parameters (a *sql.DB not from Open prepares), and a smaller
// statement keeps the server's parser and range optimizer cheap.
const chunk = 1000

// The columns a claim inserts; the expiry is the statement's clock plus the
// scope's retention (NULL: forever).
const insertRow = `(?, ?, ?, ?, ?, UTC_TIMESTAMP(6), DATE_ADD(UTC_TIMESTAMP(6), INTERVAL ? MICROSECOND))`

// Claim claims keys in tx; see the package doc and dedup.Store.
func (s *Store) Claim(ctx context.Context, tx *sql.Tx, claims []dedup.Claim, results []dedup.Result) error {
	n := len(claims)
	if len(results) < n {
		return fmt.Errorf("mysqlstore: %d results for %d claims", len(results), n)
	}
	if n == 0 {
		return nil
	}
	clear(results[:n]) // a result left from an earlier batch must not stand
	first := make(map[dedup.Key]int, n)
	order := make([]int, 0, n) // first occurrences, in (scope, key) order
	for i := range claims {
		k := claims[i].Key
		if err := k.Validate(); err != nil {
			return fmt.Errorf("mysqlstore: claim %d: %w", i, err)
		}
		if _, ok := first[k]; !ok {
			first[k] = i
			order = append(order, i)
		}
	}
	slices.SortFunc(order, func(a, b int) int {
		ka, kb := claims[a].Key, claims[b].Key
		if c := strings.Compare(ka.Scope, kb.Scope); c != 0 {
			return c
		}
		return strings.Compare(ka.ID, kb.ID)
	})

	token := rand.Uint64() | 1 // RecordFailure's rows have 0
	inserted, err := s.insert(ctx, tx, claims, order, token, s.variant)
	if err != nil {
		return err
	}
	if inserted == len(order) && len(order) == n {
		for i := range claims {
			results[i] = dedup.Result{Status: dedup.StatusNew}
		}
		return nil
	}
	return s.lookup(ctx, tx, claims, order, first, token, results)
}

// claimVariant is the claim statement: INSERT IGNORE (the store's), or
// INSERT … ON DUPLICATE KEY UPDATE, kept to measure the choice.
type claimVariant uint8

const (
	variantIgnore claimVariant = iota
	variantUpsert
)

// insert inserts the claims at order, in order, and returns how many rows
// it inserted.
func (s *Store) insert(ctx context.Context, tx *sql.Tx, claims []dedup.Claim, order []int, token uint64, v claimVariant) (int, error) {
	var q strings.Builder
	args := make([]any, 0, 6*min(len(order), chunk))
	inserted := 0
	for start := 0; start < len(order); start += chunk {
		part := order[start:min(len(order), start+chunk)]
		q.Reset()
		args = args[:0]
		if v == variantIgnore {
			q.WriteString(`INSERT IGNORE INTO `)
		} else {
			q.WriteString(`INSERT INTO `)
		}
		q.WriteString(s.table + " (scope, `key`, fingerprint, source, claim_token, created_at, expires_at) VALUES ")
		for j, i := range part {
			if j > 0 {
				q.WriteByte(',')
			}
			q.WriteString(insertRow)
			c := &claims[i]
			args = append(args, c.Key.Scope, c.Key.ID, c.Fingerprint[:], clean(c.Source, maxSource), token, s.retention(c.Key.Scope))
		}
		if v == variantUpsert {
			q.WriteString(" ON DUPLICATE KEY UPDATE scope = scope")
		}
		res, err := tx.ExecContext(ctx, q.String(), args...)
		if err != nil {
			return 0, s.claimErr(err)
		}
		// With ON DUPLICATE KEY UPDATE, an unchanged duplicate counts 0.
		k, err := res.RowsAffected()
		if err != nil {
			return 0, s.claimErr(err)
		}
		inserted += int(k)
	}
	return inserted, nil
}

// stored is a row as the claim's lookup reads it.
type stored struct {
	fp      [32]byte
	failed  bool
	mine    bool
	reason  string
	created time.Time
}

// lookup reads the claims' rows and sets the results. The insert has
// waited for every claim in flight elsewhere and holds a lock on every row
// of the batch (its own rows', shared ones on the duplicates), so a plain
// read sees them all, committed or this transaction's, and takes no more
// locks. A locking read would: with a small table the optimizer scans the
// scope's range instead of looking the keys up, and a locking scan waits on
// other transactions' uncommitted rows outside the batch — which deadlocks.
// Only a key the read does not see (a REPEATABLE READ snapshot taken before
// the claim) is read again with a locking point lookup, which sees the
// latest committed row.
func (s *Store) lookup(ctx context.Context, tx *sql.Tx, claims []dedup.Claim, order []int, first map[dedup.Key]int, token uint64, results []dedup.Result) error {
	rows := make(map[dedup.Key]stored, len(order))
	var q strings.Builder
	args := make([]any, 0, 2*min(len(order), chunk)+1)
	for start := 0; start < len(order); start += chunk {
		part := order[start:min(len(order), start+chunk)]
		q.Reset()
		args = append(args[:0], token)
		q.WriteString(s.lookupSQL + " WHERE ")
		// (scope = ? AND `key` IN (...)) OR ...: one group per scope (part
		// is sorted by scope).
		for j := 0; j < len(part); {
			scope := claims[part[j]].Key.Scope
			if j > 0 {
				q.WriteString(" OR ")
			}
			q.WriteString("(scope = ? AND `key` IN (")
			args = append(args, scope)
			for k := j; j < len(part) && claims[part[j]].Key.Scope == scope; j++ {
				if j > k {
					q.WriteByte(',')
				}
				q.WriteByte('?')
				args = append(args, claims[part[j]].Key.ID)
			}
			q.WriteString("))")
		}
		if err := s.scanRows(ctx, tx, q.String(), args, rows); err != nil {
			return err
		}
	}
	for _, i := range order {
		k := claims[i].Key
		if _, ok := rows[k]; ok {
			continue
		}
		if err := s.scanRows(ctx, tx, s.lookupSQL+" WHERE scope = ? AND `key` = ? LOCK IN SHARE MODE", []any{token, k.Scope, k.ID}, rows); err != nil {
			return err
		}
	}
	for i := range claims {
		k := claims[i].Key
		r, ok := rows[k]
		if !ok {
			return fmt.Errorf("%w: key %s vanished during the claim (purged?)", dedup.ErrInFlight, k)
		}
		switch {
		case r.mine && first[k] == i:
			results[i] = dedup.Result{Status: dedup.StatusNew}
		case r.fp != claims[i].Fingerprint:
			results[i] = dedup.Result{Status: dedup.StatusMismatch, FirstAt: r.created}
		case r.failed:
			results[i] = dedup.Result{Status: dedup.StatusFailed, Reason: r.reason, FirstAt: r.created}
		default:
			results[i] = dedup.Result{Status: dedup.StatusDuplicate, FirstAt: r.created}
		}
	}
	return nil
}

func (s *Store) scanRows(ctx context.Context, tx *sql.Tx, q string, args []any, into map[dedup.Key]stored) error {
	rows, err := tx.QueryContext(ctx, q, args...)
	if err != nil {
		return s.claimErr(err)
	}
	defer rows.Close()
	for rows.Next() {
		var k dedup.Key
		var r stored
		var fp sql.RawBytes
		var micros int64
		if err := rows.Scan(&k.Scope, &k.ID, &fp, &r.failed, &r.reason, &micros, &r.mine); err != nil {
			return s.claimErr(err)
		}
		if len(fp) != len(r.fp) {
			return fmt.Errorf("mysqlstore: claim: key %s has a %d-byte fingerprint", k, len(fp))
		}
		copy(r.fp[:], fp)
		r.created = time.UnixMicro(micros)
		into[k] = r
	}
	if err := rows.Err(); err != nil {
		return s.claimErr(err)
	}
	return nil
}

// claimErr is lockErr for a claim.
func (s *Store) claimErr(err error) error { return s.lockErr("claim", err) }

// lockErr turns a lock wait timeout into dedup.ErrInFlight, and wraps
// other errors with what failed.
func (s *Store) lockErr(what string, err error) error {
	var me *mysql.MySQLError
	if errors.As(err, &me) && me.Number == erLockWaitTimeout {
		return fmt.Errorf("%w (innodb_lock_wait_timeout %ds): %w", dedup.ErrInFlight, s.session.lockTimeout, err)
	}
	return fmt.Errorf("mysqlstore: %s: %w", what, err)
}

// Bounds of the audit columns, in bytes.
const (
	maxSource = 1000
	maxReason = dedup.MaxReasonLen
)

// clean makes an audit string storable: valid UTF-8 without control
// characters, at most max bytes, cut on a rune boundary. (A strict server
// would refuse invalid UTF-8; INSERT IGNORE would mangle it.)
func clean(s string, max int) string {
	ok := len(s) <= max && utf8.ValidString(s)
	for i := 0; ok && i < len(s); i++ {
		if s[i] < 0x20 || s[i] == 0x7f {
			ok = false
		}
	}
	if ok {
		return s
	}
	var b strings.Builder
	for _, r := range strings.ToValidUTF8(s, "\uFFFD") {
		if r < 0x20 || r == 0x7f {
			r = '?'
		}
		if b.Len()+utf8.RuneLen(r) > max {
			break
		}
		b.WriteRune(r)
	}
	return b.String()
}

// RecordFailure inserts a 'failed' row in its own transaction; see
// dedup.Store. A key already recorded is left as it is (INSERT IGNORE).
func (s *Store) RecordFailure(ctx context.Context, c dedup.Claim, reason string) error {
	if err := c.Key.Validate(); err != nil {
		return fmt.Errorf("mysqlstore: record failure: %w", err)
	}
	_, err := s.db.ExecContext(ctx, "INSERT IGNORE INTO "+s.table+" (scope, `key`, fingerprint, source, claim_token, outcome, reason, created_at, expires_at) "+
		"VALUES (?, ?, ?, ?, 0, 'failed', ?, UTC_TIMESTAMP(6), DATE_ADD(UTC_TIMESTAMP(6), INTERVAL ? MICROSECOND))",
		c.Key.Scope, c.Key.ID, c.Fingerprint[:], clean(c.Source, maxSource), clean(shorten.Reason(reason), maxReason), s.retention(c.Key.Scope))
	if err != nil {
		return s.connErr("record failure", err)
	}
	return nil
}

// Purge deletes at most limit expired rows (by the database clock) in a
// READ COMMITTED transaction, skipping rows other transactions hold (FOR
// UPDATE SKIP LOCKED: MySQL 8.0, MariaDB 10.6); see dedup.Purger. In the
// same transaction it deletes the effect journal's succeeded and failed
// steps of the keys it deleted (counted too): a step lives as long as its
// message's key row, and a step whose key has no row is never purged (see
// dedup.Journal). Within what is left of limit it then deletes the entity
// watermarks untouched, and the stale records kept, for longer than their
// scope's retention (counted too): a watermark is forgotten as a key is,
// and the entity's next event applies whatever its version (see
// dedup.Watermarks).
func (s *Store) Purge(ctx context.Context, limit int) (n int, err error) {
	if limit <= 0 {
		return 0, nil
	}
	tx, err := s.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return 0, s.connErr("purge", err)
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	rows, err := tx.QueryContext(ctx, "SELECT scope, `key` FROM "+s.table+
		" WHERE expires_at < UTC_TIMESTAMP(6) ORDER BY expires_at LIMIT ? FOR UPDATE SKIP LOCKED", limit)
	if err != nil {
		return 0, s.connErr("purge", err)
	}
	var keys []dedup.Key
	for rows.Next() {
		var k dedup.Key
		if err := rows.Scan(&k.Scope, &k.ID); err != nil {
			rows.Close()
			return 0, s.connErr("purge", err)
		}
		keys = append(keys, k)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, s.connErr("purge", err)
	}
	for start := 0; start < len(keys); start += chunk {
		part := keys[start:min(len(keys), start+chunk)]
		var q strings.Builder
		args := make([]any, 0, 2*len(part))
		q.WriteString("DELETE FROM " + s.table + " WHERE ")
		for i, k := range part {
			if i > 0 {
				q.WriteString(" OR ")
			}
			q.WriteString("(scope = ? AND `key` = ?)")
			args = append(args, k.Scope, k.ID)
		}
		res, err := tx.ExecContext(ctx, q.String(), args...)
		if err != nil {
			return 0, s.connErr("purge", err)
		}
		d, _ := res.RowsAffected()
		n += int(d)
		steps, err := s.purgeSteps(ctx, tx, part) // journal.go
		if err != nil {
			return 0, err
		}
		n += steps
	}
	marks, err := s.purgeEntities(ctx, tx, limit-len(keys)) // entities.go
	if err != nil {
		return 0, err
	}
	n += marks
	if err := tx.Commit(); err != nil {
		return 0, s.connErr("purge", err)
	}
	return n, nil
}

// MySQL and MariaDB error numbers Classify knows.
const (
	erLockWaitTimeout = 1205
	erLockDeadlock    = 1213
	erNoSuchTable     = 1146
)

// ClassifyError classifies MySQL errors; see Classify.
func (s *Store) ClassifyError(err error) dedup.ErrorClass { return Classify(err) }

// Classify sorts a MySQL or MariaDB error by its number, then its SQLSTATE:
//   - 1205 lock wait timeout, 1213 deadlock (40001), 3572 NOWAIT lock:
//     conflict (retried whole, not counted against the message);
//   - 1317 query interrupted, 3024 (MySQL max_execution_time), 1969
//     (MariaDB max_statement_time): retryable (bounded);
//   - a *dedup.ConnLostError (the store's own connection broke or could not be
//     had), 1040 too many connections, 1053 shutdown in progress, 1927
//     connection killed, 1152/1158–1161 network errors, 1290/1836/1792 (a
//     read-only server or transaction: a failover in progress), SQLSTATE
//     class 08: unavailable (waited out, never dead-lettered). An EOF or
//     network error a handler got from somewhere else is not: it counts
//     against the message's retries;
//   - 1062/1586 duplicate key, 1451/1452 foreign key, 1048 NULL, 3819/4025
//     CHECK, 1406 too long, 1264/1690 out of range, 1366/1292 bad value,
//     1365 division by zero, SQLSTATE classes 23 and 22: permanent;
//   - 1146 no such table, 1054 unknown column, 1064 syntax, 1142/1143/1044/
//     1045/1227/1370 denied, 1049 unknown database, 1046 no database
//     selected, 1305 no such function, 1356 invalid view, SQLSTATE class
//     42: fatal — a broken deployment stops the consumer, nothing
//     dead-lettered;
//   - anything else: unknown, retried within the message's budget.
func Classify(err error) dedup.ErrorClass {
	if err == nil {
		return dedup.ClassUnknown
	}
	var lost *dedup.ConnLostError
	if errors.As(err, &lost) {
		return dedup.ClassUnavailable
	}
	var me *mysql.MySQLError
	if !errors.As(err, &me) {
		return dedup.ClassUnknown
	}
	switch me.Number {
	case erLockWaitTimeout, erLockDeadlock, 3572:
		return dedup.ClassConflict
	case 1317, 3024, 1969:
		return dedup.ClassRetryable
	case 1040, 1053, 1927, 1152, 1158, 1159, 1160, 1161, 1290, 1836, 1792:
		return dedup.ClassUnavailable
	case 1062, 1586, 1451, 1452, 1048, 3819, 4025, 1406, 1264, 1690, 1366, 1292, 1365:
		return dedup.ClassPermanent
	case erNoSuchTable, 1054, 1064, 1142, 1143, 1044, 1045, 1227, 1370, 1049, 1046, 1305, 1356:
		return dedup.ClassFatal
	}
	switch string(me.SQLState[:2]) {
	case "08":
		return dedup.ClassUnavailable
	case "23", "22":
		return dedup.ClassPermanent
	case "42":
		return dedup.ClassFatal
	case "40":
		return dedup.ClassConflict
	}
	return dedup.ClassUnknown
}

var _ dedup.Store[*sql.Tx] = (*Store)(nil)
var _ dedup.Purger = (*Store)(nil)
