package sqlitestore_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/deduptest"
	"github.com/idemkit/idem/dedup/sqlitestore"
)

func TestConformance(t *testing.T) {
	deduptest.Run(t, func(t *testing.T, cfg deduptest.Config) dedup.Store[*sql.Tx] {
		db, err := sqlitestore.Open(filepath.Join(t.TempDir(), "idem.db"), cfg.LockTimeout)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		st, err := sqlitestore.New(db, sqlitestore.Config{LockTimeout: cfg.LockTimeout, ScopeRetention: cfg.ScopeRetention})
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Migrate(context.Background()); err != nil {
			t.Fatal(err)
		}
		return st
	})
}

func TestConfigErrors(t *testing.T) {
	if _, err := sqlitestore.New(nil, sqlitestore.Config{}); err == nil {
		t.Error("nil db accepted")
	}
	db, err := sqlitestore.Open(filepath.Join(t.TempDir(), "x.db"), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := sqlitestore.New(db, sqlitestore.Config{Table: "x; drop"}); err == nil {
		t.Error("bad table name accepted")
	}
}

// TestOpenIsDurable: the consumer acknowledges the broker right after COMMIT,
// so a committed transaction must survive a power loss: Open syncs the WAL on
// every commit (synchronous=FULL, 2). NORMAL (1) is an explicit choice.
func TestOpenIsDurable(t *testing.T) {
	for _, tc := range []struct {
		name string
		open func(path string) (*sql.DB, error)
		want int
	}{
		{"Open", func(p string) (*sql.DB, error) { return sqlitestore.Open(p, 0) }, 2},
		{"OpenWith zero", func(p string) (*sql.DB, error) { return sqlitestore.OpenWith(p, sqlitestore.OpenOptions{}) }, 2},
		{"OpenWith Normal", func(p string) (*sql.DB, error) {
			return sqlitestore.OpenWith(p, sqlitestore.OpenOptions{Synchronous: sqlitestore.SynchronousNormal})
		}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db, err := tc.open(filepath.Join(t.TempDir(), "d.db"))
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			var journal string
			var sync int
			if err := db.QueryRow("PRAGMA journal_mode").Scan(&journal); err != nil {
				t.Fatal(err)
			}
			if err := db.QueryRow("PRAGMA synchronous").Scan(&sync); err != nil {
				t.Fatal(err)
			}
			if journal != "wal" || sync != tc.want {
				t.Errorf("journal_mode=%s synchronous=%d, want wal and %d", journal, sync, tc.want)
			}
		})
	}
	if _, err := sqlitestore.OpenWith(filepath.Join(t.TempDir(), "x.db"), sqlitestore.OpenOptions{Synchronous: 7}); err == nil {
		t.Error("an unknown Synchronous was accepted")
	}
}
