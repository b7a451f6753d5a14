// Package pgmigrate is sqlmigrate's Postgres dialect, on pgx, for
// dedup/pgstore and the outbox: Migrate runs every pending migration in one
// transaction under an advisory lock; MigrateDistributed is the same for
// Postgres-wire distributed databases (CockroachDB, YugabyteDB), under a
// lock row with a lease, one statement per transaction.
package pgmigrate

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/internal/storekit/sqlmigrate"
)

// lockKey names the advisory lock every idem table of a database migrates
// under (the dedup tables and the outbox alike).
const lockKey = "idem.pgstore.migrate"

// versionsDDL creates a schema's versions table.
const versionsDDL = ` (
    table_name text NOT NULL,
    version    int  NOT NULL,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (table_name, version)
)`

func versionsOf(schema string) string { return pgx.Identifier{schema, sqlmigrate.Versions}.Sanitize() }

// Migrate creates schema when missing and applies the migrations of ms that
// table has not had, in one transaction holding a transaction-scoped
// advisory lock: safe to run from many processes at once. The applied
// versions are recorded in the schema's idem_schema_migrations.
func Migrate(ctx context.Context, pool *pgxpool.Pool, schema, table string, ms []sqlmigrate.Migration) error {
	return pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('`+lockKey+`'))`); err != nil {
			return fmt.Errorf("migrate: lock: %w", err)
		}
		if _, err := tx.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS `+pgx.Identifier{schema}.Sanitize()); err != nil {
			return fmt.Errorf("migrate: %w", err)
		}
		return sqlmigrate.Run(ctx, txSession{tx: tx, versions: versionsOf(schema)}, table, ms)
	})
}

// txSession migrates in one transaction.
type txSession struct {
	tx       pgx.Tx
	versions string
}

func (s txSession) Applied(ctx context.Context, table string) ([]int, error) {
	if _, err := s.tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+s.versions+versionsDDL); err != nil {
		return nil, err
	}
	return appliedVersions(ctx, s.tx, s.versions, table)
}

func (s txSession) Apply(ctx context.Context, table string, m sqlmigrate.Migration) error {
	if _, err := s.tx.Exec(ctx, m.SQL); err != nil {
		return err
	}
	_, err := s.tx.Exec(ctx, `INSERT INTO `+s.versions+` (table_name, version, name) VALUES ($1, $2, $3)`, table, m.Version, m.Name)
	return err
}

type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

func appliedVersions(ctx context.Context, q querier, versions, table string) ([]int, error) {
	rows, err := q.Query(ctx, `SELECT version FROM `+versions+` WHERE table_name = $1`, table)
	if err != nil {
		return nil, err
	}
	vs, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	out := make([]int, len(vs))
	for i, v := range vs {
		out[i] = int(v)
	}
	return out, err
}

// Version reads the version recorded for schema.table and whether the
// table exists: 0 and false when schema has no versions table.
func Version(ctx context.Context, pool *pgxpool.Pool, schema, table string) (version int, exists bool, err error) {
	var have int32
	var reg *string
	err = pool.QueryRow(ctx, `SELECT coalesce((SELECT max(version) FROM `+versionsOf(schema)+` WHERE table_name = $1), 0), to_regclass($2)::text`,
		table, pgx.Identifier{schema, table}.Sanitize()).Scan(&have, &reg)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" {
		return 0, false, nil
	}
	return int(have), reg != nil, err
}

// Index returns the template function that names an index or constraint
// of table: {{call .Index "expires"}} is "<table>_expires", sanitized.
func Index(table string) func(suffix string) string {
	return func(suffix string) string { return pgx.Identifier{table + "_" + suffix}.Sanitize() }
}
