package pgstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/deduptest"
	"github.com/idemkit/idem/dedup/pgstore"
	"github.com/idemkit/idem/httpidem/httpidemtest"
	"github.com/idemkit/idem/internal/testenv"
)

// requestHarness is a fresh store for the request suites, with a business
// table of effects, on pool.
func requestHarness(t *testing.T, pool *pgxpool.Pool, lockTimeout time.Duration) deduptest.RequestHarness[pgx.Tx] {
	schema := testenv.Schema(t, pool)
	st, err := pgstore.New(pool, pgstore.Config{Schema: schema, LockTimeout: lockTimeout})
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
	return deduptest.RequestHarness[pgx.Tx]{
		Store: st,
		Effect: func(ctx context.Context, tx pgx.Tx, id string) error {
			_, err := tx.Exec(ctx, `INSERT INTO `+effects+` (id) VALUES ($1)`, id)
			return err
		},
		Effects: func(ctx context.Context, id string) (n int, err error) {
			err = pool.QueryRow(ctx, `SELECT count(*) FROM `+effects+` WHERE id = $1`, id).Scan(&n)
			return n, err
		},
	}
}

func TestRequestsConformance(t *testing.T) {
	deduptest.RunRequests(t, func(t *testing.T, cfg deduptest.RequestConfig) deduptest.RequestHarness[pgx.Tx] {
		return requestHarness(t, testenv.Pool(t), cfg.LockTimeout)
	})
}

// TestHTTPConformance runs the HTTP Idempotency-Key middleware's suite on
// Postgres, with connections dropped from the outside
// (pg_terminate_backend) as the mid-handler failure.
func TestHTTPConformance(t *testing.T) {
	httpidemtest.Run(t, func(t *testing.T, cfg httpidemtest.Config) httpidemtest.Harness[pgx.Tx] {
		pool := testenv.Pool(t)
		return httpidemtest.Harness[pgx.Tx]{
			RequestHarness: requestHarness(t, pool, cfg.LockTimeout),
			DropConn: func(ctx context.Context, tx pgx.Tx) error {
				// Waits up to 5 s for the backend to be gone.
				_, err := pool.Exec(ctx, `SELECT pg_terminate_backend($1, 5000)`, tx.Conn().PgConn().PID())
				return err
			},
		}
	})
}

// TestRequestTxIsTheStores: a request's handler cannot end its transaction
// (the store commits it, pipelined with the key's row), nor use it after
// returning: the connection may by then serve another request.
func TestRequestTxIsTheStores(t *testing.T) {
	st := newStore(t, pgstore.Config{})
	ctx := context.Background()
	c := dedup.Claim{Key: dedup.Key{Scope: "POST /x", ID: "k1"}, Fingerprint: dedup.FingerprintOf([]byte("x"))}
	var leaked pgx.Tx
	rec, err := st.RunRequest(ctx, c, time.Hour, func(ctx context.Context, tx pgx.Tx) (dedup.StoredResponse, error) {
		if err := tx.Commit(ctx); !errors.Is(err, dedup.ErrTxEnded) {
			t.Errorf("Commit by the handler: %v, want ErrTxEnded", err)
		}
		if err := tx.Rollback(ctx); !errors.Is(err, dedup.ErrTxEnded) {
			t.Errorf("Rollback by the handler: %v, want ErrTxEnded", err)
		}
		nested, err := tx.Begin(ctx) // a savepoint still works
		if err != nil {
			return dedup.StoredResponse{}, err
		}
		if err := nested.Rollback(ctx); err != nil {
			return dedup.StoredResponse{}, err
		}
		leaked = tx
		return dedup.StoredResponse{Status: 204}, nil
	})
	if err != nil || rec.Verdict != dedup.VerdictRun {
		t.Fatalf("run: %+v, %v", rec, err)
	}
	if _, err := leaked.Exec(ctx, `SELECT 1`); !errors.Is(err, pgx.ErrTxClosed) {
		t.Fatalf("the transaction after the handler returned: %v, want ErrTxClosed", err)
	}
	if err := leaked.QueryRow(ctx, `SELECT 1`).Scan(new(int)); !errors.Is(err, pgx.ErrTxClosed) {
		t.Fatalf("QueryRow after the handler returned: %v, want ErrTxClosed", err)
	}
	if err := leaked.SendBatch(ctx, &pgx.Batch{}).Close(); !errors.Is(err, pgx.ErrTxClosed) {
		t.Fatalf("SendBatch after the handler returned: %v, want ErrTxClosed", err)
	}
}

// TestRequestSwallowedError: a handler that swallows a failed statement
// and returns a response gets an error, not a commit.
func TestRequestSwallowedError(t *testing.T) {
	st := newStore(t, pgstore.Config{})
	ctx := context.Background()
	c := dedup.Claim{Key: dedup.Key{Scope: "POST /x", ID: "k1"}, Fingerprint: dedup.FingerprintOf([]byte("x"))}
	_, err := st.RunRequest(ctx, c, time.Hour, func(ctx context.Context, tx pgx.Tx) (dedup.StoredResponse, error) {
		_, _ = tx.Exec(ctx, `SELECT 1/0`) // swallowed
		return dedup.StoredResponse{Status: 201}, nil
	})
	if !errors.Is(err, pgx.ErrTxCommitRollback) {
		t.Fatalf("run: %v, want ErrTxCommitRollback", err)
	}
	rec, err := st.RunRequest(ctx, c, time.Hour, func(context.Context, pgx.Tx) (dedup.StoredResponse, error) {
		return dedup.StoredResponse{Status: 201}, nil
	})
	if err != nil || rec.Verdict != dedup.VerdictRun {
		t.Fatalf("the key after the failed run: %+v, %v; want it free", rec, err)
	}
}

// TestLeaseKeepsItsRow: a lease is never shorter than its row. Extending
// a lease past the key's retention pushes the row's expiry to the lease's
// end; and Purge spares a key whose lease runs even when its row says it
// expired (as rows written before that rule do), deleting it once the
// lease has run out.
func TestLeaseKeepsItsRow(t *testing.T) {
	pool := testenv.Pool(t)
	st, err := pgstore.New(pool, pgstore.Config{Schema: testenv.Schema(t, pool)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	c := dedup.Claim{Key: dedup.Key{Scope: "POST /payouts", ID: "p1"}, Fingerprint: dedup.FingerprintOf([]byte("x"))}
	rec, err := st.AcquireLease(ctx, c, time.Millisecond, time.Millisecond)
	if err != nil || rec.Verdict != dedup.VerdictRun {
		t.Fatalf("acquire: %+v, %v", rec, err)
	}
	if err := st.ExtendLease(ctx, c.Key, rec.Token, time.Hour); err != nil {
		t.Fatalf("extend: %v", err)
	}
	var outlives bool
	if err := pool.QueryRow(ctx, `SELECT expires_at >= lease_expires_at AND lease_expires_at > now() + interval '50 minutes'
FROM `+st.Table()+` WHERE scope = $1 AND key = $2`, c.Key.Scope, c.Key.ID).Scan(&outlives); err != nil {
		t.Fatal(err)
	}
	if !outlives {
		t.Fatal("after extending the lease by an hour the row expires before the lease ends")
	}
	setRow := func(set string) {
		t.Helper()
		if _, err := pool.Exec(ctx, `UPDATE `+st.Table()+` SET `+set+` WHERE scope = $1 AND key = $2`, c.Key.Scope, c.Key.ID); err != nil {
			t.Fatal(err)
		}
	}
	setRow(`expires_at = now() - interval '1 hour'`)
	if n, err := st.Purge(ctx, 10); err != nil || n != 0 {
		t.Fatalf("purge of an expired row whose lease runs: %d, %v; want it spared", n, err)
	}
	setRow(`lease_expires_at = now() - interval '1 second'`)
	if n, err := st.Purge(ctx, 10); err != nil || n != 1 {
		t.Fatalf("purge once the lease ran out: %d, %v; want the row deleted", n, err)
	}
}

// TestRequestsOfTwoTablesDoNotCollide: advisory locks are the database's,
// so two stores of one database (two services, a schema per tenant) that
// hold the same route and key must not make each other Busy: the lock's
// hash is seeded with the table.
func TestRequestsOfTwoTablesDoNotCollide(t *testing.T) {
	pool := testenv.Pool(t)
	ctx := context.Background()
	var stores [2]*pgstore.Store
	for i := range stores {
		st, err := pgstore.New(pool, pgstore.Config{Schema: testenv.Schema(t, pool), LockTimeout: 200 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		stores[i] = st
	}
	c := dedup.Claim{Key: dedup.Key{Scope: "POST /payouts", ID: "p1"}, Fingerprint: dedup.FingerprintOf([]byte("x"))}
	holding, release := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := stores[0].RunRequest(ctx, c, time.Hour, func(context.Context, pgx.Tx) (dedup.StoredResponse, error) {
			close(holding)
			<-release
			return dedup.StoredResponse{Status: 201}, nil
		})
		done <- err
	}()
	<-holding
	rec, err := stores[1].RunRequest(ctx, c, time.Hour, func(context.Context, pgx.Tx) (dedup.StoredResponse, error) {
		return dedup.StoredResponse{Status: 201}, nil
	})
	close(release)
	if err != nil || rec.Verdict != dedup.VerdictRun {
		t.Errorf("the other table's request while the first table's runs: %+v, %v; want it run", rec, err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
