package pgstore_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/dedup/pgstore"
	"github.com/idemkit/idem/httpidem/httpidemtest"
	"github.com/idemkit/idem/internal/testenv"
)

// TestHTTPConformance runs the HTTP Idempotency-Key suite on Postgres, with
// connections dropped from the outside (pg_terminate_backend) as the
// mid-handler failure.
func TestHTTPConformance(t *testing.T) {
	httpidemtest.Run(t, func(t *testing.T, cfg httpidemtest.Config) httpidemtest.Harness[pgx.Tx] {
		pool := testenv.Pool(t)
		schema := testenv.Schema(t, pool)
		st, err := pgstore.New(pool, pgstore.Config{Schema: schema, LockTimeout: cfg.LockTimeout})
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		if err := st.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		effects := pgx.Identifier{schema, "effects"}.Sanitize()
		if _, err := pool.Exec(ctx, `CREATE TABLE `+effects+` (id text NOT NULL)`); err != nil {
			t.Fatal(err)
		}
		return httpidemtest.Harness[pgx.Tx]{
			Store: st,
			Effect: func(ctx context.Context, tx pgx.Tx, id string) error {
				_, err := tx.Exec(ctx, `INSERT INTO `+effects+` (id) VALUES ($1)`, id)
				return err
			},
			Effects: func(ctx context.Context, id string) (n int, err error) {
				err = pool.QueryRow(ctx, `SELECT count(*) FROM `+effects+` WHERE id = $1`, id).Scan(&n)
				return n, err
			},
			DropConn: func(ctx context.Context, tx pgx.Tx) error {
				// Waits up to 5 s for the backend to be gone.
				_, err := pool.Exec(ctx, `SELECT pg_terminate_backend($1, 5000)`, tx.Conn().PgConn().PID())
				return err
			},
		}
	})
}
