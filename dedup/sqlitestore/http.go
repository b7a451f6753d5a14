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

// An HTTP Idempotency-Key (package httpidem) is a row of the dedup table
// like any consumer's key, with columns for the request's state, fencing
// token, lease and stored response, NULL for a consumer's key. One key
// space, one retention, one Purge.
//
// SQLite has one writer: a request's IMMEDIATE transaction waits for the
// one executing the same key to commit, then finds its response. The
// middleware answers a concurrent duplicate in the same process with 409
// before it reaches the database.

// httpColumns are the columns Migrate adds for HTTP requests.
var httpColumns = []string{
	`state TEXT CHECK (state IN ('processing', 'finished'))`,
	`token INTEGER CHECK (token > 0)`,
	`lease_expires_at INTEGER`,
	`status INTEGER CHECK (status BETWEEN 100 AND 999)`,
	`header BLOB`,
	`body BLOB`,
}

type execQuerier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// hasHTTPColumns reports whether the table has the HTTP request columns.
func (s *Store) hasHTTPColumns(ctx context.Context, q execQuerier) (bool, error) {
	var n int
	err := q.QueryRowContext(ctx, `SELECT count(*) FROM pragma_table_info(?) WHERE name = 'state'`, s.cfg.Table).Scan(&n)
	return n > 0, err
}

// migrateHTTP adds the HTTP request columns and the index of leases, in one
// transaction, unless the table has them.
func (s *Store) migrateHTTP(ctx context.Context) error {
	return s.InTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		if ok, err := s.hasHTTPColumns(ctx, tx); err != nil || ok {
			return err
		}
		for _, col := range httpColumns {
			if _, err := tx.ExecContext(ctx, `ALTER TABLE `+s.table+` ADD COLUMN `+col); err != nil {
				return err
			}
		}
		_, err := tx.ExecContext(ctx, `CREATE INDEX IF NOT EXISTS "`+s.cfg.Table+`_lease" ON `+s.table+` (lease_expires_at) WHERE state = 'processing'`)
		return err
	})
}

func retentionArg(d time.Duration) any {
	if d <= 0 {
		return nil
	}
	return max(d.Milliseconds(), 1)
}

// look reads c's key and gives the verdict for a request with c's
// fingerprint.
func (s *Store) look(ctx context.Context, q execQuerier, c dedup.Claim) (httpidem.Record, error) {
	rec := httpidem.Record{Key: c.Key}
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
		rec.Verdict, rec.Token = httpidem.Run, 1
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

// errTaken rolls back a request whose key another writer committed while
// its handler ran.
var errTaken = errors.New("sqlitestore: key taken meanwhile")

// RunRequest runs a transactional request in one IMMEDIATE transaction;
// see httpidem.Store. The transaction holds the database's write lock from
// its start, so nobody else executes the key in this database until it
// ends.
func (s *Store) RunRequest(ctx context.Context, c dedup.Claim, retention time.Duration,
	fn func(ctx context.Context, tx *sql.Tx) (httpidem.Response, error)) (rec httpidem.Record, err error) {
	err = s.InTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		if rec, err = s.look(ctx, tx, c); err != nil || rec.Verdict != httpidem.Run {
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
		if err == nil && rec.Verdict == httpidem.Run {
			rec.Verdict = httpidem.Busy
		}
	}
	return rec, err
}

// AcquireLease takes c.Key under a lease in a transaction of its own; see
// httpidem.Store.
func (s *Store) AcquireLease(ctx context.Context, c dedup.Claim, retention, lease time.Duration) (httpidem.Record, error) {
	var rec httpidem.Record
	ms := max(lease.Milliseconds(), 1)
	err := s.InTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		var err error
		if rec, err = s.look(ctx, tx, c); err != nil {
			return err
		}
		var exp int64
		switch {
		case rec.Verdict == httpidem.Run:
			err = tx.QueryRowContext(ctx, `INSERT INTO `+s.table+` (scope, key, fingerprint, source, expires_at, state, token, lease_expires_at)
VALUES (?, ?, ?, nullif(?, ''), ? + `+nowMillis+`, 'processing', 1, ? + `+nowMillis+`) RETURNING lease_expires_at`,
				c.Key.Scope, c.Key.ID, c.Fingerprint[:], c.Source, retentionArg(retention), ms).Scan(&exp)
			if err != nil {
				return s.wrap("acquire lease", err)
			}
		case rec.Verdict == httpidem.Busy && rec.State == httpidem.Processing && rec.LeaseLeft <= 0:
			// The lease ran out: take over, growing the token.
			err = tx.QueryRowContext(ctx, `UPDATE `+s.table+` SET token = token + 1, lease_expires_at = ? + `+nowMillis+`
WHERE scope = ? AND key = ? AND state = 'processing' AND token = ?
RETURNING token, lease_expires_at`, ms, c.Key.Scope, c.Key.ID, rec.Token).Scan(&rec.Token, &exp)
			if err != nil {
				return s.wrap("take over lease", err)
			}
			rec.Verdict = httpidem.Run
		default:
			return nil
		}
		rec.State, rec.LeaseExpires, rec.LeaseLeft = httpidem.Processing, time.UnixMilli(exp), lease
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
	return s.leaseWrite(ctx, "extend lease", `UPDATE `+s.table+` SET lease_expires_at = ? + `+nowMillis+`
WHERE scope = ? AND key = ? AND token = ? AND state = 'processing'`, max(lease.Milliseconds(), 1), k.Scope, k.ID, token)
}

// FinishLease stores a leased request's response if its token still holds;
// see httpidem.Store.
func (s *Store) FinishLease(ctx context.Context, k dedup.Key, token int64, res httpidem.Response) error {
	return s.leaseWrite(ctx, "finish lease", `UPDATE `+s.table+`
SET state = 'finished', status = ?, header = ?, body = ?, lease_expires_at = NULL
WHERE scope = ? AND key = ? AND token = ? AND state = 'processing'`, res.Status, res.Header, res.Body, k.Scope, k.ID, token)
}

// EndLease ends a lease now if its token still holds; see httpidem.Store.
func (s *Store) EndLease(ctx context.Context, k dedup.Key, token int64) error {
	return s.leaseWrite(ctx, "end lease", `UPDATE `+s.table+` SET lease_expires_at = `+nowMillis+`
WHERE scope = ? AND key = ? AND token = ? AND state = 'processing'`, k.Scope, k.ID, token)
}

// StuckRequests lists processing keys past their lease; see httpidem.Store.
func (s *Store) StuckRequests(ctx context.Context, limit int) ([]httpidem.Record, error) {
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

// ReleaseRequest ends a processing key's lease and grows its token; see
// httpidem.Store.
func (s *Store) ReleaseRequest(ctx context.Context, k dedup.Key) (bool, error) {
	res, err := s.db.ExecContext(ctx, `UPDATE `+s.table+` SET token = token + 1, lease_expires_at = `+nowMillis+`
WHERE scope = ? AND key = ? AND state = 'processing'`, k.Scope, k.ID)
	if err != nil {
		return false, s.wrap("release request", err)
	}
	n, err := res.RowsAffected()
	return n > 0, s.wrap("release request", err)
}

var _ httpidem.Store[*sql.Tx] = (*Store)(nil)
