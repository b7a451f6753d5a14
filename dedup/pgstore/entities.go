package pgstore

// Entity watermarks (dedup.Watermarks) are the table <Table>_watermarks, a
// row per (scope, entity), and the stale events the table <Table>_stale
// (migration 008). AdvanceEntities sends two statements in one round trip
// whatever the number of events: the first takes every entity's row, in
// one canonical order — the missing ones inserted, the others locked —
// and the second decides the events in their order, moves the watermarks
// and records the stale events, and returns what it decided.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/dedup"
)

// markQueries are the statements of the entity watermarks.
type markQueries struct {
	take, advance    string
	watermark, stale string
	purgeMarks       string
	purgeStale       string
}

// noMark is the updated_at of a row take inserted: an entity without a
// watermark yet. It is seen only by the transaction that inserted it,
// whose advance statement always replaces it: no committed row has it.
const noMark = `'-infinity'::timestamptz`

// keepFor is the expires_at a watermark is given when it is inserted or
// when its expires_at is less than a retention away: now() plus one and a
// half times the retention r in milliseconds, or NULL (kept for ever)
// where r is negative. With the advance's rule — an expires_at between
// one and one and a half retentions away is kept — a watermark expires
// at least one retention, and at most one and a half, after its last
// advance.
func keepFor(r string) string {
	return `CASE WHEN ` + r + ` >= 0 THEN now() + ` + r + ` * interval '1.5 milliseconds' END`
}

func newMarkQueries(marks, stale string, distributed bool) markQueries {
	skipLocked := " FOR UPDATE SKIP LOCKED"
	// A watermark is moved by its row's ctid, read with it: take holds
	// the row, so no other transaction can move it meanwhile, and the
	// move needs no second probe of the primary key, nor the lock an
	// INSERT ... ON CONFLICT takes again.
	tidIn, tidOut, move := `ctid, `, `, w.ctid AS tid`, `UPDATE `+marks+` AS w SET major = t.v[1], minor = t.v[2], updated_at = now(), expires_at = ent.expires
    FROM ent JOIN (SELECT n, max(v) AS v FROM ev GROUP BY n) t ON t.n = ent.n
    WHERE w.ctid = ent.tid AND (ent.mark IS NULL OR t.v > ent.mark)`
	if distributed {
		skipLocked = "" // YugabyteDB refuses SKIP LOCKED under SERIALIZABLE
		// No ctid (CockroachDB, YugabyteDB): by primary key.
		tidIn, tidOut, move = "", "", `INSERT INTO `+marks+` AS w (scope, entity, major, minor, updated_at, expires_at)
    SELECT ent.s, ent.e, t.v[1], t.v[2], now(), ent.expires
    FROM ent JOIN (SELECT n, max(v) AS v FROM ev GROUP BY n) t ON t.n = ent.n
    WHERE ent.mark IS NULL OR t.v > ent.mark
    ORDER BY ent.n
    ON CONFLICT (scope, entity) DO UPDATE SET major = excluded.major, minor = excluded.minor,
        updated_at = excluded.updated_at, expires_at = excluded.expires_at`
	}
	return markQueries{
		// Every entity's row, taken one at a time in bytewise (scope,
		// entity) order: a missing one inserted (noMark), an existing
		// one locked — ON CONFLICT DO UPDATE locks the row it conflicts
		// with, as it last committed, even where WHERE false updates
		// nothing. One statement for both, so that no row is taken out of
		// the canonical order, and none can be purged between its insert
		// and its lock. Each row by its primary key (the arbiter), whatever
		// the table's size.
		//
		// A missing row is inserted with the expires_at its first advance
		// gives it (keepFor), so that the advance changes no indexed
		// column. Entities $1-$2, their scope's retention in milliseconds
		// $3 (-1: none).
		take: `INSERT INTO ` + marks + ` AS w (scope, entity, major, minor, updated_at, expires_at)
SELECT s, e, 0, 0, ` + noMark + `, ` + keepFor("r") + ` FROM unnest($1::text[], $2::text[], $3::int8[]) AS i(s, e, r)
ORDER BY s COLLATE "C", e COLLATE "C"
ON CONFLICT (scope, entity) DO UPDATE SET updated_at = w.updated_at WHERE false`,
		// The events decided against the rows take locked, read afresh
		// (a new statement: under READ COMMITTED what the rows' previous
		// holders committed), each by its primary key (LIMIT 1 keeps the
		// probe a lateral index scan in the generic plan,
		// TestWatermarkPlans). Entities $1-$3 in take's order, with
		// their scope's retention in milliseconds (-1: none); events
		// $4-$7 in call order, each its entity's ordinal in $1. An event
		// meets the greater of its entity's watermark and the versions of
		// the entity's earlier events in the call (met), and is stale at
		// or below it. A watermark moves to the highest version of its
		// events, in the same canonical order; the stale events are
		// recorded in call order, so that ids, and the clock, grow with
		// it. A moved watermark keeps its expires_at while that is between
		// one and one and a half retentions away, and is given one and a
		// half otherwise (keepFor): most moves then change no indexed
		// column, and Postgres makes them HOT updates, without new index
		// entries. The rows come back in call order, with the counts of
		// rows read.
		advance: `WITH ent AS (
    SELECT i.n, i.s, i.e, i.r, CASE WHEN w.updated_at <> ` + noMark + ` THEN ARRAY[w.major, w.minor] END AS mark,
        CASE WHEN i.r >= 0 AND w.expires_at BETWEEN now() + i.r * interval '1 millisecond' AND ` + keepFor("i.r") + `
            THEN w.expires_at ELSE ` + keepFor("i.r") + ` END AS expires` + tidOut + `
    FROM unnest($1::text[], $2::text[], $3::int8[]) WITH ORDINALITY AS i(s, e, r, n)
    CROSS JOIN LATERAL (SELECT ` + tidIn + `major, minor, updated_at, expires_at FROM ` + marks + ` m WHERE m.scope = i.s AND m.entity = i.e LIMIT 1) w
), ev AS (
    SELECT x.o, x.n, x.k, ARRAY[x.ma, x.mi] AS v,
        max(ARRAY[x.ma, x.mi]) OVER (PARTITION BY x.n ORDER BY x.o ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS before
    FROM unnest($4::int8[], $5::int8[], $6::int8[], $7::text[]) WITH ORDINALITY AS x(n, ma, mi, k, o)
), decided AS (
    SELECT ev.o, ev.k, ev.v, ent.s, ent.e, ent.r, GREATEST(ent.mark, ev.before) AS met
    FROM ev JOIN ent ON ent.n = ev.n
), moved AS (
    ` + move + `
    RETURNING 1
), recorded AS (
    INSERT INTO ` + stale + ` (scope, key, entity, major, minor, mark_major, mark_minor, at, expires_at)
    SELECT s, k, e, v[1], v[2], met[1], met[2], clock_timestamp(),
        CASE WHEN r < 0 THEN NULL ELSE clock_timestamp() + r * interval '1 millisecond' END
    FROM decided WHERE v <= met
    ORDER BY o
    RETURNING 1
)
SELECT o, coalesce(v <= met, false), met[1], met[2], (SELECT count(*) FROM ent)
FROM decided ORDER BY o`,
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

// AdvanceEntities decides events against their entities' watermarks in
// tx; see dedup.Watermarks. In one round trip it takes every entity's row
// in bytewise (scope, entity) order — inserting the missing ones, locking
// the others, its waits bounded by Config.LockTimeout like a claim's, a
// timed-out wait being dedup.ErrInFlight — then, in a second statement,
// decides the events in their order, moves the watermarks and records the
// stale events.
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
	// The entities in lock order (bytewise, as COLLATE "C"), and each
	// event's entity as its ordinal in it.
	order := make([]int, len(events))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int {
		return cmp.Or(cmp.Compare(events[a].Key.Scope, events[b].Key.Scope), cmp.Compare(events[a].Entity, events[b].Entity))
	})
	var a advanceArgs
	a.grow(len(events))
	for k, i := range order {
		e := &events[i]
		if k == 0 || e.Key.Scope != a.scopes[len(a.scopes)-1] || e.Entity != a.names[len(a.names)-1] {
			a.scopes, a.names = append(a.scopes, e.Key.Scope), append(a.names, e.Entity)
			a.rets = append(a.rets, s.retentionMillis(e.Key.Scope))
		}
		a.ent[i] = int64(len(a.scopes))
	}
	for i, e := range events {
		a.majors[i], a.minors[i], a.keys[i] = e.Version.Major, e.Version.Minor, e.Key.ID
	}

	var b pgx.Batch
	before := s.queueBounded(&b, s.marks.take, a.scopes, a.names, a.rets)
	b.Queue(s.marks.advance, a.scopes, a.names, a.rets, a.ent, a.majors, a.minors, a.keys)
	br := tx.SendBatch(ctx, &b)
	fail := func(err error) error {
		br.Close()
		return s.boundedErr("advance entities", err)
	}
	for range before + 1 { // the bound, the take
		if _, err := br.Exec(); err != nil {
			return fail(err)
		}
	}
	if s.cfg.Distributed {
		if _, err := br.Exec(); err != nil { // statement_timeout restored
			return fail(err)
		}
	}
	rows, err := br.Query()
	if err != nil {
		return fail(err)
	}
	var (
		n, read      int64
		stale        bool
		major, minor *int64
	)
	for rows.Next() {
		if err := rows.Scan(&n, &stale, &major, &minor, &read); err != nil {
			rows.Close()
			return fail(err)
		}
		r := dedup.Advance{Stale: stale, Had: major != nil}
		if r.Had {
			r.Watermark = dedup.Version{Major: *major, Minor: *minor}
		}
		results[n-1] = r
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fail(err)
	}
	if err := br.Close(); err != nil {
		return s.boundedErr("advance entities", err)
	}
	if int(read) != len(a.scopes) {
		// take inserted or locked each row, and nothing deletes a row
		// another transaction holds: not expected.
		return fmt.Errorf("%w: %d of %d entities' watermarks read after they were taken", dedup.ErrInFlight, read, len(a.scopes))
	}
	return nil
}

// advanceArgs are the parameters of the advance statement: the entities
// in lock order, then the events in call order.
type advanceArgs struct {
	scopes, names       []string
	rets                []int64
	ent, majors, minors []int64
	keys                []string
}

func (a *advanceArgs) grow(events int) {
	a.ent, a.majors, a.minors = make([]int64, events), make([]int64, events), make([]int64, events)
	a.keys = make([]string, events)
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
