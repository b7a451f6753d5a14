package mysqlstore

// Entity watermarks (dedup.Watermarks) are the table <Table>_watermarks, a
// row per (scope, entity), and the stale events the table <Table>_stale
// (migrations 006 and 007). AdvanceEntities runs a fixed number of
// statements per 1,000 entities and per 1,000 stale events:
//
//   - INSERT … ON DUPLICATE KEY UPDATE scope = scope, the entities sorted
//     by (scope, entity): the missing ones inserted at their first event's
//     version with the call's random token, the others locked exclusively
//     (a no-op update; INSERT IGNORE would take a shared lock, and two
//     transactions upgrading theirs to exclusive deadlock), all in primary
//     key order;
//   - a locking read of the rows by primary key (FORCE INDEX, point ranges:
//     never a scan that would wait on other transactions' rows), which
//     sees the latest committed watermarks under either isolation level;
//   - the events decided in Go, in their order;
//   - one upsert of the watermarks moved and one INSERT of the stale
//     events.
//
// The waits are InnoDB's row lock waits, bounded by
// innodb_lock_wait_timeout (Config.LockTimeout) and reported as
// dedup.ErrInFlight, as a claim's.

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/internal/storekit/rowscan"
)

type entityRef struct{ scope, name string }

// watermark is an entity's watermark as the events of a call move it.
type watermark struct {
	v      dedup.Version
	had    bool
	stored dedup.Version // the row's: written back when v differs
}

// firstEvent is an entity and its first event's version in a call.
type firstEvent struct {
	ref entityRef
	v   dedup.Version
}

// AdvanceEntities decides events against their entities' watermarks in
// tx; see dedup.Watermarks and the statements above.
func (s *Store) AdvanceEntities(ctx context.Context, tx *sql.Tx, events []dedup.EntityEvent, results []dedup.Advance) error {
	if len(results) < len(events) {
		return fmt.Errorf("mysqlstore: %d results for %d entity events", len(results), len(events))
	}
	for _, e := range events {
		if err := e.Validate(); err != nil {
			return fmt.Errorf("mysqlstore: advance entities: %w", err)
		}
	}
	if len(events) == 0 {
		return nil
	}
	// The entities in primary key order (the collation compares bytes),
	// each with its first event's version.
	order := make([]int, len(events))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int {
		return cmp.Or(cmp.Compare(events[a].Key.Scope, events[b].Key.Scope), cmp.Compare(events[a].Entity, events[b].Entity))
	})
	var firsts []firstEvent
	for _, i := range order {
		r := entityRef{events[i].Key.Scope, events[i].Entity}
		if len(firsts) > 0 && firsts[len(firsts)-1].ref == r {
			continue
		}
		firsts = append(firsts, firstEvent{r, events[i].Version})
	}

	token := rand.Uint64() | 1
	var q strings.Builder
	var args []any
	for start := 0; start < len(firsts); start += chunk {
		q.Reset()
		args = args[:0]
		q.WriteString("INSERT INTO " + s.marks + " (scope, entity, major, minor, insert_token, updated_at, expires_at) VALUES ")
		for i, f := range firsts[start:min(len(firsts), start+chunk)] {
			if i > 0 {
				q.WriteByte(',')
			}
			q.WriteString(`(?, ?, ?, ?, ?, UTC_TIMESTAMP(6), DATE_ADD(UTC_TIMESTAMP(6), INTERVAL ? MICROSECOND))`)
			args = append(args, f.ref.scope, f.ref.name, f.v.Major, f.v.Minor, token, s.retention(f.ref.scope))
		}
		q.WriteString(" ON DUPLICATE KEY UPDATE scope = scope")
		if _, err := tx.ExecContext(ctx, q.String(), args...); err != nil {
			return s.lockErr("advance entities", err)
		}
	}
	marks, err := s.readMarks(ctx, tx, firsts, token)
	if err != nil {
		return err
	}

	var stales []dedup.StaleEvent
	for i, e := range events {
		w := marks[entityRef{e.Key.Scope, e.Entity}]
		results[i] = dedup.Advance{Watermark: w.v, Had: w.had}
		if w.had && e.Version.Compare(w.v) <= 0 {
			results[i].Stale = true
			stales = append(stales, dedup.StaleEvent{Key: e.Key, Entity: e.Entity, Version: e.Version, Watermark: w.v})
			continue
		}
		w.v, w.had = e.Version, true
	}
	var moved []entityRef
	for _, f := range firsts {
		if w := marks[f.ref]; w.v != w.stored {
			moved = append(moved, f.ref)
		}
	}
	for start := 0; start < len(moved); start += chunk {
		q.Reset()
		args = args[:0]
		q.WriteString("INSERT INTO " + s.marks + " (scope, entity, major, minor, insert_token, updated_at, expires_at) VALUES ")
		for i, r := range moved[start:min(len(moved), start+chunk)] {
			if i > 0 {
				q.WriteByte(',')
			}
			q.WriteString(`(?, ?, ?, ?, 0, UTC_TIMESTAMP(6), DATE_ADD(UTC_TIMESTAMP(6), INTERVAL ? MICROSECOND))`)
			w := marks[r]
			args = append(args, r.scope, r.name, w.v.Major, w.v.Minor, s.retention(r.scope))
		}
		q.WriteString(" ON DUPLICATE KEY UPDATE major = VALUES(major), minor = VALUES(minor), updated_at = VALUES(updated_at), expires_at = VALUES(expires_at)")
		if _, err := tx.ExecContext(ctx, q.String(), args...); err != nil {
			return s.lockErr("advance entities", err)
		}
	}
	for start := 0; start < len(stales); start += chunk {
		q.Reset()
		args = args[:0]
		q.WriteString("INSERT INTO " + s.stale + " (scope, `key`, entity, major, minor, mark_major, mark_minor, at, expires_at) VALUES ")
		for i, e := range stales[start:min(len(stales), start+chunk)] {
			if i > 0 {
				q.WriteByte(',')
			}
			q.WriteString(`(?, ?, ?, ?, ?, ?, ?, UTC_TIMESTAMP(6), DATE_ADD(UTC_TIMESTAMP(6), INTERVAL ? MICROSECOND))`)
			args = append(args, e.Key.Scope, e.Key.ID, e.Entity, e.Version.Major, e.Version.Minor, e.Watermark.Major, e.Watermark.Minor, s.retention(e.Key.Scope))
		}
		if _, err := tx.ExecContext(ctx, q.String(), args...); err != nil {
			return s.lockErr("advance entities", err)
		}
	}
	return nil
}

// readMarks reads the locked rows of firsts: a row with token is this
// call's, whose first event applies.
func (s *Store) readMarks(ctx context.Context, tx *sql.Tx, firsts []firstEvent, token uint64) (map[entityRef]*watermark, error) {
	marks := make(map[entityRef]*watermark, len(firsts))
	var q strings.Builder
	var args []any
	for start := 0; start < len(firsts); start += chunk {
		q.Reset()
		args = append(args[:0], token)
		q.WriteString("SELECT scope, entity, major, minor, insert_token = ? FROM " + s.marks + " FORCE INDEX (PRIMARY) WHERE ")
		for i, f := range firsts[start:min(len(firsts), start+chunk)] {
			if i > 0 {
				q.WriteString(" OR ")
			}
			q.WriteString("(scope = ? AND entity = ?)")
			args = append(args, f.ref.scope, f.ref.name)
		}
		q.WriteString(" ORDER BY scope, entity FOR UPDATE")
		rows, err := tx.QueryContext(ctx, q.String(), args...)
		if err != nil {
			return nil, s.lockErr("advance entities", err)
		}
		for rows.Next() {
			var r entityRef
			var v dedup.Version
			var mine bool
			if err := rows.Scan(&r.scope, &r.name, &v.Major, &v.Minor, &mine); err != nil {
				rows.Close()
				return nil, s.lockErr("advance entities", err)
			}
			if mine {
				marks[r] = &watermark{stored: v} // its first event applies
			} else {
				marks[r] = &watermark{v: v, had: true, stored: v}
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, s.lockErr("advance entities", err)
		}
	}
	if len(marks) != len(firsts) {
		return nil, fmt.Errorf("%w: %d of %d entities' watermarks vanished while they were locked (purged?)", dedup.ErrInFlight, len(firsts)-len(marks), len(firsts))
	}
	return marks, nil
}

// Watermark returns the committed watermark of entity in scope; see
// dedup.Watermarks.
func (s *Store) Watermark(ctx context.Context, scope, entity string) (dedup.Version, bool, error) {
	var v dedup.Version
	err := s.db.QueryRowContext(ctx, "SELECT major, minor FROM "+s.marks+" WHERE scope = ? AND entity = ?", scope, entity).Scan(&v.Major, &v.Minor)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return dedup.Version{}, false, nil
	case err != nil:
		return dedup.Version{}, false, s.connErr("watermark", err)
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
	evs, err := rowscan.StaleEvents(time.UnixMicro)(s.db.QueryContext(ctx, "SELECT scope, `key`, entity, major, minor, mark_major, mark_minor, "+
		"TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', at) FROM "+s.stale+
		" WHERE (? = '' OR scope = ?) AND (? = '' OR entity = ?) ORDER BY at DESC, id DESC LIMIT ?",
		f.Scope, f.Scope, f.Entity, f.Entity, limit))
	if err != nil {
		return nil, s.connErr("stale events", err)
	}
	return evs, nil
}

// purgeEntities deletes in tx (READ COMMITTED) at most limit watermarks
// untouched, then stale records kept, for longer than their scope's
// retention; the watermarks other transactions hold are skipped.
func (s *Store) purgeEntities(ctx context.Context, tx *sql.Tx, limit int) (int, error) {
	if limit <= 0 {
		return 0, nil
	}
	rows, err := tx.QueryContext(ctx, "SELECT scope, entity FROM "+s.marks+
		" WHERE expires_at < UTC_TIMESTAMP(6) ORDER BY expires_at LIMIT ? FOR UPDATE SKIP LOCKED", limit)
	if err != nil {
		return 0, s.connErr("purge watermarks", err)
	}
	var refs []entityRef
	for rows.Next() {
		var r entityRef
		if err := rows.Scan(&r.scope, &r.name); err != nil {
			rows.Close()
			return 0, s.connErr("purge watermarks", err)
		}
		refs = append(refs, r)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, s.connErr("purge watermarks", err)
	}
	n := 0
	for start := 0; start < len(refs); start += chunk {
		var q strings.Builder
		var args []any
		q.WriteString("DELETE FROM " + s.marks + " WHERE ")
		for i, r := range refs[start:min(len(refs), start+chunk)] {
			if i > 0 {
				q.WriteString(" OR ")
			}
			q.WriteString("(scope = ? AND entity = ?)")
			args = append(args, r.scope, r.name)
		}
		res, err := tx.ExecContext(ctx, q.String(), args...)
		if err != nil {
			return 0, s.connErr("purge watermarks", err)
		}
		d, _ := res.RowsAffected()
		n += int(d)
	}
	if n < limit {
		res, err := tx.ExecContext(ctx, "DELETE FROM "+s.stale+" WHERE expires_at < UTC_TIMESTAMP(6) ORDER BY expires_at LIMIT ?", limit-n)
		if err != nil {
			return 0, s.connErr("purge stale events", err)
		}
		d, _ := res.RowsAffected()
		n += int(d)
	}
	return n, nil
}

var _ dedup.Watermarks[*sql.Tx] = (*Store)(nil)
