package pgstore

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/internal/testenv"
)

// TestWatermarkPlans: the statement that locks the entities is prepared
// (pgx caches it), so its generic plan must probe the primary key whatever
// the table's size was when it was planned: on an empty table and on a
// large one, an index scan, the moves by the rows' ctids (a TID scan), and
// no sequential scan of the watermarks.
func TestWatermarkPlans(t *testing.T) {
	pool := testenv.Pool(t)
	st, err := New(pool, Config{Schema: testenv.Schema(t, pool)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	check := func(when string) {
		t.Helper()
		var lines []string
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SET LOCAL plan_cache_mode = force_generic_plan`); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `PREPARE advance_entities AS `+st.marks.advance); err != nil {
				return err
			}
			rows, err := tx.Query(ctx, `EXPLAIN EXECUTE advance_entities('{s}', '{e}', '{-1}', '{1}', '{1}', '{0}', '{k}')`, pgx.QueryExecModeSimpleProtocol)
			if err != nil {
				return err
			}
			if lines, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
				return err
			}
			_, err = tx.Exec(ctx, `DEALLOCATE advance_entities`)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		p := strings.Join(lines, "\n")
		if !strings.Contains(p, "Index Scan using idem_dedup_watermarks_pkey") || !strings.Contains(p, "Tid Scan on idem_dedup_watermarks") || strings.Contains(p, "Seq Scan") {
			t.Errorf("generic plan of the entities' advance %s:\n%s", when, p)
		}
	}
	check("on an empty table")
	if _, err := pool.Exec(ctx, `INSERT INTO `+st.marksTab+` (scope, entity, major, minor) SELECT 's', 'e' || i, i, 0 FROM generate_series(1, 50000) i`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `ANALYZE `+st.marksTab); err != nil {
		t.Fatal(err)
	}
	check("on a table of 50,000 rows")
}

// TestWatermarkRetention: a watermark expires at least its scope's
// retention, and at most one and a half, after its last advance — kept by
// Purge for the one, forgotten past the other — and its expires_at moves
// only when less than a retention is left, so that the other advances
// change no indexed column and are HOT updates. Time passes by moving the
// row's updated_at and expires_at back together.
func TestWatermarkRetention(t *testing.T) {
	const retention = time.Hour
	pool := testenv.Pool(t)
	st, err := New(pool, Config{Schema: testenv.Schema(t, pool), ScopeRetention: map[string]time.Duration{"trades": retention}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := testenv.Context(t, time.Minute)
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	// advance moves entity of scope to major and returns the watermarks'
	// updates in its transaction, and how many were HOT.
	advance := func(scope, entity string, major int64) (upd, hot int64) {
		t.Helper()
		ev := []dedup.EntityEvent{{Key: dedup.Key{Scope: scope, ID: fmt.Sprintf("k%d", major)}, Entity: entity, Version: dedup.Version{Major: major}}}
		res := make([]dedup.Advance, 1)
		// The backend's counts not yet reported to the statistics, read
		// before and after (they hold earlier transactions' too).
		const counts = `SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_xact_user_tables WHERE relid = $1::regclass`
		err := st.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
			var upd0, hot0 int64
			if err := tx.QueryRow(ctx, counts, st.marksTab).Scan(&upd0, &hot0); err != nil {
				return err
			}
			if err := st.AdvanceEntities(ctx, tx, ev, res); err != nil {
				return err
			}
			if err := tx.QueryRow(ctx, counts, st.marksTab).Scan(&upd, &hot); err != nil {
				return err
			}
			upd, hot = upd-upd0, hot-hot0
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if res[0].Stale {
			t.Fatalf("%s/%s %d: stale over %v", scope, entity, major, res[0].Watermark)
		}
		return upd, hot
	}
	// kept returns how long after its last advance the watermark of
	// entity expires (false: never), and its expires_at.
	kept := func(scope, entity string) (time.Duration, bool, time.Time) {
		t.Helper()
		var after *time.Duration
		var at *time.Time
		err := pool.QueryRow(ctx, `SELECT expires_at - updated_at, expires_at FROM `+st.marksTab+` WHERE scope = $1 AND entity = $2`, scope, entity).Scan(&after, &at)
		if err != nil {
			t.Fatal(err)
		}
		if after == nil {
			return 0, false, time.Time{}
		}
		return *after, true, *at
	}
	// within checks the rule: at least a retention, at most one and a
	// half, after the last advance.
	within := func(when string) time.Time {
		t.Helper()
		after, ok, at := kept("trades", "T1")
		if !ok || after < retention || after > retention*3/2 {
			t.Fatalf("%s: the watermark expires %v after its last advance (kept: %v), want between %v and %v", when, after, ok, retention, retention*3/2)
		}
		return at
	}
	pass := func(d time.Duration) { // as if d had passed since the last advance
		t.Helper()
		_, err := pool.Exec(ctx, `UPDATE `+st.marksTab+` SET updated_at = updated_at - $1::interval, expires_at = expires_at - $1::interval`, d)
		if err != nil {
			t.Fatal(err)
		}
	}
	purge := func() {
		t.Helper()
		if _, err := st.Purge(ctx, 100); err != nil {
			t.Fatal(err)
		}
	}

	advance("trades", "T1", 1)
	first := within("inserted")
	pass(20 * time.Minute) // 70 minutes left: more than the retention
	if upd, hot := advance("trades", "T1", 2); upd != 1 || hot != 1 {
		t.Errorf("an advance with more than a retention left: %d updates, %d HOT, want 1 HOT", upd, hot)
	}
	if at := within("moved with 70 minutes left"); !at.Equal(first.Add(-20 * time.Minute)) {
		t.Errorf("moved with 70 minutes left: expires_at %v, want it kept at %v", at, first.Add(-20*time.Minute))
	}
	pass(20 * time.Minute) // 50 minutes left: less than the retention
	advance("trades", "T1", 3)
	within("moved with 50 minutes left")

	pass(retention - 5*time.Minute)
	purge()
	if _, had, err := st.Watermark(ctx, "trades", "T1"); err != nil || !had {
		t.Fatalf("Purge forgot a watermark %v after its last advance, before its scope's retention (%v) ran out (%v)", retention-5*time.Minute, retention, err)
	}
	pass(retention/2 + 10*time.Minute)
	purge()
	if _, had, err := st.Watermark(ctx, "trades", "T1"); err != nil || had {
		t.Fatalf("a watermark %v after its last advance, past one and a half retentions: kept %v (%v), want purged", retention*3/2+5*time.Minute, had, err)
	}

	advance("kept", "T1", 1)
	pass(1000 * time.Hour)
	if upd, hot := advance("kept", "T1", 2); upd != 1 || hot != 1 {
		t.Errorf("an advance in a scope kept for ever: %d updates, %d HOT, want 1 HOT", upd, hot)
	}
	purge()
	if _, ok, _ := kept("kept", "T1"); ok {
		t.Error("a watermark of a scope kept for ever has an expires_at")
	}
	if v, had, err := st.Watermark(ctx, "kept", "T1"); err != nil || !had || v.Major != 2 {
		t.Fatalf("watermark of a scope kept for ever after Purge: %v %v %v, want 2.0", v, had, err)
	}
}
