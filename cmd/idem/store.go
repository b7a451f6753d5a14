package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/pgstore"
	"github.com/idemkit/idem/dedup/sqlitestore"
)

// storeFlags choose the store.
type storeFlags struct {
	pg, sqlite, schema, table string
	partitionWidth            string
	json                      bool
}

func (f *storeFlags) register(fs *flag.FlagSet, e *env) {
	registerSecret(fs, e, &f.pg, "pg", "IDEM_PG_URL", "Postgres URL")
	fs.StringVar(&f.sqlite, "sqlite", e.getenv("IDEM_SQLITE"), "SQLite database file (env IDEM_SQLITE)")
	fs.StringVar(&f.schema, "schema", or(e.getenv("IDEM_PG_SCHEMA"), "public"), "Postgres schema of the table (env IDEM_PG_SCHEMA)")
	fs.StringVar(&f.table, "table", or(e.getenv("IDEM_TABLE"), "idem_dedup"), "the dedup table (env IDEM_TABLE)")
	fs.StringVar(&f.partitionWidth, "partition-width", e.getenv("IDEM_PG_PARTITION_WIDTH"), "the partitions' width of a partitioned Postgres table, as its store's PartitionWidth: 168h (env IDEM_PG_PARTITION_WIDTH)")
	fs.BoolVar(&f.json, "json", false, "print one JSON document")
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

var errNoStore = errors.New("no store: set --pg or IDEM_PG_URL (Postgres), or --sqlite or IDEM_SQLITE")

// open opens the store the flags name; close it when done. Only migrate
// creates an SQLite file that is not there.
func (f *storeFlags) open(ctx context.Context, create bool) (dedup.Admin, func(), error) {
	st, err := f.openStore(ctx, create)
	return st.admin, st.close, err
}

// parseOpen parses a subcommand's flags, which take no arguments, and
// opens the store (open); close it when done. When ok is false the
// subcommand returns code: a usage error, or the failure it reported.
func (f *storeFlags) parseOpen(ctx context.Context, e *env, fs *flag.FlagSet, args []string, create bool) (admin dedup.Admin, closeStore func(), code int, ok bool) {
	if _, code, ok := parse(fs, args); !ok {
		return nil, nil, code, false
	}
	admin, closeStore, err := f.open(ctx, create)
	if err != nil {
		return nil, nil, fail(e, err), false
	}
	return admin, closeStore, exitOK, true
}

// requestAdmin is what the console needs of a store's HTTP request keys
// (dedup.RequestStore): the stuck ones, and releasing one.
type requestAdmin interface {
	StuckRequests(ctx context.Context, limit int) ([]dedup.RequestRecord, error)
	ReleaseRequest(ctx context.Context, k dedup.Key, token int64) (bool, error)
}

// openedStore is a store as the commands use it: its admin, its HTTP
// request keys, its effect journal, and close.
type openedStore struct {
	admin   dedup.Admin
	reqs    requestAdmin
	journal dedup.Journal
	close   func()
}

// openWithRequests is open, with the store's request keys too.
func (f *storeFlags) openWithRequests(ctx context.Context, create bool) (dedup.Admin, requestAdmin, func(), error) {
	st, err := f.openStore(ctx, create)
	return st.admin, st.reqs, st.close, err
}

// openStore opens the store the flags name (see open).
func (f *storeFlags) openStore(ctx context.Context, create bool) (openedStore, error) {
	switch {
	case f.pg != "" && f.sqlite != "":
		return openedStore{}, errors.New("both a Postgres URL and an SQLite file: choose one")
	case f.pg != "":
		var width time.Duration
		if f.partitionWidth != "" {
			var err error
			if width, err = time.ParseDuration(f.partitionWidth); err != nil {
				return openedStore{}, fmt.Errorf("--partition-width: %w", err)
			}
		}
		pool, err := pgxpool.New(ctx, f.pg)
		if err != nil {
			return openedStore{}, fmt.Errorf("postgres: %w", err)
		}
		st, err := pgstore.New(pool, pgstore.Config{Schema: f.schema, Table: f.table, PartitionWidth: width})
		if err != nil {
			pool.Close()
			return openedStore{}, err
		}
		return openedStore{st.Admin(), st, st, pool.Close}, nil
	case f.sqlite != "":
		if _, err := os.Stat(f.sqlite); err != nil && !create {
			return openedStore{}, fmt.Errorf("sqlite: %w", err)
		}
		db, err := sqlitestore.Open(f.sqlite, sqlitestore.Config{})
		if err != nil {
			return openedStore{}, err
		}
		st, err := sqlitestore.New(db, sqlitestore.Config{Table: f.table})
		if err != nil {
			db.Close()
			return openedStore{}, err
		}
		return openedStore{st.Admin(), st, st, func() { _ = db.Close() }}, nil
	}
	return openedStore{}, errNoStore
}
