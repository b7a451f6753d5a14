package sqlitestore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/httpidem"
)

// The HTTP Idempotency-Key records (package httpidem) live in a table beside
// the dedup table, Table + "_http": the key is a row of the dedup table like
// any consumer's key, its request record — state, fencing token, lease,
// stored response — a row of the sibling. A trigger deletes the record with
// its key, so Purge and retention cover both, whether or not the
// connection enforces foreign keys.
//
// SQLite has one writer: a request's IMMEDIATE transaction waits for the
// one executing the same key to commit, then finds its response. The
// middleware answers a concurrent duplicate in the same process with 409
// before it reaches the database.

func (s *Store) httpTable() string { return `"` + s.cfg.Table + `_http"` }

// httpDDL creates the request records' table, its index of leases and the
// trigger that deletes a record with its key.
func (s *Store) httpDDL() string {
	h := s.httpTable()
	return `CREATE TABLE IF NOT EXISTS ` + h + ` (
    scope            TEXT    NOT NULL,
    key              TEXT    NOT NULL,
    state            TEXT    NOT NULL CHECK (state IN ('processing', 'finished')),
    token            INTEGER NOT NULL DEFAULT 1 CHECK (token > 0),
    lease_expires_at INTEGER,
    status           INTEGER CHECK (status BETWEEN 100 AND 999),
    header           BLOB,
    body             BLOB,
    updated_at       INTEGER NOT NULL DEFAULT (` + nowMillis + `),
    PRIMARY KEY (scope, key),
    CHECK (state = 'processing' OR status IS NOT NULL)
);
CREATE INDEX IF NOT EXISTS "` + s.cfg.Table + `_http_lease" ON ` + h + ` (lease_expires_at) WHERE state = 'processing';
CREATE TRIGGER IF NOT EXISTS "` + s.cfg.Table + `_http_delete" AFTER DELETE ON ` + s.table + ` BEGIN
    DELETE FROM ` + h + ` WHERE scope = OLD.scope AND key = OLD.key;
END;`
}

// HTTPTable returns the quoted name of the table of HTTP request records.
func (s *Store) HTTPTable() string { return s.httpTable() }

// querier is a *sql.Tx or *sql.DB.
type querier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

func retentionArg(d time.Duration) any {
	if d <= 0 {
		return nil
	}
	return max(d.Milliseconds(), 1)
}

// insertKey inserts the key's dedup row and reports whether it was new.
func (s *Store) insertKey(ctx context.Context, q querier, c dedup.Claim, retention time.Duration) (bool, error) {
	var one int
	err := q.QueryRowContext(ctx, `INSERT INTO `+s.table+` (scope, key, fingerprint, source, expires_at)
VALUES (?, ?, ?, nullif(?, ''), ? + `+nowMillis+`) ON CONFLICT (scope, key) DO NOTHING RETURNING 1`,
		c.Key.Scope, c.Key.ID, c.Fingerprint[:], c.Source, retentionArg(retention)).Scan(&one)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return false, nil
	case err != nil:
		return false, s.wrap("claim request", err)
	}
	return true, nil
}

// lookup reads a known key's row and record, with the verdict for a request
// with c's fingerprint.
func (s *Store) lookup(ctx context.Context, q querier, c dedup.Claim) (httpidem.Record, error) {
	rec := httpidem.Record{Key: c.Key}
	var fp []byte
	var created int64
	var state sql.NullString
	var token, leaseExp, leaseLeft, status sql.NullInt64
	var header, body []byte
	err := q.QueryRowContext(ctx, `SELECT d.fingerprint, d.created_at, r.state, r.token, r.lease_expires_at,
    r.lease_expires_at - `+nowMillis+`, r.status, r.header, r.body
FROM `+s.table+` d LEFT JOIN `+s.httpTable()+` r ON r.scope = d.scope AND r.key = d.key
WHERE d.scope = ? AND d.key = ?`, c.Key.Scope, c.Key.ID).Scan(&fp, &created, &state, &token, &leaseExp, &leaseLeft, &status, &header, &body)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		rec.Verdict = httpidem.Busy // purged in between
		return rec, nil
	case err != nil:
		return rec, s.wrap("claim request", err)
	}
	rec.FirstAt = time.UnixMilli(created)
	switch {
	case string(fp) != string(c.Fingerprint[:]):
		rec.Verdict = httpidem.Mismatch
		return rec, nil
	case !state.Valid:
		return rec, fmt.Errorf("%w: %s", httpidem.ErrNoRecord, c.Key)
	}
	rec.Token = token.Int64
	if leaseExp.Valid {
		rec.LeaseExpires = time.UnixMilli(leaseExp.Int64)
		rec.LeaseLeft = time.Duration(leaseLeft.Int64) * time.Millisecond
	}
	if state.String == "finished" {
		rec.State, rec.Verdict = httpidem.Finished, httpidem.Replay
		rec.Response = httpidem.Response{Status: int(status.Int64), Header: header, Body: body}
	} else {
		rec.State, rec.Verdict = httpidem.Processing, httpidem.Busy
	}
	return rec, nil
}

// ClaimRequest claims c.Key in tx; see httpidem.Store. The IMMEDIATE
// transaction already holds the database's write lock, so nobody else is
// executing the key in this database.
func (s *Store) ClaimRequest(ctx context.Context, tx *sql.Tx, c dedup.Claim, retention time.Duration) (httpidem.Record, error) {
	inserted, err := s.insertKey(ctx, tx, c, retention)
	if err != nil {
		return httpidem.Record{}, err
	}
	if inserted {
		return httpidem.Record{Key: c.Key, Verdict: httpidem.Run, Token: 1}, nil
	}
	return s.lookup(ctx, tx, c)
}

// SaveResponse stores the response of a key claimed in tx; see
// httpidem.Store.
func (s *Store) SaveResponse(ctx context.Context, tx *sql.Tx, k dedup.Key, res httpidem.Response) error {
	_, err := tx.ExecContext(ctx, `INSERT INTO `+s.httpTable()+` (scope, key, state, token, status, header, body)
VALUES (?, ?, 'finished', 1, ?, ?, ?)`, k.Scope, k.ID, res.Status, res.Header, res.Body)
	return s.wrap("save response", err)
}

// AcquireLease takes c.Key under a lease in a transaction of its own; see
// httpidem.Store.
func (s *Store) AcquireLease(ctx context.Context, c dedup.Claim, retention, lease time.Duration) (httpidem.Record, error) {
	var rec httpidem.Record
	ms := max(lease.Milliseconds(), 1)
	err := s.InTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		inserted, err := s.insertKey(ctx, tx, c, retention)
		if err != nil {
			return err
		}
		if inserted {
			var exp int64
			if err := tx.QueryRowContext(ctx, `INSERT INTO `+s.httpTable()+` (scope, key, state, token, lease_expires_at)
VALUES (?, ?, 'processing', 1, ? + `+nowMillis+`) RETURNING lease_expires_at`, c.Key.Scope, c.Key.ID, ms).Scan(&exp); err != nil {
				return s.wrap("acquire lease", err)
			}
			rec = httpidem.Record{Key: c.Key, Verdict: httpidem.Run, State: httpidem.Processing, Token: 1,
				LeaseExpires: time.UnixMilli(exp), LeaseLeft: lease}
			return nil
		}
		if rec, err = s.lookup(ctx, tx, c); err != nil {
			return err
		}
		if rec.Verdict != httpidem.Busy || rec.State != httpidem.Processing || rec.LeaseLeft > 0 {
			return nil
		}
		// The lease ran out: take over, growing the token.
		var exp int64
		err = tx.QueryRowContext(ctx, `UPDATE `+s.httpTable()+`
SET token = token + 1, lease_expires_at = ? + `+nowMillis+`, updated_at = `+nowMillis+`
WHERE scope = ? AND key = ? AND state = 'processing' AND token = ?
RETURNING token, lease_expires_at`, ms, c.Key.Scope, c.Key.ID, rec.Token).Scan(&rec.Token, &exp)
		if err != nil {
			return s.wrap("take over lease", err)
		}
		rec.Verdict, rec.LeaseExpires, rec.LeaseLeft = httpidem.Run, time.UnixMilli(exp), lease
		return nil
	})
	if err != nil {
		return httpidem.Record{}, err
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
		return fmt.Errorf("sqlitestore: %s: %w", op, httpidem.ErrLeaseLost)
	}
	return nil
}

// ExtendLease extends a lease if its token still holds; see httpidem.Store.
func (s *Store) ExtendLease(ctx context.Context, k dedup.Key, token int64, lease time.Duration) error {
	return s.leaseWrite(ctx, "extend lease", `UPDATE `+s.httpTable()+`
SET lease_expires_at = ? + `+nowMillis+`, updated_at = `+nowMillis+`
WHERE scope = ? AND key = ? AND token = ? AND state = 'processing'`, max(lease.Milliseconds(), 1), k.Scope, k.ID, token)
}

// FinishLease stores a leased request's response if its token still holds;
// see httpidem.Store.
func (s *Store) FinishLease(ctx context.Context, k dedup.Key, token int64, res httpidem.Response) error {
	return s.leaseWrite(ctx, "finish lease", `UPDATE `+s.httpTable()+`
SET state = 'finished', status = ?, header = ?, body = ?, lease_expires_at = NULL, updated_at = `+nowMillis+`
WHERE scope = ? AND key = ? AND token = ? AND state = 'processing'`, res.Status, res.Header, res.Body, k.Scope, k.ID, token)
}

// EndLease ends a lease now if its token still holds; see httpidem.Store.
func (s *Store) EndLease(ctx context.Context, k dedup.Key, token int64) error {
	return s.leaseWrite(ctx, "end lease", `UPDATE `+s.httpTable()+`
SET lease_expires_at = `+nowMillis+`, updated_at = `+nowMillis+`
WHERE scope = ? AND key = ? AND token = ? AND state = 'processing'`, k.Scope, k.ID, token)
}

// StuckRequests lists Processing keys past their lease; see httpidem.Store.
func (s *Store) StuckRequests(ctx context.Context, limit int) ([]httpidem.Record, error) {
	if limit <= 0 {
		return nil, nil
	}
	rows, err := s.db.QueryContext(ctx, `SELECT r.scope, r.key, r.token, coalesce(r.lease_expires_at, 0),
    coalesce(r.lease_expires_at, 0) - `+nowMillis+`, d.created_at
FROM `+s.httpTable()+` r JOIN `+s.table+` d ON d.scope = r.scope AND d.key = r.key
WHERE r.state = 'processing' AND coalesce(r.lease_expires_at, 0) < `+nowMillis+`
ORDER BY coalesce(r.lease_expires_at, 0) LIMIT ?`, limit)
	if err != nil {
		return nil, s.wrap("stuck requests", err)
	}
	defer rows.Close()
	var out []httpidem.Record
	for rows.Next() {
		rec := httpidem.Record{State: httpidem.Processing, Verdict: httpidem.Busy}
		var exp, left, created int64
		if err := rows.Scan(&rec.Key.Scope, &rec.Key.ID, &rec.Token, &exp, &left, &created); err != nil {
			return nil, s.wrap("stuck requests", err)
		}
		rec.LeaseExpires, rec.LeaseLeft, rec.FirstAt = time.UnixMilli(exp), time.Duration(left)*time.Millisecond, time.UnixMilli(created)
		out = append(out, rec)
	}
	return out, s.wrap("stuck requests", rows.Err())
}

// ReleaseRequest ends a Processing key's lease and grows its token; see
// httpidem.Store.
func (s *Store) ReleaseRequest(ctx context.Context, k dedup.Key) (bool, error) {
	res, err := s.db.ExecContext(ctx, `UPDATE `+s.httpTable()+`
SET token = token + 1, lease_expires_at = `+nowMillis+`, updated_at = `+nowMillis+`
WHERE scope = ? AND key = ? AND state = 'processing'`, k.Scope, k.ID)
	if err != nil {
		return false, s.wrap("release request", err)
	}
	n, err := res.RowsAffected()
	return n > 0, s.wrap("release request", err)
}

var _ httpidem.Store[*sql.Tx] = (*Store)(nil)
