package testenv

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Distributed is real Postgres with what CockroachDB and YugabyteDB lack
// refused, for pgstore's distributed mode:
//
//   - advisory-lock functions: a schema of shadowing functions, named like
//     pg_catalog's, that raise 0A000, on the pool's search_path before
//     pg_catalog, which is listed after it (unlisted, pg_catalog would be
//     searched first and win);
//   - ctid, advisory locks (also schema-qualified), lock_timeout and
//     hashtext, which no function can shadow: a pgx tracer sees every
//     statement the pool sends, and the test fails on any that names them;
//   - more than one DDL statement per transaction: the tracer fails a
//     CREATE, ALTER or DROP sent inside an explicit transaction or holding a
//     second statement;
//   - READ COMMITTED: default_transaction_isolation is serializable.
//
// Pool is that pool, its search_path Schema (where unqualified tables go),
// Shadow, pg_catalog; Admin is an unrestricted, untraced pool for fixtures
// (triggers).
type Distributed struct {
	Pool   *pgxpool.Pool
	Admin  *pgxpool.Pool
	Schema string
	Shadow string
	tr     *sqlTracer
}

// advisoryFuncs are the advisory-lock functions shadowed, with pg_catalog's
// argument lists.
var advisoryFuncs = []string{
	"pg_advisory_lock", "pg_advisory_lock_shared", "pg_advisory_unlock", "pg_advisory_unlock_shared",
	"pg_advisory_xact_lock", "pg_advisory_xact_lock_shared",
	"pg_try_advisory_lock", "pg_try_advisory_lock_shared",
	"pg_try_advisory_xact_lock", "pg_try_advisory_xact_lock_shared",
}

// NewDistributed sets up a Distributed environment for t. Unless
// AllowViolations is called, the test fails at its end when the pool sent a
// refused statement.
func NewDistributed(t testing.TB) *Distributed {
	t.Helper()
	admin := Pool(t)
	d := &Distributed{Admin: admin, Schema: Schema(t, admin), Shadow: Schema(t, admin), tr: &sqlTracer{}}
	ctx := context.Background()
	shadow := pgx.Identifier{d.Shadow}.Sanitize()
	for _, f := range advisoryFuncs {
		for _, args := range []string{"bigint", "integer, integer"} {
			_, err := admin.Exec(ctx, fmt.Sprintf(`CREATE FUNCTION %s.%s(%s) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'advisory locks are refused here: %% (a distributed SQL database may not have them)', %s USING ERRCODE = '0A000';
END$$`, shadow, f, args, "'"+f+"'"))
			if err != nil {
				t.Fatalf("shadow %s(%s): %v", f, args, err)
			}
		}
	}
	cfg, err := pgxpool.ParseConfig(PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 20
	cfg.ConnConfig.RuntimeParams["search_path"] = d.Schema + ", " + d.Shadow + ", pg_catalog"
	cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = "serializable"
	cfg.ConnConfig.Tracer = d.tr
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	d.Pool = pool
	t.Cleanup(func() {
		pool.Close()
		if d.tr.allowed() {
			return
		}
		for _, v := range d.Violations() {
			t.Errorf("refused in distributed mode: %s", v)
		}
	})
	return d
}

// Violations lists the refused statements the pool sent so far.
func (d *Distributed) Violations() []string { return d.tr.list() }

// AllowViolations keeps the test from failing on them: for a test that
// shows the restrictions bite.
func (d *Distributed) AllowViolations() { d.tr.allow() }

// Statements is how many statements the pool sent so far.
func (d *Distributed) Statements() int { return d.tr.count() }

// InjectFailures makes the first n row inserts into table (qualified) fail,
// alternately with a serialization failure (40001) and a deadlock (40P01),
// through a trigger installed by the Admin pool. Sequences count the
// attempts: nextval is not rolled back with the failed transaction. The
// function returned reports how many failures were injected so far.
func (d *Distributed) InjectFailures(t testing.TB, table string, n int) func() int64 {
	t.Helper()
	ctx := context.Background()
	schema := pgx.Identifier{d.Schema}.Sanitize()
	for _, stmt := range []string{
		`CREATE SEQUENCE ` + schema + `.inject_attempts`,
		`CREATE SEQUENCE ` + schema + `.inject_failed`,
		fmt.Sprintf(`CREATE FUNCTION %[1]s.inject() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    n bigint := nextval('%[1]s.inject_attempts');
BEGIN
    IF n <= %[2]d THEN
        PERFORM nextval('%[1]s.inject_failed');
        IF n %% 2 = 1 THEN
            RAISE EXCEPTION 'injected serialization failure %%', n USING ERRCODE = '40001';
        END IF;
        RAISE EXCEPTION 'injected deadlock %%', n USING ERRCODE = '40P01';
    END IF;
    RETURN NEW;
END$$`, schema, n),
		`CREATE TRIGGER inject BEFORE INSERT ON ` + table + ` FOR EACH ROW EXECUTE FUNCTION ` + schema + `.inject()`,
	} {
		if _, err := d.Admin.Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	return func() int64 {
		var failed int64
		if err := d.Admin.QueryRow(ctx, `SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM `+schema+`.inject_failed`).Scan(&failed); err != nil {
			t.Fatal(err)
		}
		return failed
	}
}

var (
	refusedRE = regexp.MustCompile(`(?i)\b(ctid|pg_(try_)?advisory_\w+|lock_timeout|hashtext\w*)\b`)
	ddlRE     = regexp.MustCompile(`(?i)^\s*(create|alter|drop)\b`)
)

// sqlTracer checks every statement a pool sends.
type sqlTracer struct {
	mu         sync.Mutex
	n          int
	violations []string
	allowAll   bool
}

func (tr *sqlTracer) check(conn *pgx.Conn, sql string) {
	var v string
	switch {
	case refusedRE.MatchString(sql):
		v = fmt.Sprintf("%q in %s", refusedRE.FindString(sql), oneLine(sql))
	case ddlRE.MatchString(sql) && conn.PgConn().TxStatus() != 'I':
		v = "DDL inside an explicit transaction: " + oneLine(sql)
	case ddlRE.MatchString(sql) && strings.Contains(strings.TrimRight(strings.TrimSpace(sql), ";"), ";"):
		v = "more than one statement with DDL in one transaction: " + oneLine(sql)
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.n++
	if v != "" {
		tr.violations = append(tr.violations, v)
	}
}

func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	return s
}

func (tr *sqlTracer) list() []string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return append([]string(nil), tr.violations...)
}

func (tr *sqlTracer) count() int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.n
}

func (tr *sqlTracer) allow() {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.allowAll = true
}

func (tr *sqlTracer) allowed() bool {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.allowAll
}

func (tr *sqlTracer) TraceQueryStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	tr.check(conn, data.SQL)
	return ctx
}

func (tr *sqlTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (tr *sqlTracer) TraceBatchStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceBatchStartData) context.Context {
	for _, q := range data.Batch.QueuedQueries {
		tr.check(conn, q.SQL)
	}
	return ctx
}

func (tr *sqlTracer) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (tr *sqlTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

var (
	_ pgx.QueryTracer = (*sqlTracer)(nil)
	_ pgx.BatchTracer = (*sqlTracer)(nil)
)
