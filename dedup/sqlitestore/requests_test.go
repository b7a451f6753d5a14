package sqlitestore_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/deduptest"
	"github.com/idemkit/idem/dedup/sqlitestore"
	"github.com/idemkit/idem/httpidem/httpidemtest"
)

// requestHarness is a fresh store for the request suites, with a business
// table of effects.
func requestHarness(t *testing.T, lockTimeout time.Duration) deduptest.RequestHarness[*sql.Tx] {
	st, db := openStore(t, sqlitestore.Config{LockTimeout: lockTimeout}, false)
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
	st, db := openStore(t, sqlitestore.Config{}, false)
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

// TestMigrateSeedsTokens: a table migrated before the counter of lease
// tokens existed fails Check until Migrate, which seeds the counter with
// the largest token stored: the next token given to a key is larger than
// any it had.
func TestMigrateSeedsTokens(t *testing.T) {
	st, db := openStore(t, sqlitestore.Config{}, false)
	ctx := context.Background()
	c := dedup.Claim{Key: dedup.Key{Scope: "POST /payouts", ID: "p1"}, Fingerprint: dedup.FingerprintOf([]byte("x"))}
	if rec, err := st.AcquireLease(ctx, c, time.Hour, time.Hour); err != nil || rec.Verdict != dedup.VerdictRun {
		t.Fatalf("acquire: %+v, %v", rec, err)
	}
	// The table as an earlier version left it: tokens counted per key.
	if _, err := db.ExecContext(ctx, `DROP TABLE idem_dedup_tokens; UPDATE idem_dedup SET token = 41`); err != nil {
		t.Fatal(err)
	}
	if err := st.Check(ctx); !errors.Is(err, dedup.ErrNotMigrated) {
		t.Fatalf("Check without the counter: %v, want ErrNotMigrated", err)
	}
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := st.Check(ctx); err != nil {
		t.Fatalf("Check after Migrate: %v", err)
	}
	other := dedup.Claim{Key: dedup.Key{Scope: "POST /payouts", ID: "p2"}, Fingerprint: c.Fingerprint}
	rec, err := st.AcquireLease(ctx, other, time.Hour, time.Hour)
	if err != nil || rec.Verdict != dedup.VerdictRun || rec.Token <= 41 {
		t.Fatalf("a new key after the upgrade: %+v, %v; want a token above the stored 41", rec, err)
	}
}
