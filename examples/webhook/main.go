// Command webhook shows idem's Idempotency-Key middleware in both of its
// modes, on two routes, with a fake bank beside them:
//
//   - POST /callbacks/{channel}, transactional: a payment channel's
//     callbacks, each booked into the payments tables (see
//     examples/payments) exactly once, in the transaction that stores its
//     key and answer; every re-send gets the first answer again.
//   - POST /payouts, leased: a payout made at the fake bank, over HTTP,
//     under a lease and a fencing token; after a crash the next request
//     takes the key over, and the bank, which dedups on the key and
//     refuses stale tokens, pays once.
//
// Run it:
//
//	go run ./examples/webhook                        # SQLite in the temp directory, zero setup
//	go run ./examples/webhook -postgres 'postgres://…' -listen 127.0.0.1:8088
//
// It starts with five unpaid orders (O-1001 for 2500, O-1002 for 990,
// O-1003 for 12000, O-1004 for 4500, O-1005 for 800). Pay one:
//
//	curl -i localhost:8088/callbacks/wechat -H 'Idempotency-Key: 4200000001' \
//	  -d '{"txn_id":"4200000001","order_id":"O-1001","amount":2500,"channel":"wechat","status":"SUCCESS"}'
//
// and pay a merchant out:
//
//	curl -i localhost:8088/payouts -H 'Idempotency-Key: p-1' -d '{"account":"merchant-01","amount":700}'
//	curl -s localhost:8089/transfers        # the bank's books
//
// The same line again is a replay (Idempotent-Replayed: true); another
// amount under that key is 422; no key is 400. The Demo-Fault header makes
// one request misbehave (slow, 5xx, error, panic, crash: see FaultHeader),
// for the rest of the matrix; docs/http.md has the curl lines. Expired keys
// are purged every minute.
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
	bankListen := flag.String("bank-listen", "127.0.0.1:8089", "address the fake bank serves on")
	pgURL := flag.String("postgres", "", "Postgres connection URL (tables in its search_path); default: SQLite, see -sqlite")
	path := flag.String("sqlite", filepath.Join(os.TempDir(), "idem-webhook.db"), "SQLite database file, created when missing")
	lease := flag.Duration("lease", 10*time.Second, "the payouts' lease: how long a crashed payout holds its key before a retry takes it over")
	slow := flag.Duration("slow", DefaultHold, "how long 'Demo-Fault: slow' holds a request")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), `webhook serves POST /callbacks/{channel} (transactional: payment callbacks
booked once) and POST /payouts (leased: payouts at a fake bank, paid once),
re-sends answered with the first answer (Idempotent-Replayed: true). A
Demo-Fault header (slow, 5xx, error, panic, crash) makes a request misbehave.

Usage: go run ./examples/webhook [flags]

`)
		flag.PrintDefaults()
	}
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	opts := Options{
		Logger: logger,
		Lease:  *lease,
		Hold:   func(ctx context.Context) error { return wait(ctx, *slow) },
		Crash:  Kill,
	}
	if err := run(ctx, *listen, *bankListen, *pgURL, *path, opts, os.Stdout); err != nil {
		logger.Error("webhook", "err", err)
		os.Exit(1)
	}
}

// run serves the webhook on listen and the fake bank on bankListen until
// ctx ends. It prints two lines to out: the webhook's address, then the
// bank's.
func run(ctx context.Context, listen, bankListen, pgURL, path string, opts Options, out io.Writer) error {
	logger := opts.Logger
	bankLn, err := net.Listen("tcp", bankListen)
	if err != nil {
		return err
	}
	defer bankLn.Close()
	opts.Bank = "http://" + bankLn.Addr().String()
	a, err := open(ctx, pgURL, path, opts)
	if err != nil {
		return err
	}
	defer a.close()
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: a.handler, ReadHeaderTimeout: 10 * time.Second}
	bankSrv := &http.Server{Handler: a.bank, ReadHeaderTimeout: 10 * time.Second}
	fmt.Fprintf(out, "webhook: %s, serving http://%s (%s, %s)\n", a.where, ln.Addr(), Route, PayoutRoute)
	fmt.Fprintf(out, "bank: serving http://%s (POST /transfers, GET /transfers)\n", bankLn.Addr())
	done := make(chan error, 2)
	go func() { done <- srv.Serve(ln) }()
	go func() { done <- bankSrv.Serve(bankLn) }()
	go purge(ctx, a.store, logger)
	select {
	case err := <-done:
		srv.Close()
		bankSrv.Close()
		<-done
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// The webhook first: its payouts call the bank.
	err = srv.Shutdown(shutdown)
	err = errors.Join(err, bankSrv.Shutdown(shutdown))
	for range 2 {
		if e := <-done; !errors.Is(e, http.ErrServerClosed) {
			err = errors.Join(err, e)
		}
	}
	return err
}

// app is the webhook on its database.
type app struct {
	handler http.Handler // the webhook's routes
	bank    *Bank
	store   requestAdmin
	table   string // the dedup table as SQL names it
	where   string // the database, for the startup line
	close   func()
}

// open opens the store, the payments tables and the bank's, on Postgres
// when pgURL is set, else on SQLite at path.
func open(ctx context.Context, pgURL, path string, opts Options) (app, error) {
	if pgURL != "" {
		pool, err := pgxpool.New(ctx, pgURL)
		if err != nil {
			return app{}, err
		}
		a, err := openPostgres(ctx, pool, opts)
		if err != nil {
			pool.Close()
			return app{}, err
		}
		a.where, a.close = "Postgres", pool.Close
		return a, nil
	}
	db, err := sqliteOpenPath(path)
	if err != nil {
		return app{}, err
	}
	a, err := openSQLite(ctx, db, opts)
	if err != nil {
		db.Close()
		return app{}, err
	}
	a.where, a.close = "SQLite "+path, func() { db.Close() }
	return a, nil
}

func openPostgres(ctx context.Context, pool *pgxpool.Pool, opts Options) (app, error) {
	var schema string
	if err := pool.QueryRow(ctx, `SELECT current_schema()`).Scan(&schema); err != nil {
		return app{}, err
	}
	st, err := pgstore.New(pool, pgstore.Config{Schema: schema})
	if err != nil {
		return app{}, err
	}
	return setUp(ctx, st, payments.Pgx(pool), func(tx pgx.Tx) payments.DB { return payments.Pgx(tx) }, opts)
}

func sqliteOpenPath(path string) (*sql.DB, error) {
	return sqlitestore.Open(path, sqlitestore.Config{})
}

func openSQLite(ctx context.Context, db *sql.DB, opts Options) (app, error) {
	st, err := sqlitestore.New(db, sqlitestore.Config{})
	if err != nil {
		return app{}, err
	}
	return setUp(ctx, st, payments.SQL(db), func(tx *sql.Tx) payments.DB { return payments.SQL(tx) }, opts)
}

// requestStore is what setUp needs of a request store: the middleware's
// dedup.RequestStore, the program's requestAdmin, its migration and its
// table's name.
type requestStore[TTx any] interface {
	dedup.RequestStore[TTx]
	requestAdmin
	Migrate(ctx context.Context) error
	Table() string
}

// setUp migrates st, creates the payments tables and the bank's on db, and
// returns the app serving the webhook; inTx is db in one of st's
// transactions.
func setUp[TTx any](ctx context.Context, st requestStore[TTx], db payments.DB, inTx func(TTx) payments.DB, opts Options) (app, error) {
	if err := st.Migrate(ctx); err != nil {
		return app{}, err
	}
	if err := Setup(ctx, db); err != nil {
		return app{}, err
	}
	bank, err := NewBank(ctx, db)
	if err != nil {
		return app{}, err
	}
	h, err := Handler(st, inTx, opts)
	return app{handler: h, bank: bank, store: st, table: st.Table()}, err
}

// requestAdmin is what the program and its tests use of the store besides
// the middleware: the purge, and an operator's release of a stuck key.
type requestAdmin interface {
	dedup.Purger
	ReleaseRequest(ctx context.Context, k dedup.Key, token int64) (bool, error)
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
