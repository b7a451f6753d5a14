package sqlitestore_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"

	"github.com/idemkit/idem/dedup/sqlitestore"
	"github.com/idemkit/idem/httpidem/httpidemtest"
)

// TestHTTPConformance runs the HTTP Idempotency-Key suite on SQLite.
func TestHTTPConformance(t *testing.T) {
	httpidemtest.Run(t, func(t *testing.T, cfg httpidemtest.Config) httpidemtest.Harness[*sql.Tx] {
		db, err := sqlitestore.Open(filepath.Join(t.TempDir(), "idem.db"), cfg.LockTimeout)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		st, err := sqlitestore.New(db, sqlitestore.Config{LockTimeout: cfg.LockTimeout})
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		if err := st.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := db.ExecContext(ctx, `CREATE TABLE effects (id TEXT NOT NULL)`); err != nil {
			t.Fatal(err)
		}
		return httpidemtest.Harness[*sql.Tx]{
			Store: st,
			Effect: func(ctx context.Context, tx *sql.Tx, id string) error {
				_, err := tx.ExecContext(ctx, `INSERT INTO effects (id) VALUES (?)`, id)
				return err
			},
			Effects: func(ctx context.Context, id string) (n int, err error) {
				err = db.QueryRowContext(ctx, `SELECT count(*) FROM effects WHERE id = ?`, id).Scan(&n)
				return n, err
			},
			OneWriter: true,
		}
	})
}
