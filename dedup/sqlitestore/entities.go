package sqlitestore

// Entity watermarks (dedup.Watermarks) are the table <Table>_watermarks, a
// row per (scope, entity), and the stale events the table <Table>_stale
// (migration 007). SQLite has one writer at a time: the IMMEDIATE
// transaction holds the database's write lock from its beginning, so
// AdvanceEntities takes no lock of its own — a concurrent transaction
// waits at its BEGIN (busy_timeout) and then reads what this one
// committed.

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/internal/storekit/rowscan"
)

func (s *Store) marksTable() string { return `"` + s.cfg.Table + `_watermarks"` }
func (s *Store) staleTable() string { return `"` + s.cfg.Table + `_stale"` }

// Statements per chunk of entities or stale events: under SQLite's limit
// of 32766 variables per statement.
const (
	markChunk  = 5000 // five variables each
	staleChunk = 3000 // nine variables each
)

type entityRef struct{ scope, name string }

// watermark is an entity's watermark as the events of a call move it.
type watermark struct {
	v       dedup.Version
	had     bool
	existed bool          // the entity has a row
	stored  dedup.Version // the row's: written back when v differs
}

// AdvanceEntities decides events against their entities' watermarks in
// tx; see dedup.Watermarks. It reads the entities' watermarks (one
// statement per 5,000 entities), decides the events in their order, then
// writes the watermarks moved and the stale events (one statement per
// 5,000 and per 3,000).
func (s *Store) AdvanceEntities(ctx context.Context, tx *sql.Tx, events []dedup.EntityEvent, results []dedup.Advance) error {
	if len(results) < len(events) {
		return fmt.Errorf("sqlitestore: %d results for %d entity events", len(results), len(events))
	}
	for _, e := range events {
		if err := e.Validate(); err != nil {
			return fmt.Errorf("sqlitestore: advance entities: %w", err)
		}
	}
	if len(events) == 0 {
		return nil
	}
	refs := make([]entityRef, len(events))
	for i, e := range events {
		refs[i] = entityRef{e.Key.Scope, e.Entity}
	}
	slices.SortFunc(refs, func(a, b entityRef) int { return cmp.Or(cmp.Compare(a.scope, b.scope), cmp.Compare(a.name, b.name)) })
	refs = slices.Compact(refs)
	marks, err := s.readMarks(ctx, tx, refs)
	if err != nil {
		return err
	}

	type stale struct {
		e dedup.EntityEvent
		w dedup.Version
	}
	var stales []stale
	for i, e := range events {
		w := marks[entityRef{e.Key.Scope, e.Entity}]
		results[i] = dedup.Advance{Watermark: w.v, Had: w.had}
		if w.had && e.Version.Compare(w.v) <= 0 {
			results[i].Stale = true
			stales = append(stales, stale{e, w.v})
			continue
		}
		w.v, w.had = e.Version, true
	}

	var moved []entityRef
	for _, r := range refs {
		if w := marks[r]; w.had && (!w.existed || w.v != w.stored) {
			moved = append(moved, r)
		}
	}
	var q strings.Builder
	var args []any
	for start := 0; start < len(moved); start += markChunk {
		q.Reset()
		args = args[:0]
		q.WriteString(`INSERT INTO ` + s.marksTable() + ` (scope, entity, major, minor, updated_at, expires_at)
SELECT v.column1, v.column2, v.column3, v.column4, n.now, v.column5 + n.now FROM (VALUES `)
		for i, r := range moved[start:min(len(moved), start+markChunk)] {
			if i > 0 {
				q.WriteByte(',')
			}
			q.WriteString(`(?, ?, ?, ?, ?)`)
			w := marks[r]
			args = append(args, r.scope, r.name, w.v.Major, w.v.Minor, s.retentionMillis(r.scope))
		}
		// WHERE true: SQLite's parser needs it before an upsert clause.
		q.WriteString(`) AS v, (SELECT ` + nowMillis + ` AS now) AS n WHERE true
ON CONFLICT (scope, entity) DO UPDATE SET major = excluded.major, minor = excluded.minor,
    updated_at = excluded.updated_at, expires_at = excluded.expires_at`)
		if _, err := tx.ExecContext(ctx, q.String(), args...); err != nil {
			return s.wrap("advance entities", err)
		}
	}
	for start := 0; start < len(stales); start += staleChunk {
		q.Reset()
		args = args[:0]
		q.WriteString(`INSERT INTO ` + s.staleTable() + ` (scope, key, entity, major, minor, mark_major, mark_minor, at, expires_at)
SELECT v.column1, v.column2, v.column3, v.column4, v.column5, v.column6, v.column7, n.now, v.column8 + n.now
FROM (VALUES `)
		for i, st := range stales[start:min(len(stales), start+staleChunk)] {
			if i > 0 {
				q.WriteByte(',')
			}
			q.WriteString(`(?, ?, ?, ?, ?, ?, ?, ?)`)
			args = append(args, st.e.Key.Scope, st.e.Key.ID, st.e.Entity, st.e.Version.Major, st.e.Version.Minor,
				st.w.Major, st.w.Minor, s.retentionMillis(st.e.Key.Scope))
		}
		q.WriteString(`) AS v, (SELECT ` + nowMillis + ` AS now) AS n`)
		if _, err := tx.ExecContext(ctx, q.String(), args...); err != nil {
			return s.wrap("advance entities", err)
		}
	}
	return nil
}

// readMarks reads the stored watermarks of refs in tx.
func (s *Store) readMarks(ctx context.Context, tx *sql.Tx, refs []entityRef) (map[entityRef]*watermark, error) {
	marks := make(map[entityRef]*watermark, len(refs))
	for _, r := range refs {
		marks[r] = &watermark{}
	}
	var q strings.Builder
	var args []any
	for start := 0; start < len(refs); start += 2 * markChunk {
		q.Reset()
		args = args[:0]
		q.WriteString(`WITH v(s, e) AS (VALUES `)
		for i, r := range refs[start:min(len(refs), start+2*markChunk)] {
			if i > 0 {
				q.WriteByte(',')
			}
			q.WriteString(`(?, ?)`)
			args = append(args, r.scope, r.name)
		}
		// A join on the primary key: one index lookup per entity.
		q.WriteString(`) SELECT w.scope, w.entity, w.major, w.minor FROM v JOIN ` + s.marksTable() + ` w ON w.scope = v.s AND w.entity = v.e`)
		rows, err := tx.QueryContext(ctx, q.String(), args...)
		if err != nil {
			return nil, s.wrap("advance entities", err)
		}
		for rows.Next() {
			var r entityRef
			var v dedup.Version
			if err := rows.Scan(&r.scope, &r.name, &v.Major, &v.Minor); err != nil {
				rows.Close()
				return nil, s.wrap("advance entities", err)
			}
			marks[r] = &watermark{v: v, had: true, existed: true, stored: v}
		}
		if err := rows.Close(); err != nil {
			return nil, s.wrap("advance entities", err)
		}
		if err := rows.Err(); err != nil {
			return nil, s.wrap("advance entities", err)
		}
	}
	return marks, nil
}

// Watermark returns the committed watermark of entity in scope; see
// dedup.Watermarks.
func (s *Store) Watermark(ctx context.Context, scope, entity string) (dedup.Version, bool, error) {
	var v dedup.Version
	err := s.db.QueryRowContext(ctx, `SELECT major, minor FROM `+s.marksTable()+` WHERE scope = ? AND entity = ?`, scope, entity).Scan(&v.Major, &v.Minor)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return dedup.Version{}, false, nil
	case err != nil:
		return dedup.Version{}, false, s.wrap("watermark", err)
	}
	return v, true, nil
}

// StaleEvents lists the recorded stale events f selects, newest first; see
// dedup.Watermarks.
func (s *Store) StaleEvents(ctx context.Context, f dedup.StaleFilter) ([]dedup.StaleEvent, error) {
	limit := f.Limit
	if limit <= 0 {
		limit = 100
	}
	evs, err := rowscan.StaleEvents(time.UnixMilli)(s.db.QueryContext(ctx, `SELECT scope, key, entity, major, minor, mark_major, mark_minor, at FROM `+s.staleTable()+`
WHERE (? = '' OR scope = ?) AND (? = '' OR entity = ?) ORDER BY at DESC, id DESC LIMIT ?`,
		f.Scope, f.Scope, f.Entity, f.Entity, limit))
	if err != nil {
		return nil, s.wrap("stale events", err)
	}
	return evs, nil
}

// purgeEntities deletes in tx at most limit watermarks untouched, then
// stale records kept, for longer than their scope's retention.
func (s *Store) purgeEntities(ctx context.Context, tx *sql.Tx, limit int) (int, error) {
	n := 0
	for _, q := range []string{
		`DELETE FROM ` + s.marksTable() + ` WHERE (scope, entity) IN (
SELECT scope, entity FROM ` + s.marksTable() + ` WHERE expires_at < ` + nowMillis + ` LIMIT ?)`,
		`DELETE FROM ` + s.staleTable() + ` WHERE id IN (
SELECT id FROM ` + s.staleTable() + ` WHERE expires_at < ` + nowMillis + ` LIMIT ?)`,
	} {
		if n >= limit {
			break
		}
		res, err := tx.ExecContext(ctx, q, limit-n)
		if err != nil {
			return n, s.wrap("purge watermarks", err)
		}
		m, err := res.RowsAffected()
		if err != nil {
			return n, s.wrap("purge watermarks", err)
		}
		n += int(m)
	}
	return n, nil
}

var _ dedup.Watermarks[*sql.Tx] = (*Store)(nil)
