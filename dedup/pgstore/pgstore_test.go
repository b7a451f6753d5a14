package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/deduptest"
	"github.com/idemkit/idem/dedup/pgstore"
	"github.com/idemkit/idem/internal/testenv"
)

func newStore(t *testing.T, cfg pgstore.Config) *pgstore.Store {
	t.Helper()
	pool := testenv.Pool(t)
	if cfg.Schema == "" {
		cfg.Schema = testenv.Schema(t, pool)
	}
	st, err := pgstore.New(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return st
}

func TestConformance(t *testing.T) {
	deduptest.Run(t, func(t *testing.T, cfg deduptest.Config) dedup.Store[pgx.Tx] {
		return newStore(t, pgstore.Config{LockTimeout: cfg.LockTimeout, ScopeRetention: cfg.ScopeRetention})
	})
}

func TestMigrateTwiceAndConcurrently(t *testing.T) {
	pool := testenv.Pool(t)
	schema := testenv.Schema(t, pool)
	ctx := context.Background()
	errs := make(chan error, 4)
	for range 4 {
		go func() {
			st, err := pgstore.New(pool, pgstore.Config{Schema: schema, Table: "dedup_x"})
			if err == nil {
				err = st.Migrate(ctx)
			}
			errs <- err
		}()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Fatalf("Migrate: %v", err)
		}
	}
	var n, versions, last int
	if err := pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT version), max(version) FROM `+pgx.Identifier{schema, "idem_schema_migrations"}.Sanitize()+` WHERE table_name = 'dedup_x'`).Scan(&n, &versions, &last); err != nil {
		t.Fatal(err)
	}
	if n != versions || n != last || n < 2 {
		t.Fatalf("%d migration rows for %d versions up to %d: want each of the migrations (two or more) once", n, versions, last)
	}
}

func TestConfigRejectsBadIdentifiers(t *testing.T) {
	pool := testenv.Pool(t)
	for _, cfg := range []pgstore.Config{
		{Table: `dedup"; DROP TABLE x; --`},
		{Schema: "Public"},
		{Table: strings.Repeat("a", 49)},
		{LockTimeout: -time.Second},
	} {
		if _, err := pgstore.New(pool, cfg); err == nil {
			t.Errorf("New(%+v) accepted", cfg)
		} else if !strings.Contains(err.Error(), "Config.") {
			t.Errorf("error does not name the field: %v", err)
		}
	}
	if _, err := pgstore.New(nil, pgstore.Config{}); err == nil {
		t.Error("New(nil pool) accepted")
	}
}

func TestRetentionUsesDatabaseClock(t *testing.T) {
	st := newStore(t, pgstore.Config{Retention: time.Hour, ScopeRetention: map[string]time.Duration{"forever": 0}})
	ctx := context.Background()
	err := st.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		res := make([]dedup.Result, 2)
		return st.Claim(ctx, tx, []dedup.Claim{deduptest.Claim("hour", "a", "p"), deduptest.Claim("forever", "b", "p")}, res)
	})
	if err != nil {
		t.Fatal(err)
	}
	pool := testenv.Pool(t)
	var hourOK, foreverNull bool
	q := `SELECT bool_and(CASE WHEN scope = 'hour' THEN expires_at BETWEEN now() + interval '59 minutes' AND now() + interval '61 minutes' ELSE true END),
	             bool_and(CASE WHEN scope = 'forever' THEN expires_at IS NULL ELSE true END) FROM ` + st.Table()
	if err := pool.QueryRow(ctx, q).Scan(&hourOK, &foreverNull); err != nil {
		t.Fatal(err)
	}
	if !hourOK || !foreverNull {
		t.Fatalf("expiry: hour scope ok=%v, forever scope NULL=%v", hourOK, foreverNull)
	}
}

// TestClassifyStoreErrors: the store's own sentinels are fatal; the rest
// is internal/storekit/pgerr's (TestClassify there).
func TestClassifyStoreErrors(t *testing.T) {
	st, err := pgstore.New(new(pgxpool.Pool), pgstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		err  error
		want dedup.ErrorClass
	}{
		{fmt.Errorf("check: %w", pgstore.ErrModeMismatch), dedup.ClassFatal},
		{pgstore.ErrDistributedHTTP, dedup.ClassFatal},
		{&pgconn.PgError{Code: "40001"}, dedup.ClassConflict},
		{&dedup.ConnLostError{Store: "pgstore", Err: io.ErrUnexpectedEOF}, dedup.ClassUnavailable},
		{io.ErrUnexpectedEOF, dedup.ClassUnknown},
	} {
		if got := st.ClassifyError(c.err); got != c.want {
			t.Errorf("ClassifyError(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

// TestInTxContextErrorIsNotConnLost: pgx interrupts a statement whose context
// ends by closing the connection. When that context is fn's own (a handler's
// timeout), InTx does not report a lost connection; when the backend really
// goes away, it does.
func TestInTxContextErrorIsNotConnLost(t *testing.T) {
	st := newStore(t, pgstore.Config{})
	cases := []struct {
		name     string
		fn       func(ctx context.Context, tx pgx.Tx) error
		lost     bool
		ctxError error
	}{
		{"deadline", func(ctx context.Context, tx pgx.Tx) error {
			ctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
			defer cancel()
			_, err := tx.Exec(ctx, `SELECT pg_sleep(5)`)
			return err
		}, false, context.DeadlineExceeded},
		{"canceled", func(ctx context.Context, tx pgx.Tx) error {
			ctx, cancel := context.WithCancel(ctx)
			time.AfterFunc(100*time.Millisecond, cancel)
			_, err := tx.Exec(ctx, `SELECT pg_sleep(5)`)
			return err
		}, false, context.Canceled},
		{"backend terminated", func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `SELECT pg_terminate_backend(pg_backend_pid())`)
			return err
		}, true, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var closed bool
			err := st.InTx(context.Background(), func(ctx context.Context, tx pgx.Tx) error {
				err := c.fn(ctx, tx)
				closed = tx.Conn().IsClosed()
				return err
			})
			if !closed {
				t.Fatalf("the connection survived (%v): the case proves nothing", err)
			}
			var lost *dedup.ConnLostError
			if errors.As(err, &lost) != c.lost {
				t.Fatalf("InTx: %v; want ConnLostError %v", err, c.lost)
			}
			if c.ctxError != nil && !errors.Is(err, c.ctxError) {
				t.Fatalf("InTx: %v; want %v", err, c.ctxError)
			}
			if got := st.ClassifyError(err); (got == dedup.ClassUnavailable) != c.lost {
				t.Fatalf("Classify(%v) = %v", err, got)
			}
		})
	}
}

func TestAdmin(t *testing.T) {
	deduptest.RunAdmin(t, func(t *testing.T) (dedup.Store[pgx.Tx], dedup.Admin) {
		st := newStore(t, pgstore.Config{ScopeRetention: map[string]time.Duration{"hour": time.Hour}})
		return st, st.Admin()
	})
}

func TestOffsetsConformance(t *testing.T) {
	deduptest.RunOffsets(t, func(t *testing.T, lockTimeout time.Duration) deduptest.OffsetStore[pgx.Tx] {
		return newStore(t, pgstore.Config{LockTimeout: lockTimeout})
	})
}

func TestEpochsConformance(t *testing.T) {
	deduptest.RunEpochs(t, func(t *testing.T) dedup.EpochStore { return newStore(t, pgstore.Config{}) })
}
