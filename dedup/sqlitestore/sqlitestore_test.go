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
