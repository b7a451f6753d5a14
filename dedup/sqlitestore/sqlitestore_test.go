package sqlitestore_test

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/deduptest"
	"github.com/idemkit/idem/dedup/sqlitestore"
	"github.com/idemkit/idem/internal/testenv/sqlitetest"
)

func TestConformance(t *testing.T) {
	deduptest.Run(t, func(t *testing.T, cfg deduptest.Config) dedup.Store[*sql.Tx] {
		st, _ := sqlitetest.Store(t, sqlitestore.Config{LockTimeout: cfg.LockTimeout, ScopeRetention: cfg.ScopeRetention})
		return st
	})
}

func TestConfigErrors(t *testing.T) {
	if _, err := sqlitestore.New(nil, sqlitestore.Config{}); err == nil {
		t.Error("nil db accepted")
	}
	db, err := sqlitestore.Open(filepath.Join(t.TempDir(), "x.db"), sqlitestore.Config{})
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
		{"Open", func(p string) (*sql.DB, error) { return sqlitestore.Open(p, sqlitestore.Config{}) }, 2},
		{"Open Normal", func(p string) (*sql.DB, error) {
			return sqlitestore.Open(p, sqlitestore.Config{Synchronous: sqlitestore.SynchronousNormal})
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
	if _, err := sqlitestore.Open(filepath.Join(t.TempDir(), "x.db"), sqlitestore.Config{Synchronous: 7}); err == nil {
		t.Error("an unknown Synchronous was accepted")
	}
}

// TestRunRefusesAStoreThatWasNeverMigrated: "no such table" used to be
// retried for ever; consumertest.Drive with a 4 s context returned after
// 34 s.
func TestRunRefusesAStoreThatWasNeverMigrated(t *testing.T) {
	st, _ := sqlitetest.Open(t, sqlitestore.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := consumertest.Drive(ctx, consumer.Config[*sql.Tx]{
		Name: "payments", Store: st, Key: consumer.ByMessageID(), Logger: slog.New(slog.DiscardHandler),
		Handler: consumer.HandlerFunc[*sql.Tx](func(context.Context, *sql.Tx, *consumer.Message) error { return nil }),
	}, consumertest.Script{}, consumertest.Message("payments", 0, 0, "", `{}`))
	if !errors.Is(err, dedup.ErrNotMigrated) || !strings.Contains(err.Error(), "Migrate") {
		t.Fatalf("Drive: %v, want dedup.ErrNotMigrated naming Migrate", err)
	}
}

// TestMissingBusinessTableStopsTheConsumer: a handler's missing table is a
// broken deployment, not a bad message: nothing dead-lettered or acked.
func TestMissingBusinessTableStopsTheConsumer(t *testing.T) {
	st, _ := sqlitetest.Store(t, sqlitestore.Config{})
	src := consumertest.NewSource(consumertest.Script{})
	m := consumertest.Message("payments", 0, 0, "", `{}`)
	res, err := consumertest.Drive(context.Background(), consumer.Config[*sql.Tx]{
		Name: "payments", Source: src, Store: st, Key: consumer.ByMessageID(), Logger: slog.New(slog.DiscardHandler),
		Handler: consumer.HandlerFunc[*sql.Tx](func(ctx context.Context, tx *sql.Tx, _ *consumer.Message) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO ledger VALUES (1)`)
			return err
		}),
	}, consumertest.Script{}, m)
	if err == nil || !strings.Contains(err.Error(), "no such table") {
		t.Fatalf("Drive: %v, want Run to stop with the missing table", err)
	}
	if src.Acked(m.ID) != 0 || len(res.DeadLetters) != 0 {
		t.Errorf("acked %d, dead letters %v", src.Acked(m.ID), res.DeadLetters)
	}
}

func TestAdmin(t *testing.T) {
	deduptest.RunAdmin(t, func(t *testing.T) (dedup.Store[*sql.Tx], dedup.Admin) {
		st, _ := sqlitetest.Store(t, sqlitestore.Config{ScopeRetention: map[string]time.Duration{"hour": time.Hour}})
		return st, st.Admin()
	})
}

func TestEpochsConformance(t *testing.T) {
	deduptest.RunEpochs(t, func(t *testing.T) dedup.EpochStore {
		st, _ := sqlitetest.Open(t, sqlitestore.Config{})
		if _, err := st.Epochs(context.Background()); !errors.Is(err, dedup.ErrNotMigrated) {
			t.Fatalf("Epochs before Migrate: %v, want ErrNotMigrated", err)
		}
		if err := st.Migrate(context.Background()); err != nil {
			t.Fatal(err)
		}
		return st
	})
}

// TestMigrateConcurrently: migrators of one file in four processes (four
// pools here) take turns under SQLite's write lock; each migration is
// applied and recorded once.
func TestMigrateConcurrently(t *testing.T) {
	path := filepath.Join(t.TempDir(), "idem.db")
	errs := make(chan error, 4)
	for range 4 {
		go func() {
			db, err := sqlitestore.Open(path, sqlitestore.Config{})
			if err != nil {
				errs <- err
				return
			}
			defer db.Close()
			st, err := sqlitestore.New(db, sqlitestore.Config{})
			if err == nil {
				err = st.Migrate(context.Background())
			}
			errs <- err
		}()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Fatalf("Migrate: %v", err)
		}
	}
	db, err := sqlitestore.Open(path, sqlitestore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var n, versions int
	if err := db.QueryRow(`SELECT count(*), count(DISTINCT version) FROM idem_schema_migrations WHERE table_name = 'idem_dedup'`).Scan(&n, &versions); err != nil {
		t.Fatal(err)
	}
	if n != 8 || versions != 8 {
		t.Fatalf("%d version rows for %d versions, want each of the 8 once", n, versions)
	}
}
