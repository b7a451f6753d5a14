// Command webhook is a payment channel's callback endpoint behind idem's
// Idempotency-Key middleware: each callback is booked into the payments
// tables (see examples/payments) exactly once, and every re-send gets the
// first answer again.
//
//	go run ./examples/webhook                        # SQLite in the temp directory, zero setup
//	go run ./examples/webhook -postgres 'postgres://…' -listen 127.0.0.1:8088
//
// It starts with three unpaid orders (O-1001 for 2500, O-1002 for 990,
// O-1003 for 12000). Pay one:
//
//	curl -i -X POST localhost:8088/callbacks/wechat -H 'Idempotency-Key: 4200000001' \
//	  -d '{"txn_id":"4200000001","order_id":"O-1001","amount":2500,"channel":"wechat","status":"SUCCESS"}'
//
// The same line again is a replay (Idempotent-Replayed: true); another
// amount under that key is 422; no key is 400; the same request while the
// first is still running is 409 (-delay 3s holds every booking long enough
// to try). Expired keys are purged every minute.
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/pgstore"
	"github.com/idemkit/idem/dedup/sqlitestore"
	"github.com/idemkit/idem/examples/payments"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:8088", "address to serve on")
	pgURL := flag.String("postgres", "", "Postgres connection URL (tables in its search_path); default: SQLite, see -sqlite")
	path := flag.String("sqlite", filepath.Join(os.TempDir(), "idem-webhook.db"), "SQLite database file, created when missing")
	delay := flag.Duration("delay", 0, "hold each booking this long before answering, to see a concurrent duplicate get 409")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), `webhook serves POST /callbacks/{channel}: payment callbacks booked once,
re-sends answered with the first answer (Idempotent-Replayed: true).

Usage: go run ./examples/webhook [flags]

`)
		flag.PrintDefaults()
	}
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	opts := Options{Logger: logger}
	if *delay > 0 {
		opts.Halfway = func(ctx context.Context, _ any) error {
			select {
			case <-time.After(*delay):
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	if err := run(ctx, *listen, *pgURL, *path, opts, os.Stdout); err != nil {
		logger.Error("webhook", "err", err)
		os.Exit(1)
	}
}

// run serves until ctx ends.
func run(ctx context.Context, listen, pgURL, path string, opts Options, out io.Writer) error {
	logger := opts.Logger
	h, purger, where, closeDB, err := open(ctx, pgURL, path, opts)
	if err != nil {
		return err
	}
	defer closeDB()
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	fmt.Fprintf(out, "webhook: %s, serving http://%s%s\n", where, ln.Addr(), "/callbacks/{channel}")
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	go purge(ctx, purger, logger)
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdown); err != nil {
		return err
	}
	if err := <-done; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// open opens the store and the payments tables, on Postgres when pgURL is
// set, else on SQLite at path.
func open(ctx context.Context, pgURL, path string, opts Options) (http.Handler, dedup.Purger, string, func(), error) {
	if pgURL != "" {
		pool, err := pgxpool.New(ctx, pgURL)
		if err != nil {
			return nil, nil, "", nil, err
		}
		h, st, err := openPostgres(ctx, pool, opts)
		if err != nil {
			pool.Close()
			return nil, nil, "", nil, err
		}
		return h, st, "Postgres", pool.Close, nil
	}
	db, err := sqliteOpenPath(path)
	if err != nil {
		return nil, nil, "", nil, err
	}
	h, st, err := openSQLite(ctx, db, opts)
	if err != nil {
		db.Close()
		return nil, nil, "", nil, err
	}
	return h, st, "SQLite " + path, func() { db.Close() }, nil
}

func openPostgres(ctx context.Context, pool *pgxpool.Pool, opts Options) (http.Handler, *pgstore.Store, error) {
	var schema string
	if err := pool.QueryRow(ctx, `SELECT current_schema()`).Scan(&schema); err != nil {
		return nil, nil, err
	}
	st, err := pgstore.New(pool, pgstore.Config{Schema: schema})
	if err != nil {
		return nil, nil, err
	}
	if err := st.Migrate(ctx); err != nil {
		return nil, nil, err
	}
	if err := Setup(ctx, payments.Pgx(pool)); err != nil {
		return nil, nil, err
	}
	h, err := Handler(st, func(tx pgx.Tx) payments.DB { return payments.Pgx(tx) }, opts)
	return h, st, err
}

func sqliteOpenPath(path string) (*sql.DB, error) {
	return sqlitestore.Open(path, sqlitestore.Config{})
}

func openSQLite(ctx context.Context, db *sql.DB, opts Options) (http.Handler, *sqlitestore.Store, error) {
	st, err := sqlitestore.New(db, sqlitestore.Config{})
	if err != nil {
		return nil, nil, err
	}
	if err := st.Migrate(ctx); err != nil {
		return nil, nil, err
	}
	if err := Setup(ctx, payments.SQL(db)); err != nil {
		return nil, nil, err
	}
	h, err := Handler(st, func(tx *sql.Tx) payments.DB { return payments.SQL(tx) }, opts)
	return h, st, err
}

// purge deletes expired keys every minute, in bounded batches: the same
// purge as every consumer's keys get.
func purge(ctx context.Context, p dedup.Purger, logger *slog.Logger) {
	t := time.NewTicker(time.Minute)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for {
			n, err := p.Purge(ctx, 1000)
			if err != nil {
				if ctx.Err() == nil {
					logger.Warn("purge", "err", err)
				}
				break
			}
			if n < 1000 {
				break
			}
		}
	}
}
