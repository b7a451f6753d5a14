package pgstore

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/internal/testenv"
)

// statements records the SQL a pool sends, batches included.
type statements struct {
	mu  sync.Mutex
	sql []string
}

func (s *statements) add(sql string) {
	s.mu.Lock()
	s.sql = append(s.sql, sql)
	s.mu.Unlock()
}

func (s *statements) take() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := s.sql
	s.sql = nil
	return out
}

func (s *statements) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	s.add(d.SQL)
	return ctx
}
func (s *statements) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (s *statements) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}
func (s *statements) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	s.add(d.SQL)
}
func (s *statements) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

func tracedStore(t *testing.T, cfg Config) (*Store, *statements) {
	t.Helper()
	pcfg, err := pgxpool.ParseConfig(testenv.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	tr := &statements{}
	pcfg.ConnConfig.Tracer = tr
	pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if cfg.Schema == "" {
		cfg.Schema = testenv.Schema(t, testenv.Pool(t))
	}
	st, err := New(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	tr.take()
	return st, tr
}

func claimIn(ctx context.Context, st *Store, cs ...dedup.Claim) ([]dedup.Result, error) {
	res := make([]dedup.Result, len(cs))
	err := st.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error { return st.Claim(ctx, tx, cs, res) })
	return res, err
}

func claimOf(scope, id, payload, source string) dedup.Claim {
	return dedup.Claim{Key: dedup.Key{Scope: scope, ID: id}, Fingerprint: dedup.FingerprintOf([]byte(payload)), Source: source}
}

// TestOneKeyClaimIsAPlainInsert: at BatchSize 1 the claim was the
// set-based statement (unnest of five split strings, a sort, a join and an
// aggregate, 2.5× a plain INSERT's database CPU), and a repeated key's
// lookup was planned afresh each time (issue 29). One key is a plain
// INSERT … VALUES, after the statement that bounds its wait, and a
// repeat adds one primary-key read.
func TestOneKeyClaimIsAPlainInsert(t *testing.T) {
	for _, distributed := range []bool{false, true} {
		t.Run(fmt.Sprintf("distributed=%v", distributed), func(t *testing.T) {
			st, tr := tracedStore(t, Config{Distributed: distributed})
			ctx := context.Background()
			bound := 1 // set_config of lock_timeout
			if distributed {
				bound = 3 // statement_timeout saved, set, restored
			}
			c := claimOf("s", "k", "p", "src")
			for _, want := range []struct {
				c          dedup.Claim
				status     dedup.Status
				statements int
			}{
				{c, dedup.StatusNew, bound + 1},
				{c, dedup.StatusDuplicate, bound + 2},
				{claimOf("s", "k", "other", "src"), dedup.StatusMismatch, bound + 2},
			} {
				res, err := claimIn(ctx, st, want.c)
				if err != nil {
					t.Fatal(err)
				}
				if res[0].Status != want.status {
					t.Fatalf("status %v, want %v", res[0].Status, want.status)
				}
				sent := tr.take()
				var claim []string
				for _, q := range sent {
					if strings.Contains(q, st.table) {
						claim = append(claim, q)
					}
					if strings.Contains(q, "unnest") {
						t.Errorf("%v claim of one key sent a set-based statement: %s", want.status, strings.Join(strings.Fields(q), " "))
					}
				}
				if n := len(sent) - 2; n != want.statements { // less BEGIN and COMMIT
					t.Errorf("%v claim of one key: %d statements, want %d: %q", want.status, n, want.statements, sent)
				}
				if want.status == dedup.StatusNew && len(claim) != 1 {
					t.Errorf("new key: %d statements on the table, want 1: %q", len(claim), claim)
				}
			}
		})
	}
}

// TestOneKeyClaimStoresWhatABatchStores: a key claimed alone is stored as
// it is in a batch (fingerprint, cleaned source, NULL for no source,
// expiry by scope), and a repeat, a mismatch and a failure record are
// answered alike, FirstAt included.
func TestOneKeyClaimStoresWhatABatchStores(t *testing.T) {
	pool := testenv.Pool(t)
	schema := testenv.Schema(t, pool)
	ctx := context.Background()
	stores := map[string]*Store{}
	for _, table := range []string{"one", "batch"} {
		st, err := New(pool, Config{Schema: schema, Table: table, Retention: time.Hour, ScopeRetention: map[string]time.Duration{"forever": 0}})
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		stores[table] = st
	}
	claims := []dedup.Claim{
		claimOf("hour", "a", `{"n":1}`, "topic:p0:1"),
		claimOf("forever", "b", `{"n":2}`, ""),
		claimOf("hour", "c", `{"n":3}`, "bad\x1f\nsource\x7f"),
	}
	for _, c := range claims {
		if _, err := claimIn(ctx, stores["one"], c); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := claimIn(ctx, stores["batch"], claims...); err != nil {
		t.Fatal(err)
	}
	rows := func(table string) string {
		var out string
		q := `SELECT string_agg(format('%s|%s|%s|%s|%s|%s|%s', scope, key, encode(fingerprint, 'hex'), coalesce(source, '<null>'), outcome,
		             coalesce(reason, '<null>'), CASE WHEN expires_at IS NULL THEN 'forever'
		             WHEN expires_at BETWEEN now() + interval '59 minutes' AND now() + interval '61 minutes' THEN 'hour' ELSE expires_at::text END), E'\n' ORDER BY key)
		      FROM ` + pgx.Identifier{schema, table}.Sanitize()
		if err := pool.QueryRow(ctx, q).Scan(&out); err != nil {
			t.Fatal(err)
		}
		return out
	}
	one, batch := rows("one"), rows("batch")
	if one != batch {
		t.Fatalf("rows claimed one at a time:\n%s\nin a batch:\n%s", one, batch)
	}
	if !strings.Contains(one, "|bad??source?|") || !strings.Contains(one, "|<null>|done|") {
		t.Fatalf("source not cleaned or not NULL when empty:\n%s", one)
	}
	for _, st := range stores {
		if err := st.RecordFailure(ctx, claimOf("hour", "f", "p", ""), "it failed"); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []dedup.Claim{claims[0], claimOf("hour", "a", `{"n":9}`, ""), claimOf("hour", "f", "p", ""), claimOf("hour", "f", "q", "")} {
		got := map[string]dedup.Result{}
		for table, st := range stores {
			// In the batch store, behind a fresh key, so that it goes
			// through the set-based path.
			cs := []dedup.Claim{c}
			if table == "batch" {
				cs = append(cs, claimOf("hour", fmt.Sprint("fresh-", time.Now().UnixNano()), "p", ""))
			}
			res, err := claimIn(ctx, st, cs...)
			if err != nil {
				t.Fatal(err)
			}
			got[table] = res[0]
		}
		if got["one"].Status != got["batch"].Status || got["one"].Reason != got["batch"].Reason || got["one"].Status == dedup.StatusNew {
			t.Errorf("claim of %s: alone %+v, in a batch %+v", c.Key, got["one"], got["batch"])
		}
		if got["one"].FirstAt.IsZero() || got["batch"].FirstAt.IsZero() {
			t.Errorf("claim of %s: FirstAt unset: alone %v, in a batch %v", c.Key, got["one"].FirstAt, got["batch"].FirstAt)
		}
	}
}

// TestOneKeyLookupPlan: the one-key lookup is a prepared statement, so
// Postgres may run it on a generic plan kept while the table grows (what
// TestLookupIsNotAPreparedStatement guards the batch lookup against). Its
// generic plan must be a primary-key probe, on an empty table and on a
// large one, in both modes.
func TestOneKeyLookupPlan(t *testing.T) {
	for _, distributed := range []bool{false, true} {
		t.Run(fmt.Sprintf("distributed=%v", distributed), func(t *testing.T) {
			pool := testenv.Pool(t)
			st, err := New(pool, Config{Schema: testenv.Schema(t, pool), Distributed: distributed})
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
			plan := func() string {
				t.Helper()
				var lines []string
				err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
					if _, err := tx.Exec(ctx, `SET LOCAL plan_cache_mode = force_generic_plan`); err != nil {
						return err
					}
					if _, err := tx.Exec(ctx, `PREPARE one_key_lookup AS `+st.lookupOneSQL); err != nil {
						return err
					}
					rows, err := tx.Query(ctx, `EXPLAIN EXECUTE one_key_lookup('s', 'k', '\x00'::bytea)`, pgx.QueryExecModeSimpleProtocol)
					if err != nil {
						return err
					}
					lines, err = pgx.CollectRows(rows, pgx.RowTo[string])
					if err != nil {
						return err
					}
					_, err = tx.Exec(ctx, `DEALLOCATE one_key_lookup`)
					return err
				})
				if err != nil {
					t.Fatal(err)
				}
				return strings.Join(lines, "\n")
			}
			check := func(when string) {
				p := plan()
				if !strings.Contains(p, "Index Scan using idem_dedup_pkey") || strings.Contains(p, "Seq Scan") {
					t.Errorf("generic plan of the one-key lookup %s:\n%s", when, p)
				}
			}
			check("on an empty table")
			cols, vals := "scope, key, fingerprint", `'s', 'k' || i, sha256(i::text::bytea)`
			if distributed {
				cols, vals = "shard, "+cols, "(i % 16)::int2, "+vals
			}
			if _, err := pool.Exec(ctx, `INSERT INTO `+st.table+` (`+cols+`) SELECT `+vals+` FROM generate_series(1, 50000) i`); err != nil {
				t.Fatal(err)
			}
			if _, err := pool.Exec(ctx, `ANALYZE `+st.table); err != nil {
				t.Fatal(err)
			}
			check("on a table of 50,000 rows")
		})
	}
}
