package pgstore

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

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

// rowColumns reads a row; a row kept for ever expires at NULL, or at
// 'infinity' in partitioned mode (partitions.go).
const rowColumns = `scope, key, fingerprint, outcome, coalesce(reason, ''), coalesce(source, ''), created_at, nullif(expires_at, 'infinity')`

func scanRows(rows pgx.Rows) ([]dedup.Row, error) {
	defer rows.Close()
	var out []dedup.Row
	for rows.Next() {
		var r dedup.Row
		var fp []byte
		var exp *time.Time
		if err := rows.Scan(&r.Key.Scope, &r.Key.ID, &fp, &r.Outcome, &r.Reason, &r.Source, &r.CreatedAt, &exp); err != nil {
			return nil, err
		}
		copy(r.Fingerprint[:], fp)
		if exp != nil {
			r.ExpiresAt = *exp
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// Summary counts the rows by scope and outcome, with the oldest of each.
func (a *Admin) Summary(ctx context.Context) ([]dedup.ScopeSummary, error) {
	t := a.s.table
	rows, err := a.s.pool.Query(ctx, `WITH oldest AS (
    SELECT DISTINCT ON (scope, outcome) scope, outcome, key FROM `+t+` ORDER BY scope, outcome, created_at, key)
SELECT s.scope, s.outcome, s.n, s.expired, s.oldest_at, o.key, s.retention_ms, s.forever, s.processing, s.finished, s.stuck
FROM (SELECT scope, outcome, count(*) AS n, count(*) FILTER (WHERE expires_at < now()) AS expired,
             min(created_at) AS oldest_at,
             coalesce(max(extract(epoch FROM nullif(expires_at, 'infinity') - created_at) * 1000), 0)::int8 AS retention_ms,
             bool_or(expires_at IS NULL OR expires_at = 'infinity') AS forever,
             count(*) FILTER (WHERE state = 'processing') AS processing,
             count(*) FILTER (WHERE state = 'finished') AS finished,
             count(*) FILTER (WHERE state = 'processing' AND lease_expires_at < now()) AS stuck
      FROM `+t+` GROUP BY scope, outcome) s
JOIN oldest o USING (scope, outcome)
ORDER BY s.scope, s.outcome`)
	if err != nil {
		return nil, fmt.Errorf("pgstore: summary: %w", err)
	}
	defer rows.Close()
	var out []dedup.ScopeSummary
	for rows.Next() {
		var s dedup.ScopeSummary
		var ms int64
		if err := rows.Scan(&s.Scope, &s.Outcome, &s.Rows, &s.Expired, &s.OldestAt, &s.OldestKey, &ms, &s.Forever, &s.Processing, &s.Finished, &s.Stuck); err != nil {
			return nil, fmt.Errorf("pgstore: summary: %w", err)
		}
		s.Retention = time.Duration(ms) * time.Millisecond
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("pgstore: summary: %w", err)
	}
	return out, nil
}

// Find returns the rows of id, in scope or in every scope when scope is
// empty (a scan of the table: the primary key starts with the scope).
func (a *Admin) Find(ctx context.Context, scope, id string) ([]dedup.Row, error) {
	rows, err := a.s.pool.Query(ctx, `SELECT `+rowColumns+` FROM `+a.s.table+`
WHERE key = $1 AND ($2 = '' OR scope = $2) ORDER BY scope`, id, scope)
	if err != nil {
		return nil, fmt.Errorf("pgstore: find: %w", err)
	}
	out, err := scanRows(rows)
	if err != nil {
		return nil, fmt.Errorf("pgstore: find: %w", err)
	}
	return out, nil
}

// Failed lists failed rows, oldest first.
func (a *Admin) Failed(ctx context.Context, f dedup.RowFilter) ([]dedup.Row, error) {
	if f.Limit <= 0 {
		f.Limit = 100
	}
	rows, err := a.s.pool.Query(ctx, `SELECT `+rowColumns+` FROM `+a.s.table+`
WHERE outcome = 'failed' AND ($1 = '' OR scope = $1)
  AND ($2::int8 = 0 OR created_at <= now() - $2::int8 * interval '1 millisecond')
  AND ($3::int8 = 0 OR created_at >= now() - $3::int8 * interval '1 millisecond')
  AND ($4 = '' OR strpos(reason, $4) > 0)
ORDER BY created_at, scope, key LIMIT $5`, f.Scope, f.OlderThan.Milliseconds(), f.NewerThan.Milliseconds(), f.Reason, f.Limit)
	if err != nil {
		return nil, fmt.Errorf("pgstore: failed: %w", err)
	}
	out, err := scanRows(rows)
	if err != nil {
		return nil, fmt.Errorf("pgstore: failed: %w", err)
	}
	return out, nil
}

// Release deletes the failed rows of keys in one statement and returns
// them; a done row is never deleted. With dryRun it returns what it would
// delete.
func (a *Admin) Release(ctx context.Context, keys []dedup.Key, dryRun bool) ([]dedup.Row, error) {
	scopes, ids := make([]string, len(keys)), make([]string, len(keys))
	for i, k := range keys {
		scopes[i], ids[i] = k.Scope, k.ID
	}
	where := ` WHERE outcome = 'failed' AND (scope, key) IN (SELECT * FROM unnest($1::text[], $2::text[]))`
	q := `SELECT ` + rowColumns + ` FROM ` + a.s.table + where + ` ORDER BY scope, key`
	if !dryRun {
		q = `DELETE FROM ` + a.s.table + where + ` RETURNING ` + rowColumns
	}
	rows, err := a.s.pool.Query(ctx, q, scopes, ids)
	if err != nil {
		return nil, fmt.Errorf("pgstore: release: %w", err)
	}
	out, err := scanRows(rows)
	if err != nil {
		return nil, fmt.Errorf("pgstore: release: %w", err)
	}
	return out, nil
}

var _ dedup.Admin = (*Admin)(nil)
