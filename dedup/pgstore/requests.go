package pgstore

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem/dedup"
)

// An HTTP Idempotency-Key (package httpidem) is a row of the dedup table
// like any consumer's key; migration 002 gives the row the request's state,
// fencing token, lease and stored response, NULL for a consumer's key. One
// key space, one retention, one Purge.
//
// A request looks at its key without waiting for another: a
// transaction-level advisory lock on a 64-bit hash of (scope, key), taken
// with pg_try_advisory_xact_lock, says whether another transaction is
// executing the key right now (Busy, 409) — the row is only written once
// the handler is done. The lock lives as long as the transaction that took
// it. Two keys with one hash make one of them Busy for a moment, never run
// twice: the primary key decides what is new. Advisory locks are the
// database's, not a table's: the hash is seeded with the table's name, so
// that two tables in one database (two services, a schema per tenant)
// holding the same route and key do not make each other Busy every time.

// ErrDistributedHTTP: RunRequest and AcquireLease of a store in distributed
// mode. They find a key another transaction executes right now with
// pg_try_advisory_xact_lock, which CockroachDB long stubbed as a no-op and
// YugabyteDB lacked until 2025.1; the row itself is written only when the
// handler is done, so there is no row to lock NOWAIT before. Keep HTTP keys
// in a store without Distributed.
var ErrDistributedHTTP = errors.New("pgstore: httpidem needs advisory locks, which Config.Distributed does without: keep HTTP Idempotency-Keys in a Store without Distributed")

// httpQueries are a store's HTTP statements, built once for its table.
type httpQueries struct {
	look, save, acquire, takeover, finish, extend, end, stuck, countStuck, relse string
}

// lookSQL takes the key's advisory lock without waiting (after setting
// the transaction's lock_timeout, $4) and reads its row ($1 scope, $2 key,
// $3 the request's fingerprint).
const lookSQL = `WITH lock AS MATERIALIZED (
    SELECT pg_try_advisory_xact_lock(hashtextextended($1::text || E'\x1f' || $2::text, %d)) AS got
    FROM (SELECT set_config('lock_timeout', $4::text, true)) AS cfg)
SELECT lock.got, d.fingerprint = $3::bytea, d.created_at, d.state, d.token, d.lease_expires_at,
    (extract(epoch FROM d.lease_expires_at - now()) * 1000)::bigint, d.status, d.header, d.body
FROM lock LEFT JOIN %s d ON d.scope = $1 AND d.key = $2`

// lockSeed seeds the advisory lock's hash with the table t.
func lockSeed(t string) int64 {
	h := fnv.New64a()
	h.Write([]byte(t))
	return int64(h.Sum64())
}

// keyCols and keyVals insert a key's row ($1 scope, $2 key, $3
// fingerprint, $4 source, $5 retention in ms, ≤ 0 for ever).
const (
	keyCols = `scope, key, fingerprint, source, expires_at`
	keyVals = `$1, $2, $3::bytea, nullif($4::text, ''), CASE WHEN $5::bigint > 0 THEN now() + $5::bigint * interval '1 millisecond' END`
)

// Leases and the rows that hold them (DESIGN.md §8).
//
// A lease is never shorter than its row: acquiring, taking over and
// extending a lease push the row's expires_at to the lease's end when it
// is earlier (a row kept for ever stays so), and Purge skips a processing
// row whose lease runs, whatever its expires_at (rows written before this
// rule, a clock that moved).
//
// Tokens only grow, also across a purge: every token a lease gets is the
// 64-bit ID of the transaction that writes it (pg_current_xact_id, which
// Postgres assigns in increasing order and never reuses in a cluster, the
// epoch included). Whatever wrote a key's earlier tokens committed before
// the purge that deleted its row, which committed before the transaction
// that claims the key again took its ID: the new token is larger than
// every earlier one. No sequence or tombstone to keep; greatest(token + 1,
// …) keeps a row's own tokens growing should its older tokens be larger
// (tokens 1, 2, … of rows written before this rule). The IDs of a
// logical dump restored into another cluster start again: there, release
// the keys in Processing after the restore (their holders are gone).
const (
	tokenSQL = `pg_current_xact_id()::text::int8`
	// leaseEnd is the end of a lease of $4 ms from now.
	leaseEnd = `now() + $4::bigint * interval '1 millisecond'`
	// keepRow pushes expires_at to the lease's end.
	keepRow = `expires_at = CASE WHEN expires_at IS NOT NULL THEN greatest(expires_at, ` + leaseEnd + `) END`
)

func newHTTPQueries(t string) httpQueries {
	return httpQueries{
		look: fmt.Sprintf(lookSQL, lockSeed(t), t),
		save: `INSERT INTO ` + t + ` (` + keyCols + `, state, token, status, header, body)
VALUES (` + keyVals + `, 'finished', 1, $6, $7, $8)`,
		acquire: `INSERT INTO ` + t + ` (` + keyCols + `, state, token, lease_expires_at)
VALUES ($1, $2, $3::bytea, nullif($4::text, ''),
    CASE WHEN $5::bigint > 0 THEN now() + greatest($5::bigint, $6::bigint) * interval '1 millisecond' END,
    'processing', ` + tokenSQL + `, now() + $6::bigint * interval '1 millisecond')
ON CONFLICT (scope, key) DO NOTHING
RETURNING token, lease_expires_at`,
		takeover: `UPDATE ` + t + `
SET token = greatest(token + 1, ` + tokenSQL + `), lease_expires_at = ` + leaseEnd + `, ` + keepRow + `
WHERE scope = $1 AND key = $2 AND state = 'processing' AND token = $3 AND lease_expires_at <= now()
RETURNING token, lease_expires_at`,
		finish: `UPDATE ` + t + `
SET state = 'finished', status = $4, header = $5, body = $6, lease_expires_at = NULL
WHERE scope = $1 AND key = $2 AND token = $3 AND state = 'processing'`,
		extend: `UPDATE ` + t + ` SET lease_expires_at = ` + leaseEnd + `, ` + keepRow + `
WHERE scope = $1 AND key = $2 AND token = $3 AND state = 'processing'`,
		end: `UPDATE ` + t + ` SET lease_expires_at = now()
WHERE scope = $1 AND key = $2 AND token = $3 AND state = 'processing'`,
		stuck: `SELECT scope, key, token, lease_expires_at, (extract(epoch FROM lease_expires_at - now()) * 1000)::bigint, created_at
FROM ` + t + ` WHERE state = 'processing' AND lease_expires_at < now()
ORDER BY lease_expires_at LIMIT $1`,
		countStuck: `SELECT scope, count(*) FROM ` + t + ` WHERE state = 'processing' AND lease_expires_at < now() GROUP BY scope`,
		relse: `UPDATE ` + t + ` SET token = greatest(token + 1, ` + tokenSQL + `), lease_expires_at = now()
WHERE scope = $1 AND key = $2 AND state = 'processing' AND ($3::bigint = 0 OR token = $3)`,
	}
}

// lookRow is a row of lookSQL.
type lookRow struct {
	got          bool
	same         *bool
	created      *time.Time
	state        *string
	token        *int64
	leaseExpires *time.Time
	leaseLeftMs  *int64
	status       *int16
	header, body []byte
}

// look reads c's key, after trying its advisory lock, and gives the
// verdict for a request with c's fingerprint.
func (s *Store) look(ctx context.Context, tx pgx.Tx, c dedup.Claim) (dedup.RequestRecord, lookRow, error) {
	return s.verdict(tx.QueryRow(ctx, s.http.look, s.lookArgs(c)...), c)
}

func (s *Store) lookArgs(c dedup.Claim) []any {
	return []any{c.Key.Scope, c.Key.ID, c.Fingerprint[:], s.lockTimeout}
}

// verdict reads a row of the look statement.
func (s *Store) verdict(row pgx.Row, c dedup.Claim) (dedup.RequestRecord, lookRow, error) {
	var r lookRow
	err := row.Scan(&r.got, &r.same, &r.created, &r.state, &r.token, &r.leaseExpires, &r.leaseLeftMs, &r.status, &r.header, &r.body)
	if err != nil {
		return dedup.RequestRecord{}, r, fmt.Errorf("pgstore: claim request: %w", err)
	}
	rec := dedup.RequestRecord{Key: c.Key}
	switch {
	case r.same == nil && r.got:
		rec.Verdict, rec.Token = dedup.VerdictRun, 1 // new, and this transaction holds its lock
		return rec, r, nil
	case r.same == nil:
		rec.Verdict = dedup.VerdictBusy // another transaction is executing it
		return rec, r, nil
	}
	rec.FirstAt = *r.created
	switch {
	case !*r.same:
		rec.Verdict = dedup.VerdictMismatch
		return rec, r, nil
	case r.state == nil:
		return rec, r, fmt.Errorf("%w: %s", dedup.ErrNoRequestRecord, c.Key)
	}
	rec.Token = *r.token
	if r.leaseExpires != nil {
		rec.LeaseExpires = *r.leaseExpires
		rec.LeaseLeft = time.Duration(*r.leaseLeftMs) * time.Millisecond
	}
	if *r.state == "finished" {
		rec.State, rec.Verdict = dedup.StateFinished, dedup.VerdictReplay
		rec.Response = dedup.StoredResponse{Status: int(*r.status), Header: r.header, Body: r.body}
	} else {
		rec.State, rec.Verdict = dedup.StateProcessing, dedup.VerdictBusy
	}
	return rec, r, nil
}

func millis(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return max(d.Milliseconds(), 1)
}

// RunRequest runs a transactional request; see dedup.RequestStore. It adds no
// round trip to the handler's own: BEGIN goes with the look (advisory lock
// and the key's row), and the key's row with its response with COMMIT. The row is inserted
// without ON CONFLICT: should a writer that keeps no lock have committed
// the key meanwhile, the INSERT fails, COMMIT is skipped, and everything
// rolls back.
func (s *Store) RunRequest(ctx context.Context, c dedup.Claim, retention time.Duration,
	fn func(ctx context.Context, tx pgx.Tx) (dedup.StoredResponse, error)) (rec dedup.RequestRecord, err error) {
	if s.cfg.Distributed {
		return rec, ErrDistributedHTTP
	}
	if s.part != nil {
		return rec, ErrPartitionedHTTP
	}
	began := s.now()
	pc, err := s.pool.Acquire(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return rec, err
		}
		s.markLost()
		return rec, connLost(err)
	}
	conn := pc.Conn()
	defer func() {
		// Always, also when fn panicked: a transaction left open rolls
		// back (by COMMIT's pipeline it is closed already), and the
		// connection goes back to the pool, or away when broken.
		if !conn.IsClosed() && conn.PgConn().TxStatus() != 'I' {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), pingTimeout)
			_, _ = conn.Exec(rctx, "rollback")
			cancel()
		}
		closed := conn.IsClosed()
		pc.Release()
		if err == nil || !closed || ctx.Err() != nil {
			return
		}
		if !isContextErr(err) || s.lostSince(began) || !s.answers(ctx) { // as InTx decides
			s.markLost()
			err = connLost(err)
		}
	}()
	// BEGIN and the look in one round trip.
	var b pgx.Batch
	b.BeginTx(pgx.TxOptions{})
	b.Queue(s.http.look, s.lookArgs(c)...)
	br := conn.SendBatch(ctx, &b)
	if _, err = br.Exec(); err == nil {
		rec, _, err = s.verdict(br.QueryRow(), c)
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil || rec.Verdict != dedup.VerdictRun {
		return rec, err // the deferred rollback ends the transaction
	}
	tx := br.Tx()
	rtx := &requestTx{Tx: tx}
	res, err := fn(ctx, rtx)
	rtx.closed.Store(true)
	if err != nil {
		return rec, err
	}
	if err := ctx.Err(); err != nil {
		return rec, err // never commit work whose caller gave up
	}
	// The key's row and COMMIT in one round trip.
	var end pgx.Batch
	end.Queue(s.http.save, c.Key.Scope, c.Key.ID, c.Fingerprint[:], c.Source, millis(retention), res.Status, res.Header, res.Body)
	end.Queue("commit")
	ebr := conn.SendBatch(ctx, &end)
	_, saveErr := ebr.Exec()
	tag, commitErr := ebr.Exec()
	closeErr := ebr.Close()
	var pgErr *pgconn.PgError
	switch {
	case errors.As(saveErr, &pgErr) && pgErr.Code == "23505":
		// Taken meanwhile by a writer without the lock: roll this run back
		// (releasing the key's lock) and answer as the key stands now.
		if _, err := conn.Exec(ctx, "rollback"); err != nil {
			return rec, err
		}
		return s.lookAgain(ctx, c)
	case errors.As(saveErr, &pgErr) && pgErr.Code == "25P02":
		return rec, fmt.Errorf("pgstore: the handler's transaction was aborted by an error it did not return: %w", pgx.ErrTxCommitRollback)
	case saveErr != nil:
		return rec, s.claimErr(saveErr)
	case commitErr != nil:
		return rec, commitErr // the outcome is unknown when the connection died: a retry finds out
	case closeErr != nil:
		return rec, closeErr
	case tag.String() == "ROLLBACK":
		return rec, pgx.ErrTxCommitRollback
	}
	return rec, nil
}

// lookAgain reads a key in a transaction of its own, for a request whose
// run was rolled back because the key was taken.
func (s *Store) lookAgain(ctx context.Context, c dedup.Claim) (rec dedup.RequestRecord, err error) {
	err = s.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		rec, _, err = s.look(ctx, tx, c)
		return err
	})
	if err == nil && rec.Verdict == dedup.VerdictRun {
		rec.Verdict = dedup.VerdictBusy // gone again (purged): let the client retry
	}
	return rec, err
}

// errTxOwned: a handler tried to commit or roll back the transaction of a
// request, which the store ends, with the key.
var errTxOwned = fmt.Errorf("pgstore: commit and rollback of a request's transaction are the store's: %w", dedup.ErrTxEnded)

// requestTx is the transaction a request's handler gets: the real one,
// refusing Commit and Rollback, and refusing everything once the handler
// has returned (the store commits it on the connection, in one round trip
// with the key; pgx's transaction never learns of it).
type requestTx struct {
	pgx.Tx
	closed atomic.Bool
}

func (t *requestTx) ended() error {
	if t.closed.Load() {
		return pgx.ErrTxClosed
	}
	return nil
}

func (t *requestTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if err := t.ended(); err != nil {
		return nil, err
	}
	return t.Tx.Begin(ctx)
}

func (t *requestTx) Commit(context.Context) error   { return errTxOwned }
func (t *requestTx) Rollback(context.Context) error { return errTxOwned }

func (t *requestTx) CopyFrom(ctx context.Context, table pgx.Identifier, cols []string, src pgx.CopyFromSource) (int64, error) {
	if err := t.ended(); err != nil {
		return 0, err
	}
	return t.Tx.CopyFrom(ctx, table, cols, src)
}

func (t *requestTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if err := t.ended(); err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	return t.Tx.SendBatch(ctx, b)
}

func (t *requestTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if err := t.ended(); err != nil {
		return nil, err
	}
	return t.Tx.Prepare(ctx, name, sql)
}

func (t *requestTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if err := t.ended(); err != nil {
		return pgconn.CommandTag{}, err
	}
	return t.Tx.Exec(ctx, sql, args...)
}

func (t *requestTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := t.ended(); err != nil {
		return nil, err
	}
	return t.Tx.Query(ctx, sql, args...)
}

func (t *requestTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if err := t.ended(); err != nil {
		return errRow{err}
	}
	return t.Tx.QueryRow(ctx, sql, args...)
}

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

// AcquireLease takes c.Key under a lease in a transaction of its own; see
// dedup.RequestStore.
func (s *Store) AcquireLease(ctx context.Context, c dedup.Claim, retention, lease time.Duration) (dedup.RequestRecord, error) {
	if s.cfg.Distributed {
		return dedup.RequestRecord{}, ErrDistributedHTTP
	}
	if s.part != nil {
		return dedup.RequestRecord{}, ErrPartitionedHTTP
	}
	var rec dedup.RequestRecord
	err := s.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		var r lookRow
		var err error
		if rec, r, err = s.look(ctx, tx, c); err != nil {
			return err
		}
		switch {
		case rec.Verdict == dedup.VerdictRun:
			var exp time.Time
			err := tx.QueryRow(ctx, s.http.acquire, c.Key.Scope, c.Key.ID, c.Fingerprint[:], c.Source, millis(retention), millis(lease)).Scan(&rec.Token, &exp)
			if errors.Is(err, pgx.ErrNoRows) {
				// Committed after the look by a writer without the lock.
				rec = dedup.RequestRecord{Key: c.Key, Verdict: dedup.VerdictBusy}
				return nil
			}
			if err != nil {
				return s.claimErr(err)
			}
			rec.State, rec.LeaseExpires, rec.LeaseLeft = dedup.StateProcessing, exp, lease
		case rec.Verdict == dedup.VerdictBusy && rec.State == dedup.StateProcessing && rec.LeaseLeft <= 0 && r.got:
			// The lease ran out: take over, growing the token.
			var exp time.Time
			err := tx.QueryRow(ctx, s.http.takeover, c.Key.Scope, c.Key.ID, rec.Token, millis(lease)).Scan(&rec.Token, &exp)
			switch {
			case errors.Is(err, pgx.ErrNoRows): // extended or released meanwhile: still busy
			case err != nil:
				return s.claimErr(fmt.Errorf("take over lease: %w", err))
			default:
				rec.Verdict, rec.Takeover, rec.LeaseExpires, rec.LeaseLeft = dedup.VerdictRun, true, exp, lease
			}
		}
		return nil
	})
	if err != nil {
		return dedup.RequestRecord{}, err
	}
	return rec, nil
}

// leaseWrite runs a statement fenced by a lease's token.
func (s *Store) leaseWrite(ctx context.Context, op, sql string, args ...any) error {
	tag, err := s.pool.Exec(ctx, sql, args...)
	if err != nil {
		return fmt.Errorf("pgstore: %s: %w", op, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("pgstore: %s: %w", op, dedup.ErrLeaseLost)
	}
	return nil
}

// ExtendLease extends a lease if its token still holds; see dedup.RequestStore.
func (s *Store) ExtendLease(ctx context.Context, k dedup.Key, token int64, lease time.Duration) error {
	return s.leaseWrite(ctx, "extend lease", s.http.extend, k.Scope, k.ID, token, millis(lease))
}

// FinishLease stores a leased request's response if its token still holds;
// see dedup.RequestStore.
func (s *Store) FinishLease(ctx context.Context, k dedup.Key, token int64, res dedup.StoredResponse) error {
	return s.leaseWrite(ctx, "finish lease", s.http.finish, k.Scope, k.ID, token, res.Status, res.Header, res.Body)
}

// EndLease ends a lease now if its token still holds; see dedup.RequestStore.
func (s *Store) EndLease(ctx context.Context, k dedup.Key, token int64) error {
	return s.leaseWrite(ctx, "end lease", s.http.end, k.Scope, k.ID, token)
}

// StuckRequests lists processing keys past their lease, through the
// partial index of migration 002; see dedup.RequestStore.
func (s *Store) StuckRequests(ctx context.Context, limit int) ([]dedup.RequestRecord, error) {
	if limit <= 0 {
		return nil, nil
	}
	rows, err := s.pool.Query(ctx, s.http.stuck, limit)
	if err != nil {
		return nil, fmt.Errorf("pgstore: stuck requests: %w", err)
	}
	var out []dedup.RequestRecord
	for rows.Next() {
		rec := dedup.RequestRecord{State: dedup.StateProcessing, Verdict: dedup.VerdictBusy}
		var left int64
		if err := rows.Scan(&rec.Key.Scope, &rec.Key.ID, &rec.Token, &rec.LeaseExpires, &left, &rec.FirstAt); err != nil {
			rows.Close()
			return nil, fmt.Errorf("pgstore: stuck requests: %w", err)
		}
		rec.LeaseLeft = time.Duration(left) * time.Millisecond
		out = append(out, rec)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("pgstore: stuck requests: %w", err)
	}
	return out, nil
}

// CountStuckRequests counts processing keys past their lease by scope,
// through the partial index of migration 002; see dedup.RequestStore.
func (s *Store) CountStuckRequests(ctx context.Context) (map[string]int64, error) {
	rows, err := s.pool.Query(ctx, s.http.countStuck)
	if err != nil {
		return nil, fmt.Errorf("pgstore: count stuck requests: %w", err)
	}
	out := map[string]int64{}
	var scope string
	var n int64
	_, err = pgx.ForEachRow(rows, []any{&scope, &n}, func() error {
		out[scope] = n
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("pgstore: count stuck requests: %w", err)
	}
	return out, nil
}

// ReleaseRequest ends a processing key's lease and grows its token, if
// its token is still token (0: whatever it is); see dedup.RequestStore.
func (s *Store) ReleaseRequest(ctx context.Context, k dedup.Key, token int64) (bool, error) {
	tag, err := s.pool.Exec(ctx, s.http.relse, k.Scope, k.ID, token)
	if err != nil {
		return false, fmt.Errorf("pgstore: release request: %w", err)
	}
	return tag.RowsAffected() > 0, nil
}

var _ dedup.RequestStore[pgx.Tx] = (*Store)(nil)
