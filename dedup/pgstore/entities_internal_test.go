package pgstore

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/internal/testenv"
)

// TestWatermarkPlans: the statement that locks the entities is prepared
// (pgx caches it), so its generic plan must probe the primary key whatever
// the table's size was when it was planned: on an empty table and on a
// large one, an index scan and no sequential scan of the watermarks.
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
		if !strings.Contains(p, "Index Scan using idem_dedup_watermarks_pkey") || strings.Contains(p, "Seq Scan") {
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
