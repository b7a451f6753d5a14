package sqlitestore

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/idemkit/idem/dedup"
)

// Admin is the store's table seen from outside the consumer, for the idem
// command: counts, lookups, failed rows, releasing them. It implements
// dedup.Admin.
type Admin struct{ s *Store }

// Admin returns the store's dedup.Admin.
func (s *Store) Admin() *Admin { return &Admin{s: s} }

// Migrate is Store.Migrate.
func (a *Admin) Migrate(ctx context.Context) error { return a.s.Migrate(ctx) }

// Purge is Store.Purge.
func (a *Admin) Purge(ctx context.Context, limit int) (int, error) { return a.s.Purge(ctx, limit) }

const rowColumns = `scope, key, fingerprint, outcome, coalesce(reason, ''), coalesce(source, ''), created_at, expires_at`

type querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

func queryRows(ctx context.Context, q querier, query string, args ...any) ([]dedup.Row, error) {
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []dedup.Row
	for rows.Next() {
		var r dedup.Row
		var fp []byte
		var created int64
		var exp sql.NullInt64
		if err := rows.Scan(&r.Key.Scope, &r.Key.ID, &fp, &r.Outcome, &r.Reason, &r.Source, &created, &exp); err != nil {
			return nil, err
		}
		copy(r.Fingerprint[:], fp)
		r.CreatedAt = time.UnixMilli(created)
		if exp.Valid {
			r.ExpiresAt = time.UnixMilli(exp.Int64)
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// Summary counts the rows by scope and outcome, with the oldest of each.
func (a *Admin) Summary(ctx context.Context) ([]dedup.ScopeSummary, error) {
	t := a.s.table
	rows, err := a.s.db.QueryContext(ctx, `SELECT scope, outcome, count(*), coalesce(sum(expires_at < `+nowMillis+`), 0),
    min(created_at), coalesce(max(expires_at - created_at), 0), max(expires_at IS NULL),
    coalesce(sum(state = 'processing'), 0), coalesce(sum(state = 'finished'), 0),
    coalesce(sum(state = 'processing' AND lease_expires_at < `+nowMillis+`), 0)
FROM `+t+` GROUP BY scope, outcome ORDER BY scope, outcome`)
	if err != nil {
		return nil, fmt.Errorf("sqlitestore: summary: %w", err)
	}
	var out []dedup.ScopeSummary
	for rows.Next() {
		var s dedup.ScopeSummary
		var oldest, ret int64
		if err := rows.Scan(&s.Scope, &s.Outcome, &s.Rows, &s.Expired, &oldest, &ret, &s.Forever,
			&s.Processing, &s.Finished, &s.Stuck); err != nil {
			rows.Close()
			return nil, fmt.Errorf("sqlitestore: summary: %w", err)
		}
		s.OldestAt, s.Retention = time.UnixMilli(oldest), time.Duration(ret)*time.Millisecond
		out = append(out, s)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("sqlitestore: summary: %w", err)
	}
	for i := range out {
		s := &out[i]
		err := a.s.db.QueryRowContext(ctx, `SELECT key FROM `+t+` WHERE scope = ? AND outcome = ? ORDER BY created_at, key LIMIT 1`,
			s.Scope, s.Outcome).Scan(&s.OldestKey)
		if err != nil {
			return nil, fmt.Errorf("sqlitestore: summary: %w", err)
		}
	}
	return out, nil
}

// Find returns the rows of id, in scope or in every scope when scope is
// empty.
func (a *Admin) Find(ctx context.Context, scope, id string) ([]dedup.Row, error) {
	out, err := queryRows(ctx, a.s.db, `SELECT `+rowColumns+` FROM `+a.s.table+`
WHERE key = ? AND (? = '' OR scope = ?) ORDER BY scope`, id, scope, scope)
	if err != nil {
		return nil, fmt.Errorf("sqlitestore: find: %w", err)
	}
	return out, nil
}

// Failed lists failed rows, oldest first.
func (a *Admin) Failed(ctx context.Context, f dedup.RowFilter) ([]dedup.Row, error) {
	if f.Limit <= 0 {
		f.Limit = 100
	}
	older, newer := f.OlderThan.Milliseconds(), f.NewerThan.Milliseconds()
	out, err := queryRows(ctx, a.s.db, `SELECT `+rowColumns+` FROM `+a.s.table+`
WHERE outcome = 'failed' AND (? = '' OR scope = ?)
  AND (? = 0 OR created_at <= `+nowMillis+` - ?)
  AND (? = 0 OR created_at >= `+nowMillis+` - ?)
  AND (? = '' OR instr(reason, ?) > 0)
ORDER BY created_at, scope, key LIMIT ?`, f.Scope, f.Scope, older, older, newer, newer, f.Reason, f.Reason, f.Limit)
	if err != nil {
		return nil, fmt.Errorf("sqlitestore: failed: %w", err)
	}
	return out, nil
}

// Release deletes the failed rows of keys in one transaction and returns
// them; a done row is never deleted. With dryRun it returns what it would
// delete.
func (a *Admin) Release(ctx context.Context, keys []dedup.Key, dryRun bool) ([]dedup.Row, error) {
	tx, err := a.s.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("sqlitestore: release: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	q := `SELECT ` + rowColumns + ` FROM ` + a.s.table + ` WHERE outcome = 'failed' AND scope = ? AND key = ?`
	if !dryRun {
		q = `DELETE FROM ` + a.s.table + ` WHERE outcome = 'failed' AND scope = ? AND key = ? RETURNING ` + rowColumns
	}
	var out []dedup.Row
	for _, k := range keys {
		rs, err := queryRows(ctx, tx, q, k.Scope, k.ID)
		if err != nil {
			return nil, fmt.Errorf("sqlitestore: release: %w", err)
		}
		out = append(out, rs...)
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("sqlitestore: release: %w", err)
	}
	return out, nil
}

var _ dedup.Admin = (*Admin)(nil)
