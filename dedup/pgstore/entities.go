package pgstore

// Entity watermarks (dedup.Watermarks) are the table <Table>_watermarks, a
// row per (scope, entity), and the stale events the table <Table>_stale
// (migration 008). AdvanceEntities runs a fixed number of statements
// whatever the number of events, in two round trips: the entities' rows
// locked (the missing ones inserted at their first event's version, then
// all taken FOR NO KEY UPDATE, in one canonical order), the events decided
// in Go in their order, then one statement that moves the watermarks and
// records the stale events.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/dedup"
)

// markQueries are the statements of the entity watermarks.
type markQueries struct {
	insert, lock string
	// apply moves the watermarks, records the stale events, or both, in
	// one statement (applyMoved, applyStale, applyBoth).
	apply            [3]string
	watermark, stale string
	purgeMarks       string
	purgeStale       string
}

func newMarkQueries(marks, stale string, distributed bool) markQueries {
	skipLocked := " FOR UPDATE SKIP LOCKED"
	if distributed {
		skipLocked = "" // YugabyteDB refuses SKIP LOCKED under SERIALIZABLE
	}
	return markQueries{
		// The entities without a row get one at their first event's
		// version, which that event applies (the row's insertion locks it
		// like the lock below locks the others); the entities inserted are
		// returned. Bytewise order (COLLATE "C"), as the lock's.
		insert: `INSERT INTO ` + marks + ` (scope, entity, major, minor, expires_at)
SELECT s, e, ma, mi, CASE WHEN r < 0 THEN NULL ELSE now() + r * interval '1 millisecond' END
FROM unnest($1::text[], $2::text[], $3::int8[], $4::int8[], $5::int8[]) AS i(s, e, ma, mi, r)
ORDER BY s COLLATE "C", e COLLATE "C"
ON CONFLICT (scope, entity) DO NOTHING
RETURNING scope, entity`,
		// Each entity's row by primary key, locked in bytewise (scope,
		// entity) order: a lateral probe, so that the prepared statement's
		// generic plan is an index scan whatever the table's size was when
		// it was planned (TestWatermarkPlans). Under READ COMMITTED a row
		// another transaction moved is read as it committed it.
		lock: `SELECT i.s, i.e, w.major, w.minor
FROM (SELECT s, e FROM unnest($1::text[], $2::text[]) AS u(s, e) ORDER BY s COLLATE "C", e COLLATE "C") i
CROSS JOIN LATERAL (SELECT major, minor FROM ` + marks + ` m WHERE m.scope = i.s AND m.entity = i.e FOR NO KEY UPDATE) w`,
		apply: [3]string{
			`WITH moved AS (` + moveSQL(marks) + `) SELECT count(*)::int8, 0::int8 FROM moved`,
			`WITH recorded AS (` + recordSQL(stale, 1) + `) SELECT 0::int8, count(*)::int8 FROM recorded`,
			`WITH moved AS (` + moveSQL(marks) + `), recorded AS (` + recordSQL(stale, 6) + `)
SELECT (SELECT count(*) FROM moved)::int8, (SELECT count(*) FROM recorded)::int8`,
		},
		watermark: `SELECT major, minor FROM ` + marks + ` WHERE scope = $1 AND entity = $2`,
		stale: `SELECT scope, key, entity, major, minor, mark_major, mark_minor, at FROM ` + stale + `
WHERE ($1 = '' OR scope = $1) AND ($2 = '' OR entity = $2)
ORDER BY at DESC, id DESC LIMIT $3`,
		purgeMarks: `DELETE FROM ` + marks + ` WHERE (scope, entity) IN (
SELECT scope, entity FROM ` + marks + ` WHERE expires_at < now() LIMIT $1` + skipLocked + `)`,
		purgeStale: `DELETE FROM ` + stale + ` WHERE id IN (
SELECT id FROM ` + stale + ` WHERE expires_at < now() LIMIT $1` + skipLocked + `)`,
	}
}

const (
	applyMoved = iota
	applyStale
	applyBoth
)

// moveSQL is the UPDATE of the watermarks moved, an entity each in
// parameters $1 to $5. It runs as an unnamed statement, planned each time:
// it joins the table.
func moveSQL(marks string) string {
	return `UPDATE ` + marks + ` w SET major = u.ma, minor = u.mi, updated_at = now(),
    expires_at = CASE WHEN u.r < 0 THEN NULL ELSE now() + u.r * interval '1 millisecond' END
FROM unnest($1::text[], $2::text[], $3::int8[], $4::int8[], $5::int8[]) AS u(s, e, ma, mi, r)
WHERE w.scope = u.s AND w.entity = u.e
RETURNING 1`
}

// recordSQL is the INSERT of the stale events, in parameters $first to
// $first+7, in event order, so that ids, and the clock, grow with it.
func recordSQL(stale string, first int) string {
	p := func(i int) string { return "$" + strconv.Itoa(first+i) }
	return `INSERT INTO ` + stale + ` (scope, key, entity, major, minor, mark_major, mark_minor, at, expires_at)
SELECT s, k, e, ma, mi, wma, wmi, clock_timestamp(),
    CASE WHEN r < 0 THEN NULL ELSE clock_timestamp() + r * interval '1 millisecond' END
FROM unnest(` + p(0) + `::text[], ` + p(1) + `::text[], ` + p(2) + `::text[], ` + p(3) + `::int8[], ` + p(4) + `::int8[], ` +
		p(5) + `::int8[], ` + p(6) + `::int8[], ` + p(7) + `::int8[]) WITH ORDINALITY AS x(s, k, e, ma, mi, wma, wmi, r, o)
ORDER BY o
RETURNING 1`
}

// entityRef is an entity of a scope.
type entityRef struct{ scope, name string }

// watermark is an entity's watermark as the events of a call move it.
type watermark struct {
	v      dedup.Version // as the call's events moved it
	had    bool
	stored dedup.Version // the row's: written back when v differs
}

// AdvanceEntities decides events against their entities' watermarks in
// tx; see dedup.Watermarks. It inserts the entities that have no row (at
// their first event's version), takes every entity's row FOR NO KEY
// UPDATE in bytewise (scope, entity) order — one round trip, its waits
// bounded by Config.LockTimeout like a claim's, a timed-out wait being
// dedup.ErrInFlight — decides the events in their order, then moves the
// watermarks and records the stale events in one statement.
func (s *Store) AdvanceEntities(ctx context.Context, tx pgx.Tx, events []dedup.EntityEvent, results []dedup.Advance) error {
	if len(results) < len(events) {
		return fmt.Errorf("pgstore: %d results for %d entity events", len(results), len(events))
	}
	for _, e := range events {
		if err := e.Validate(); err != nil {
			return fmt.Errorf("pgstore: advance entities: %w", err)
		}
	}
	if len(events) == 0 {
		return nil
	}
	// The entities in lock order, each with its first event's version.
	order := make([]int, len(events))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int {
		return cmp.Or(cmp.Compare(events[a].Key.Scope, events[b].Key.Scope), cmp.Compare(events[a].Entity, events[b].Entity))
	})
	var first movedArgs
	for k, i := range order {
		e := &events[i]
		if k > 0 && e.Key.Scope == first.scopes[len(first.scopes)-1] && e.Entity == first.names[len(first.names)-1] {
			continue
		}
		first.add(entityRef{e.Key.Scope, e.Entity}, e.Version, s.retentionMillis(e.Key.Scope))
	}

	marks, err := s.lockEntities(ctx, tx, &first)
	if err != nil {
		return err
	}
	if len(marks) != len(first.scopes) {
		return fmt.Errorf("%w: %d of %d entities' watermarks vanished while they were locked (purged?)", dedup.ErrInFlight, len(first.scopes)-len(marks), len(first.scopes))
	}

	var st staleArgs
	for i, e := range events {
		w := marks[entityRef{e.Key.Scope, e.Entity}]
		results[i] = dedup.Advance{Watermark: w.v, Had: w.had}
		if w.had && e.Version.Compare(w.v) <= 0 {
			results[i].Stale = true
			st.add(e, w.v, s.retentionMillis(e.Key.Scope))
			continue
		}
		w.v, w.had = e.Version, true
	}
	var mv movedArgs
	for i := range first.scopes { // in lock order
		r := entityRef{first.scopes[i], first.names[i]}
		if w := marks[r]; w.v != w.stored {
			mv.add(r, w.v, first.rets[i])
		}
	}
	if len(mv.scopes) == 0 && len(st.scopes) == 0 {
		return nil
	}
	args := []any{pgx.QueryExecModeExec}
	which := applyBoth
	switch {
	case len(st.scopes) == 0:
		which = applyMoved
	case len(mv.scopes) == 0:
		which = applyStale
	}
	if which != applyStale {
		args = append(args, mv.scopes, mv.names, mv.majors, mv.minors, mv.rets)
	}
	if which != applyMoved {
		args = append(args, st.scopes, st.keys, st.names, st.majors, st.minors, st.markMajors, st.markMinors, st.rets)
	}
	var moved, recorded int64
	err = tx.QueryRow(ctx, s.marks.apply[which], args...).Scan(&moved, &recorded)
	if err != nil {
		return s.boundedErr("advance entities", err)
	}
	if int(moved) != len(mv.scopes) || int(recorded) != len(st.scopes) {
		return fmt.Errorf("%w: %d of %d watermarks moved, %d of %d stale events recorded (purged?)", dedup.ErrInFlight, moved, len(mv.scopes), recorded, len(st.scopes))
	}
	return nil
}

// lockEntities inserts the rows of the entities that have none, at their
// first event's version, and locks every entity's row, in one round trip,
// and returns their watermarks: an entity it inserted has none yet.
// Non-distributed, the lock_timeout set first bounds both statements; in
// distributed mode each has statement_timeout set around it.
func (s *Store) lockEntities(ctx context.Context, tx pgx.Tx, first *movedArgs) (map[entityRef]*watermark, error) {
	var b pgx.Batch
	s.queueBounded(&b, s.marks.insert, first.scopes, first.names, first.majors, first.minors, first.rets)
	insertAt := len(b.QueuedQueries) - 1
	if s.cfg.Distributed {
		insertAt-- // the restore of statement_timeout follows it
		s.queueBounded(&b, s.marks.lock, first.scopes, first.names)
	} else {
		b.Queue(s.marks.lock, first.scopes, first.names)
	}
	lockAt := len(b.QueuedQueries) - 1
	if s.cfg.Distributed {
		lockAt--
	}
	inserted := make(map[entityRef]bool)
	marks := make(map[entityRef]*watermark, len(first.scopes))
	br := tx.SendBatch(ctx, &b)
	fail := func(err error) (map[entityRef]*watermark, error) {
		br.Close()
		return nil, s.boundedErr("advance entities", err)
	}
	for i := range b.QueuedQueries {
		if i != insertAt && i != lockAt {
			if _, err := br.Exec(); err != nil {
				return fail(err)
			}
			continue
		}
		rows, err := br.Query()
		if err != nil {
			return fail(err)
		}
		for rows.Next() {
			var r entityRef
			var v dedup.Version
			if i == insertAt {
				err = rows.Scan(&r.scope, &r.name)
				inserted[r] = true
			} else {
				err = rows.Scan(&r.scope, &r.name, &v.Major, &v.Minor)
				if inserted[r] {
					marks[r] = &watermark{stored: v} // its first event applies
				} else {
					marks[r] = &watermark{v: v, had: true, stored: v}
				}
			}
			if err != nil {
				rows.Close()
				return fail(err)
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fail(err)
		}
	}
	if err := br.Close(); err != nil {
		return nil, s.boundedErr("advance entities", err)
	}
	return marks, nil
}

// movedArgs are the arguments of watermarks written, an entity each.
type movedArgs struct {
	scopes, names  []string
	majors, minors []int64
	rets           []int64
}

func (a *movedArgs) add(r entityRef, v dedup.Version, ret int64) {
	a.scopes, a.names = append(a.scopes, r.scope), append(a.names, r.name)
	a.majors, a.minors = append(a.majors, v.Major), append(a.minors, v.Minor)
	a.rets = append(a.rets, ret)
}

// staleArgs are the arguments of the stale events recorded, in event
// order.
type staleArgs struct {
	scopes, keys, names    []string
	majors, minors         []int64
	markMajors, markMinors []int64
	rets                   []int64
}

func (a *staleArgs) add(e dedup.EntityEvent, w dedup.Version, ret int64) {
	a.scopes, a.keys, a.names = append(a.scopes, e.Key.Scope), append(a.keys, e.Key.ID), append(a.names, e.Entity)
	a.majors, a.minors = append(a.majors, e.Version.Major), append(a.minors, e.Version.Minor)
	a.markMajors, a.markMinors = append(a.markMajors, w.Major), append(a.markMinors, w.Minor)
	a.rets = append(a.rets, ret)
}

// Watermark returns the committed watermark of entity in scope; see
// dedup.Watermarks.
func (s *Store) Watermark(ctx context.Context, scope, entity string) (dedup.Version, bool, error) {
	var v dedup.Version
	err := s.pool.QueryRow(ctx, s.marks.watermark, scope, entity).Scan(&v.Major, &v.Minor)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return dedup.Version{}, false, nil
	case err != nil:
		return dedup.Version{}, false, fmt.Errorf("pgstore: watermark: %w", err)
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
	rows, err := s.pool.Query(ctx, s.marks.stale, f.Scope, f.Entity, limit)
	if err != nil {
		return nil, fmt.Errorf("pgstore: stale events: %w", err)
	}
	evs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (dedup.StaleEvent, error) {
		var e dedup.StaleEvent
		err := row.Scan(&e.Key.Scope, &e.Key.ID, &e.Entity, &e.Version.Major, &e.Version.Minor, &e.Watermark.Major, &e.Watermark.Minor, &e.At)
		return e, err
	})
	if err != nil {
		return nil, fmt.Errorf("pgstore: stale events: %w", err)
	}
	return evs, nil
}

// purgeEntities deletes at most limit watermarks untouched, then stale
// records kept, for longer than their scope's retention, skipping rows
// other transactions hold.
func (s *Store) purgeEntities(ctx context.Context, limit int) (int, error) {
	n := 0
	for _, q := range []string{s.marks.purgeMarks, s.marks.purgeStale} {
		if n >= limit {
			break
		}
		tag, err := s.pool.Exec(ctx, q, limit-n)
		if err != nil {
			return n, fmt.Errorf("pgstore: purge watermarks: %w", err)
		}
		n += int(tag.RowsAffected())
	}
	return n, nil
}

var _ dedup.Watermarks[pgx.Tx] = (*Store)(nil)
