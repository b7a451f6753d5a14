package pgstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/httpidem"
)

// The HTTP Idempotency-Key records (package httpidem) live in a table beside
// the dedup table, Table + "_http" (migration 002): the key itself is a row
// of the dedup table like any consumer's key, its request record — state,
// fencing token, lease, stored response — a row of the sibling, deleted with
// the key (ON DELETE CASCADE), so Purge and retention cover both.
//
// A request claims its key without waiting for another: a transaction-level
// advisory lock on a 64-bit hash of (scope, key), taken with
// pg_try_advisory_xact_lock, says whether another transaction is executing
// the key right now (Busy, 409) before the INSERT could wait on the primary
// key. The lock lives as long as the claiming transaction. Two keys with
// one hash make one of them Busy for a moment, never run twice: the primary
// key decides what is new.

// httpQueries are a store's HTTP statements, built once for its tables.
type httpQueries struct {
	table                                   string // the sibling, schema-qualified and quoted
	claim, acquire, lookup, takeover        string
	save, finish, extend, end, stuck, relse string
}

// lockAndInsert takes the key's advisory lock without waiting (after
// setting the transaction's lock_timeout, $6) and, when it got it, inserts
// the key's dedup row ($1 scope, $2 key, $3 fingerprint, $4 source, $5
// retention in ms, ≤ 0 for ever).
const lockAndInsert = `WITH lock AS MATERIALIZED (
    SELECT pg_try_advisory_xact_lock(hashtextextended($1::text || E'\x1f' || $2::text, 0)) AS got
    FROM (SELECT set_config('lock_timeout', $6::text, true)) AS cfg),
ins AS (
    INSERT INTO %[1]s (scope, key, fingerprint, source, expires_at)
    SELECT $1, $2, $3::bytea, nullif($4::text, ''),
           CASE WHEN $5::bigint > 0 THEN now() + $5::bigint * interval '1 millisecond' END
    FROM lock WHERE got
    ON CONFLICT (scope, key) DO NOTHING
    RETURNING scope, key)`

// recordCols read a key's dedup row d and request record r.
const recordCols = `d.fingerprint = $3::bytea, d.created_at, r.state, r.token, r.lease_expires_at,
    (extract(epoch FROM r.lease_expires_at - now()) * 1000)::bigint, r.status, r.header, r.body`

func newHTTPQueries(t, h string) httpQueries {
	return httpQueries{
		table: h,
		// The dedup row the main query reads is the one committed before
		// the statement began: a row inserted by ins is not visible to it.
		claim: fmt.Sprintf(lockAndInsert+`
SELECT lock.got, EXISTS (SELECT FROM ins), NULL::timestamptz, `+recordCols+`
FROM lock
LEFT JOIN %[1]s d ON d.scope = $1 AND d.key = $2
LEFT JOIN %[2]s r ON r.scope = $1 AND r.key = $2`, t, h),
		acquire: fmt.Sprintf(lockAndInsert+`,
hins AS (
    INSERT INTO %[2]s (scope, key, state, token, lease_expires_at)
    SELECT scope, key, 'processing', 1, now() + $7::bigint * interval '1 millisecond' FROM ins
    RETURNING lease_expires_at)
SELECT lock.got, EXISTS (SELECT FROM hins), (SELECT lease_expires_at FROM hins), `+recordCols+`
FROM lock
LEFT JOIN %[1]s d ON d.scope = $1 AND d.key = $2
LEFT JOIN %[2]s r ON r.scope = $1 AND r.key = $2`, t, h),
		lookup: fmt.Sprintf(`SELECT true, false, NULL::timestamptz, `+recordCols+`
FROM %[1]s d LEFT JOIN %[2]s r ON r.scope = d.scope AND r.key = d.key
WHERE d.scope = $1 AND d.key = $2`, t, h),
		takeover: fmt.Sprintf(`UPDATE %s
SET token = token + 1, lease_expires_at = now() + $4::bigint * interval '1 millisecond', updated_at = now()
WHERE scope = $1 AND key = $2 AND state = 'processing' AND token = $3
  AND (lease_expires_at IS NULL OR lease_expires_at <= now())
RETURNING token, lease_expires_at`, h),
		save: fmt.Sprintf(`INSERT INTO %s (scope, key, state, token, status, header, body)
VALUES ($1, $2, 'finished', 1, $3, $4, $5)`, h),
		finish: fmt.Sprintf(`UPDATE %s
SET state = 'finished', status = $4, header = $5, body = $6, lease_expires_at = NULL, updated_at = now()
WHERE scope = $1 AND key = $2 AND token = $3 AND state = 'processing'`, h),
		extend: fmt.Sprintf(`UPDATE %s
SET lease_expires_at = now() + $4::bigint * interval '1 millisecond', updated_at = now()
WHERE scope = $1 AND key = $2 AND token = $3 AND state = 'processing'`, h),
		end: fmt.Sprintf(`UPDATE %s SET lease_expires_at = now(), updated_at = now()
WHERE scope = $1 AND key = $2 AND token = $3 AND state = 'processing'`, h),
		stuck: fmt.Sprintf(`SELECT r.scope, r.key, r.token, r.lease_expires_at,
    (extract(epoch FROM r.lease_expires_at - now()) * 1000)::bigint, d.created_at
FROM %[2]s r JOIN %[1]s d ON d.scope = r.scope AND d.key = r.key
WHERE r.state = 'processing' AND (r.lease_expires_at IS NULL OR r.lease_expires_at < now())
ORDER BY r.lease_expires_at NULLS FIRST LIMIT $1`, t, h),
		relse: fmt.Sprintf(`UPDATE %s SET token = token + 1, lease_expires_at = now(), updated_at = now()
WHERE scope = $1 AND key = $2 AND state = 'processing'`, h),
	}
}

// HTTPTable returns the sanitized, schema-qualified name of the table of
// HTTP request records (Table + "_http").
func (s *Store) HTTPTable() string { return s.http.table }

// recordRow is one row of the claim, acquire and lookup statements.
type recordRow struct {
	got, inserted bool
	insertedLease *time.Time
	same          *bool
	created       *time.Time
	state         *string
	token         *int64
	leaseExpires  *time.Time
	leaseLeftMs   *int64
	status        *int16
	header, body  []byte
}

func (r *recordRow) scan(row pgx.Row) error {
	return row.Scan(&r.got, &r.inserted, &r.insertedLease, &r.same, &r.created, &r.state, &r.token,
		&r.leaseExpires, &r.leaseLeftMs, &r.status, &r.header, &r.body)
}

// record turns a row into a Record with a verdict. found is false when the
// key was neither inserted nor visible: committed after the statement
// began, to be looked up again.
func (r *recordRow) record(k dedup.Key) (rec httpidem.Record, found bool, err error) {
	rec.Key = k
	switch {
	case r.inserted:
		rec.Verdict, rec.Token = httpidem.Run, 1
		if r.insertedLease != nil {
			rec.State, rec.LeaseExpires = httpidem.Processing, *r.insertedLease
		}
		return rec, true, nil
	case r.same == nil: // no committed row visible
		if !r.got {
			rec.Verdict = httpidem.Busy // another transaction is executing it
			return rec, true, nil
		}
		return rec, false, nil
	}
	rec.FirstAt = *r.created
	if !*r.same {
		rec.Verdict = httpidem.Mismatch
		return rec, true, nil
	}
	if r.state == nil {
		return rec, true, fmt.Errorf("%w: %s", httpidem.ErrNoRecord, k)
	}
	rec.Token = *r.token
	if r.leaseExpires != nil {
		rec.LeaseExpires = *r.leaseExpires
		rec.LeaseLeft = time.Duration(*r.leaseLeftMs) * time.Millisecond
	}
	switch *r.state {
	case "finished":
		rec.State, rec.Verdict = httpidem.Finished, httpidem.Replay
		rec.Response = httpidem.Response{Status: int(*r.status), Header: r.header, Body: r.body}
	default:
		rec.State, rec.Verdict = httpidem.Processing, httpidem.Busy
	}
	return rec, true, nil
}

func millis(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return max(d.Milliseconds(), 1)
}

// ClaimRequest claims c.Key in tx without waiting for another request; see
// httpidem.Store. One statement: the advisory lock, the INSERT, and the
// stored record when the key is known.
func (s *Store) ClaimRequest(ctx context.Context, tx pgx.Tx, c dedup.Claim, retention time.Duration) (httpidem.Record, error) {
	var r recordRow
	err := r.scan(tx.QueryRow(ctx, s.http.claim, c.Key.Scope, c.Key.ID, c.Fingerprint[:], c.Source, millis(retention), s.lockTimeout))
	if err != nil {
		return httpidem.Record{}, s.claimErr(err)
	}
	rec, found, err := r.record(c.Key)
	if !found {
		rec, err = s.lookupRequest(ctx, tx, c)
	}
	return rec, err
}

// lookupRequest reads a key committed after the claim's statement began.
func (s *Store) lookupRequest(ctx context.Context, tx pgx.Tx, c dedup.Claim) (httpidem.Record, error) {
	var r recordRow
	err := r.scan(tx.QueryRow(ctx, s.http.lookup, c.Key.Scope, c.Key.ID, c.Fingerprint[:]))
	if errors.Is(err, pgx.ErrNoRows) {
		// Committed and purged in between, or rolled back by a
		// transaction that did not hold the lock: not ours to run now.
		return httpidem.Record{Key: c.Key, Verdict: httpidem.Busy}, nil
	}
	if err != nil {
		return httpidem.Record{}, s.claimErr(err)
	}
	rec, _, err := r.record(c.Key)
	return rec, err
}

// SaveResponse stores the response of a key claimed in tx; see
// httpidem.Store.
func (s *Store) SaveResponse(ctx context.Context, tx pgx.Tx, k dedup.Key, res httpidem.Response) error {
	if _, err := tx.Exec(ctx, s.http.save, k.Scope, k.ID, res.Status, res.Header, res.Body); err != nil {
		return fmt.Errorf("pgstore: save response: %w", err)
	}
	return nil
}

// AcquireLease takes c.Key under a lease in a transaction of its own; see
// httpidem.Store.
func (s *Store) AcquireLease(ctx context.Context, c dedup.Claim, retention, lease time.Duration) (httpidem.Record, error) {
	var rec httpidem.Record
	err := s.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		var r recordRow
		err := r.scan(tx.QueryRow(ctx, s.http.acquire, c.Key.Scope, c.Key.ID, c.Fingerprint[:], c.Source,
			millis(retention), s.lockTimeout, millis(lease)))
		if err != nil {
			return s.claimErr(err)
		}
		var found bool
		if rec, found, err = r.record(c.Key); err != nil {
			return err
		}
		if !found {
			if rec, err = s.lookupRequest(ctx, tx, c); err != nil {
				return err
			}
		}
		if rec.Verdict == httpidem.Busy && rec.State == httpidem.Processing && rec.LeaseLeft <= 0 && r.got {
			// The lease ran out: take over, growing the token.
			var exp time.Time
			err := tx.QueryRow(ctx, s.http.takeover, c.Key.Scope, c.Key.ID, rec.Token, millis(lease)).Scan(&rec.Token, &exp)
			switch {
			case errors.Is(err, pgx.ErrNoRows): // extended or released meanwhile
			case err != nil:
				return fmt.Errorf("pgstore: take over lease: %w", err)
			default:
				rec.Verdict, rec.LeaseExpires, rec.LeaseLeft = httpidem.Run, exp, lease
			}
		}
		if rec.Verdict == httpidem.Run && rec.LeaseLeft == 0 {
			rec.LeaseLeft = lease
		}
		return nil
	})
	if err != nil {
		return httpidem.Record{}, err
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
		return fmt.Errorf("pgstore: %s: %w", op, httpidem.ErrLeaseLost)
	}
	return nil
}

// ExtendLease extends a lease if its token still holds; see httpidem.Store.
func (s *Store) ExtendLease(ctx context.Context, k dedup.Key, token int64, lease time.Duration) error {
	return s.leaseWrite(ctx, "extend lease", s.http.extend, k.Scope, k.ID, token, millis(lease))
}

// FinishLease stores a leased request's response if its token still holds;
// see httpidem.Store.
func (s *Store) FinishLease(ctx context.Context, k dedup.Key, token int64, res httpidem.Response) error {
	return s.leaseWrite(ctx, "finish lease", s.http.finish, k.Scope, k.ID, token, res.Status, res.Header, res.Body)
}

// EndLease ends a lease now if its token still holds; see httpidem.Store.
func (s *Store) EndLease(ctx context.Context, k dedup.Key, token int64) error {
	return s.leaseWrite(ctx, "end lease", s.http.end, k.Scope, k.ID, token)
}

// StuckRequests lists Processing keys past their lease; see httpidem.Store.
func (s *Store) StuckRequests(ctx context.Context, limit int) ([]httpidem.Record, error) {
	if limit <= 0 {
		return nil, nil
	}
	rows, err := s.pool.Query(ctx, s.http.stuck, limit)
	if err != nil {
		return nil, fmt.Errorf("pgstore: stuck requests: %w", err)
	}
	var out []httpidem.Record
	for rows.Next() {
		rec := httpidem.Record{State: httpidem.Processing, Verdict: httpidem.Busy}
		var exp *time.Time
		var left *int64
		if err := rows.Scan(&rec.Key.Scope, &rec.Key.ID, &rec.Token, &exp, &left, &rec.FirstAt); err != nil {
			rows.Close()
			return nil, fmt.Errorf("pgstore: stuck requests: %w", err)
		}
		if exp != nil {
			rec.LeaseExpires, rec.LeaseLeft = *exp, time.Duration(*left)*time.Millisecond
		}
		out = append(out, rec)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("pgstore: stuck requests: %w", err)
	}
	return out, nil
}

// ReleaseRequest ends a Processing key's lease and grows its token; see
// httpidem.Store.
func (s *Store) ReleaseRequest(ctx context.Context, k dedup.Key) (bool, error) {
	tag, err := s.pool.Exec(ctx, s.http.relse, k.Scope, k.ID)
	if err != nil {
		return false, fmt.Errorf("pgstore: release request: %w", err)
	}
	return tag.RowsAffected() > 0, nil
}

var _ httpidem.Store[pgx.Tx] = (*Store)(nil)
