package sqlitestore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/idem/dedup"
)

// An HTTP Idempotency-Key (package httpidem) is a row of the dedup table
// like any consumer's key, with columns for the request's state, fencing
// token, lease and stored response, NULL for a consumer's key. One key
// space, one retention, one Purge.
//
// SQLite has one writer: a request's IMMEDIATE transaction waits for the
// one executing the same key to commit, then finds its response. The
// middleware answers a concurrent duplicate in the same process with 409
// before it reaches the database. A wait for the write lock that runs out
// is dedup.ErrStoreBusy: the lock is the database's, whichever key its
// holder executes.
//
// Leases and the rows that hold them (DESIGN.md §8): acquiring, taking over
// and extending a lease push the row's expires_at to the lease's end when it
// is earlier, and Purge skips a processing row whose lease runs. Tokens
// only grow, also across a purge: every token a lease gets is drawn from
// one counter row (table <table>_tokens), incremented in the transaction
// that writes the token. SQLite's one writer orders those transactions, so
// a key claimed again after its row was purged gets a token larger than
// all it had. Migration 003 seeds the counter with the largest token stored.

type execQuerier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// nextToken draws a lease token in tx: larger than every one drawn before.
func (s *Store) nextToken(ctx context.Context, tx *sql.Tx) (int64, error) {
	var n int64
	err := tx.QueryRowContext(ctx, `UPDATE `+s.tokens+` SET last = last + 1 WHERE id = 1 RETURNING last`).Scan(&n)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, fmt.Errorf("%w: sqlitestore: %s has no row: call Store.Migrate", dedup.ErrNotMigrated, s.tokens)
	}
	return n, err
}

func retentionArg(d time.Duration) any {
	if d <= 0 {
		return nil
	}
	return max(d.Milliseconds(), 1)
}

// look reads c's key and gives the verdict for a request with c's
// fingerprint.
func (s *Store) look(ctx context.Context, q execQuerier, c dedup.Claim) (dedup.RequestRecord, error) {
	rec := dedup.RequestRecord{Key: c.Key}
	var fp []byte
	var created int64
	var state sql.NullString
	var token, leaseExp, leaseLeft, status sql.NullInt64
	var header, body []byte
	err := q.QueryRowContext(ctx, `SELECT fingerprint, created_at, state, token, lease_expires_at,
    lease_expires_at - `+nowMillis+`, status, header, body
FROM `+s.table+` WHERE scope = ? AND key = ?`, c.Key.Scope, c.Key.ID).Scan(&fp, &created, &state, &token, &leaseExp, &leaseLeft, &status, &header, &body)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		rec.Verdict, rec.Token = dedup.VerdictRun, 1
		return rec, nil
	case err != nil:
		return rec, s.wrap("claim request", err)
	}
	rec.FirstAt = time.UnixMilli(created)
	switch {
	case string(fp) != string(c.Fingerprint[:]):
		rec.Verdict = dedup.VerdictMismatch
		return rec, nil
	case !state.Valid:
		return rec, fmt.Errorf("%w: %s", dedup.ErrNoRequestRecord, c.Key)
	}
	rec.Token = token.Int64
	if leaseExp.Valid {
		rec.LeaseExpires = time.UnixMilli(leaseExp.Int64)
		rec.LeaseLeft = time.Duration(leaseLeft.Int64) * time.Millisecond
	}
	if state.String == "finished" {
		rec.State, rec.Verdict = dedup.StateFinished, dedup.VerdictReplay
		rec.Response = dedup.StoredResponse{Status: int(status.Int64), Header: header, Body: body}
	} else {
		rec.State, rec.Verdict = dedup.StateProcessing, dedup.VerdictBusy
	}
	return rec, nil
}

// errTaken rolls back a request whose key another writer committed while
// its handler ran.
var errTaken = errors.New("sqlitestore: key taken meanwhile")

// RunRequest runs a transactional request in one IMMEDIATE transaction;
// see dedup.RequestStore. The transaction holds the database's write lock from
// its start, so nobody else executes the key in this database until it
// ends.
func (s *Store) RunRequest(ctx context.Context, c dedup.Claim, retention time.Duration,
	fn func(ctx context.Context, tx *sql.Tx) (dedup.StoredResponse, error)) (rec dedup.RequestRecord, err error) {
	err = s.InTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		if rec, err = s.look(ctx, tx, c); err != nil || rec.Verdict != dedup.VerdictRun {
			return err // nothing written: the commit is empty
		}
		res, err := fn(ctx, tx)
		if err != nil {
			return err
		}
		r, err := tx.ExecContext(ctx, `INSERT INTO `+s.table+` (scope, key, fingerprint, source, expires_at, state, token, status, header, body)
VALUES (?, ?, ?, nullif(?, ''), ? + `+nowMillis+`, 'finished', 1, ?, ?, ?) ON CONFLICT (scope, key) DO NOTHING`,
			c.Key.Scope, c.Key.ID, c.Fingerprint[:], c.Source, retentionArg(retention), res.Status, res.Header, res.Body)
		if err != nil {
			return s.wrap("save response", err)
		}
		if n, err := r.RowsAffected(); err != nil {
			return s.wrap("save response", err)
		} else if n == 0 {
			return errTaken // written by fn itself, through another entry point
		}
		return nil
	})
	if errors.Is(err, errTaken) {
		err = s.InTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
			rec, err = s.look(ctx, tx, c)
			return err
		})
		if err == nil && rec.Verdict == dedup.VerdictRun {
			rec.Verdict = dedup.VerdictBusy
		}
	}
	return rec, err
}

// AcquireLease takes c.Key under a lease in a transaction of its own; see
// dedup.RequestStore.
func (s *Store) AcquireLease(ctx context.Context, c dedup.Claim, retention, lease time.Duration) (dedup.RequestRecord, error) {
	var rec dedup.RequestRecord
	ms := max(lease.Milliseconds(), 1)
	err := s.InTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		var err error
		if rec, err = s.look(ctx, tx, c); err != nil {
			return err
		}
		taking := rec.Verdict == dedup.VerdictBusy && rec.State == dedup.StateProcessing && rec.LeaseLeft <= 0
		if rec.Verdict != dedup.VerdictRun && !taking {
			return nil
		}
		token, err := s.nextToken(ctx, tx)
		if err != nil {
			return s.wrap("acquire lease", err)
		}
		var exp int64
		if taking {
			// The lease ran out: take over, growing the token. max() of a
			// NULL expires_at is NULL: a row kept for ever stays so.
			err = tx.QueryRowContext(ctx, `UPDATE `+s.table+`
SET token = max(token + 1, ?), lease_expires_at = ? + `+nowMillis+`, expires_at = max(expires_at, ? + `+nowMillis+`)
WHERE scope = ? AND key = ? AND state = 'processing' AND token = ?
RETURNING token, lease_expires_at`, token, ms, ms, c.Key.Scope, c.Key.ID, rec.Token).Scan(&rec.Token, &exp)
			if err != nil {
				return s.wrap("take over lease", err)
			}
			rec.Verdict, rec.Takeover = dedup.VerdictRun, true
		} else {
			err = tx.QueryRowContext(ctx, `INSERT INTO `+s.table+` (scope, key, fingerprint, source, expires_at, state, token, lease_expires_at)
VALUES (?, ?, ?, nullif(?, ''), max(?, ?) + `+nowMillis+`, 'processing', ?, ? + `+nowMillis+`) RETURNING token, lease_expires_at`,
				c.Key.Scope, c.Key.ID, c.Fingerprint[:], c.Source, retentionArg(retention), ms, token, ms).Scan(&rec.Token, &exp)
			if err != nil {
				return s.wrap("acquire lease", err)
			}
		}
		rec.State, rec.LeaseExpires, rec.LeaseLeft = dedup.StateProcessing, time.UnixMilli(exp), lease
		return nil
	})
	if err != nil {
		return dedup.RequestRecord{}, err
	}
	return rec, nil
}

// leaseWrite runs a statement fenced by a lease's token.
func (s *Store) leaseWrite(ctx context.Context, op, query string, args ...any) error {
	res, err := s.db.ExecContext(ctx, query, args...)
	if err != nil {
		return s.wrap(op, err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return s.wrap(op, err)
	} else if n == 0 {
		return fmt.Errorf("sqlitestore: %s: %w", op, dedup.ErrLeaseLost)
	}
	return nil
}

// ExtendLease extends a lease if its token still holds; see dedup.RequestStore.
func (s *Store) ExtendLease(ctx context.Context, k dedup.Key, token int64, lease time.Duration) error {
	ms := max(lease.Milliseconds(), 1)
	return s.leaseWrite(ctx, "extend lease", `UPDATE `+s.table+`
SET lease_expires_at = ? + `+nowMillis+`, expires_at = max(expires_at, ? + `+nowMillis+`)
WHERE scope = ? AND key = ? AND token = ? AND state = 'processing'`, ms, ms, k.Scope, k.ID, token)
}

// FinishLease stores a leased request's response if its token still holds;
// see dedup.RequestStore.
func (s *Store) FinishLease(ctx context.Context, k dedup.Key, token int64, res dedup.StoredResponse) error {
	return s.leaseWrite(ctx, "finish lease", `UPDATE `+s.table+`
SET state = 'finished', status = ?, header = ?, body = ?, lease_expires_at = NULL
WHERE scope = ? AND key = ? AND token = ? AND state = 'processing'`, res.Status, res.Header, res.Body, k.Scope, k.ID, token)
}

// EndLease ends a lease now if its token still holds; see dedup.RequestStore.
func (s *Store) EndLease(ctx context.Context, k dedup.Key, token int64) error {
	return s.leaseWrite(ctx, "end lease", `UPDATE `+s.table+` SET lease_expires_at = `+nowMillis+`
WHERE scope = ? AND key = ? AND token = ? AND state = 'processing'`, k.Scope, k.ID, token)
}

// StuckRequests lists processing keys past their lease; see dedup.RequestStore.
func (s *Store) StuckRequests(ctx context.Context, limit int) ([]dedup.RequestRecord, error) {
	if limit <= 0 {
		return nil, nil
	}
	rows, err := s.db.QueryContext(ctx, `SELECT scope, key, token, lease_expires_at, lease_expires_at - `+nowMillis+`, created_at
FROM `+s.table+` WHERE state = 'processing' AND lease_expires_at < `+nowMillis+`
ORDER BY lease_expires_at LIMIT ?`, limit)
	if err != nil {
		return nil, s.wrap("stuck requests", err)
	}
	defer rows.Close()
	var out []dedup.RequestRecord
	for rows.Next() {
		rec := dedup.RequestRecord{State: dedup.StateProcessing, Verdict: dedup.VerdictBusy}
		var exp, left, created int64
		if err := rows.Scan(&rec.Key.Scope, &rec.Key.ID, &rec.Token, &exp, &left, &created); err != nil {
			return nil, s.wrap("stuck requests", err)
		}
		rec.LeaseExpires, rec.LeaseLeft, rec.FirstAt = time.UnixMilli(exp), time.Duration(left)*time.Millisecond, time.UnixMilli(created)
		out = append(out, rec)
	}
	return out, s.wrap("stuck requests", rows.Err())
}

// CountStuckRequests counts processing keys past their lease by scope; see
// dedup.RequestStore.
func (s *Store) CountStuckRequests(ctx context.Context) (map[string]int64, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT scope, count(*) FROM `+s.table+`
WHERE state = 'processing' AND lease_expires_at < `+nowMillis+` GROUP BY scope`)
	if err != nil {
		return nil, s.wrap("count stuck requests", err)
	}
	defer rows.Close()
	out := map[string]int64{}
	for rows.Next() {
		var scope string
		var n int64
		if err := rows.Scan(&scope, &n); err != nil {
			return nil, s.wrap("count stuck requests", err)
		}
		out[scope] = n
	}
	return out, s.wrap("count stuck requests", rows.Err())
}

// ReleaseRequest ends a processing key's lease and grows its token, if
// its token is still token (0: whatever it is); see dedup.RequestStore.
func (s *Store) ReleaseRequest(ctx context.Context, k dedup.Key, token int64) (released bool, err error) {
	err = s.InTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		next, err := s.nextToken(ctx, tx)
		if err != nil {
			return err
		}
		res, err := tx.ExecContext(ctx, `UPDATE `+s.table+` SET token = max(token + 1, ?), lease_expires_at = `+nowMillis+`
WHERE scope = ? AND key = ? AND state = 'processing' AND (? = 0 OR token = ?)`, next, k.Scope, k.ID, token, token)
		if err != nil {
			return err
		}
		n, err := res.RowsAffected()
		released = n > 0
		return err
	})
	return released, s.wrap("release request", err)
}

var _ dedup.RequestStore[*sql.Tx] = (*Store)(nil)
