package sqlitestore_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/deduptest"
	"github.com/idemkit/idem/dedup/sqlitestore"
	"github.com/idemkit/idem/httpidem/httpidemtest"
	"github.com/idemkit/idem/internal/testenv/sqlitetest"
)

// requestHarness is a fresh store for the request suites, with a business
// table of effects.
func requestHarness(t *testing.T, lockTimeout time.Duration) deduptest.RequestHarness[*sql.Tx] {
	st, db := sqlitetest.Store(t, sqlitestore.Config{LockTimeout: lockTimeout})
	if _, err := db.ExecContext(context.Background(), `CREATE TABLE effects (id TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return deduptest.RequestHarness[*sql.Tx]{
		Store: st,
		Effect: func(ctx context.Context, tx *sql.Tx, id string) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO effects (id) VALUES (?)`, id)
			return err
		},
		Effects: func(ctx context.Context, id string) (n int, err error) {
			err = db.QueryRowContext(ctx, `SELECT count(*) FROM effects WHERE id = ?`, id).Scan(&n)
			return n, err
		},
	}
}

func TestRequestsConformance(t *testing.T) {
	deduptest.RunRequests(t, func(t *testing.T, cfg deduptest.RequestConfig) deduptest.RequestHarness[*sql.Tx] {
		return requestHarness(t, cfg.LockTimeout)
	})
}

// TestHTTPConformance runs the HTTP Idempotency-Key middleware's suite on
// SQLite.
func TestHTTPConformance(t *testing.T) {
	httpidemtest.Run(t, func(t *testing.T, cfg httpidemtest.Config) httpidemtest.Harness[*sql.Tx] {
		return httpidemtest.Harness[*sql.Tx]{RequestHarness: requestHarness(t, cfg.LockTimeout), OneWriter: true}
	})
}

// TestLeaseKeepsItsRow: a lease is never shorter than its row. Extending
// a lease past the key's retention pushes the row's expiry to the lease's
// end; and Purge spares a key whose lease runs even when its row says it
// expired (as rows written before that rule do), deleting it once the
// lease has run out.
func TestLeaseKeepsItsRow(t *testing.T) {
	st, db := sqlitetest.Store(t, sqlitestore.Config{})
	ctx := context.Background()
	c := dedup.Claim{Key: dedup.Key{Scope: "POST /payouts", ID: "p1"}, Fingerprint: dedup.FingerprintOf([]byte("x"))}
	rec, err := st.AcquireLease(ctx, c, time.Millisecond, time.Millisecond)
	if err != nil || rec.Verdict != dedup.VerdictRun {
		t.Fatalf("acquire: %+v, %v", rec, err)
	}
	if err := st.ExtendLease(ctx, c.Key, rec.Token, time.Hour); err != nil {
		t.Fatalf("extend: %v", err)
	}
	var exp, lease int64
	if err := db.QueryRowContext(ctx, `SELECT expires_at, lease_expires_at FROM `+st.Table()+` WHERE scope = ? AND key = ?`,
		c.Key.Scope, c.Key.ID).Scan(&exp, &lease); err != nil {
		t.Fatal(err)
	}
	if exp < lease || time.Until(time.UnixMilli(lease)) < 50*time.Minute {
		t.Fatalf("after extending the lease by an hour: row expires %v, lease %v; want the row to outlive the lease", time.UnixMilli(exp), time.UnixMilli(lease))
	}
	setRow := func(set string, v int64) {
		t.Helper()
		if _, err := db.ExecContext(ctx, `UPDATE `+st.Table()+` SET `+set+` = ? WHERE scope = ? AND key = ?`, v, c.Key.Scope, c.Key.ID); err != nil {
			t.Fatal(err)
		}
	}
	setRow("expires_at", time.Now().Add(-time.Hour).UnixMilli())
	if n, err := st.Purge(ctx, 10); err != nil || n != 0 {
		t.Fatalf("purge of an expired row whose lease runs: %d, %v; want it spared", n, err)
	}
	setRow("lease_expires_at", time.Now().Add(-time.Second).UnixMilli())
	if n, err := st.Purge(ctx, 10); err != nil || n != 1 {
		t.Fatalf("purge once the lease ran out: %d, %v; want the row deleted", n, err)
	}
}

// TestMigrateAdoptsUnversionedDatabases: a database that an earlier,
// unversioned Migrate left at any of its four states (the table; with the
// HTTP request columns; with the counter of lease tokens; with the release
// epochs) fails Check until Migrate, which records what it has, applies
// the rest and keeps its rows: the schema is then a fresh one's, a lease
// token given after the upgrade is larger than any stored (the counter is
// seeded from them when it was missing), and a second Migrate changes
// nothing.
func TestMigrateAdoptsUnversionedDatabases(t *testing.T) {
	_, freshDB := sqlitetest.Store(t, sqlitestore.Config{})
	want := schemaOf(t, freshDB)
	steps, err := filepath.Glob(filepath.Join("testdata", "unversioned", "*.sql"))
	if err != nil || len(steps) != 4 {
		t.Fatalf("fixtures %v, %v: want the four states of the unversioned Migrate", steps, err)
	}
	for n := 1; n <= len(steps); n++ {
		t.Run(filepath.Base(steps[n-1]), func(t *testing.T) {
			st, db := sqlitetest.Open(t, sqlitestore.Config{})
			ctx := context.Background()
			// Each state's rows are written by the release that made it,
			// before the next one's Migrate.
			fp := dedup.FingerprintOf([]byte("x"))
			rows := map[int]string{
				1: `INSERT INTO idem_dedup (scope, key, fingerprint) VALUES ('payments', 'm1', ?)`,
				// A request its lease holds, with a token of the old counting.
				2: `INSERT INTO idem_dedup (scope, key, fingerprint, state, token, lease_expires_at)
VALUES ('POST /payouts', 'p1', ?, 'processing', 41, ` + "CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)" + ` + 3600000)`,
			}
			for i, f := range steps[:n] {
				ddl, err := os.ReadFile(f)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := db.ExecContext(ctx, string(ddl)); err != nil {
					t.Fatalf("%s: %v", f, err)
				}
				if q, ok := rows[i+1]; ok {
					if _, err := db.ExecContext(ctx, q, fp[:]); err != nil {
						t.Fatal(err)
					}
				}
			}
			if err := st.Check(ctx); !errors.Is(err, dedup.ErrNotMigrated) {
				t.Fatalf("Check before Migrate: %v, want ErrNotMigrated", err)
			}
			for range 2 {
				if err := st.Migrate(ctx); err != nil {
					t.Fatalf("Migrate: %v", err)
				}
			}
			if err := st.Check(ctx); err != nil {
				t.Fatalf("Check after Migrate: %v", err)
			}
			if got := schemaOf(t, db); got != want {
				t.Fatalf("schema after the upgrade:\n%s\nwant a fresh one's:\n%s", got, want)
			}
			var versions int
			if err := db.QueryRowContext(ctx, `SELECT count(*) FROM idem_schema_migrations WHERE table_name = 'idem_dedup'`).Scan(&versions); err != nil || versions != 8 {
				t.Fatalf("%d versions recorded (%v), want 8, once each", versions, err)
			}
			res := make([]dedup.Result, 1)
			err := st.InTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
				return st.Claim(ctx, tx, []dedup.Claim{{Key: dedup.Key{Scope: "payments", ID: "m1"}, Fingerprint: fp}}, res)
			})
			if err != nil || res[0].Status != dedup.StatusDuplicate {
				t.Fatalf("the stored key after the upgrade: %v, %v; want a duplicate", res[0].Status, err)
			}
			rec, err := st.AcquireLease(ctx, dedup.Claim{Key: dedup.Key{Scope: "POST /payouts", ID: "p2"}, Fingerprint: fp}, time.Hour, time.Hour)
			if err != nil || rec.Verdict != dedup.VerdictRun || n >= 2 && rec.Token <= 41 {
				t.Fatalf("a new key after the upgrade: %+v, %v; want it run, with a token above the stored 41", rec, err)
			}
			if n >= 2 {
				busy, err := st.AcquireLease(ctx, dedup.Claim{Key: dedup.Key{Scope: "POST /payouts", ID: "p1"}, Fingerprint: fp}, time.Hour, time.Hour)
				if err != nil || busy.Verdict != dedup.VerdictBusy || busy.Token != 41 {
					t.Fatalf("the stored lease after the upgrade: %+v, %v; want it busy with token 41", busy, err)
				}
			}
		})
	}
}

// schemaOf is the database's tables and indexes as SQL, spaces collapsed.
func schemaOf(t *testing.T, db *sql.DB) string {
	t.Helper()
	rows, err := db.Query(`SELECT type, name, coalesce(sql, '') FROM sqlite_master WHERE name NOT LIKE 'sqlite_%' ORDER BY type, name`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var b strings.Builder
	for rows.Next() {
		var typ, name, def string
		if err := rows.Scan(&typ, &name, &def); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "%s %s: %s\n", typ, name, strings.Join(strings.Fields(def), " "))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return b.String()
}
