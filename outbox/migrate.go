package outbox

import (
	"bytes"
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"
	"text/template"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem/dedup"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

type migration struct {
	version int
	name    string
	sql     string
}

// migrations renders the embedded migrations for this outbox's tables.
func (o *Outbox) migrations() ([]migration, error) {
	entries, err := fs.Glob(migrationFS, "migrations/*.sql")
	if err != nil {
		return nil, err
	}
	data := struct {
		Table, Dead string
		Index       func(string) string
	}{
		Table: o.table,
		Dead:  o.dead,
		Index: func(suffix string) string { return pgx.Identifier{o.cfg.Table + "_" + suffix}.Sanitize() },
	}
	var ms []migration
	for _, e := range entries {
		base := strings.TrimPrefix(e, "migrations/")
		v, err := strconv.Atoi(strings.SplitN(base, "_", 2)[0])
		if err != nil {
			return nil, fmt.Errorf("outbox: migration %s: no version prefix", base)
		}
		raw, err := migrationFS.ReadFile(e)
		if err != nil {
			return nil, err
		}
		tmpl, err := template.New(base).Parse(string(raw))
		if err != nil {
			return nil, fmt.Errorf("outbox: migration %s: %w", base, err)
		}
		var buf bytes.Buffer
		if err := tmpl.Execute(&buf, data); err != nil {
			return nil, fmt.Errorf("outbox: migration %s: %w", base, err)
		}
		ms = append(ms, migration{version: v, name: base, sql: buf.String()})
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].version < ms[j].version })
	return ms, nil
}

// Migrate creates or upgrades the outbox's schema and tables. Like
// pgstore's, it is safe to run from many processes at once (a
// transaction-scoped advisory lock) and records the versions it applied in
// the schema's idem_schema_migrations, which pgstore shares.
func (o *Outbox) Migrate(ctx context.Context) error {
	ms, err := o.migrations()
	if err != nil {
		return err
	}
	return pgx.BeginTxFunc(ctx, o.pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('idem.pgstore.migrate'))`); err != nil {
			return fmt.Errorf("outbox: migrate: lock: %w", err)
		}
		versions := pgx.Identifier{o.cfg.Schema, "idem_schema_migrations"}.Sanitize()
		setup := `CREATE SCHEMA IF NOT EXISTS ` + pgx.Identifier{o.cfg.Schema}.Sanitize() + `;
CREATE TABLE IF NOT EXISTS ` + versions + ` (
    table_name text NOT NULL,
    version    int  NOT NULL,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (table_name, version)
)`
		if _, err := tx.Exec(ctx, setup); err != nil {
			return fmt.Errorf("outbox: migrate: %w", err)
		}
		rows, err := tx.Query(ctx, `SELECT version FROM `+versions+` WHERE table_name = $1`, o.cfg.Table)
		if err != nil {
			return fmt.Errorf("outbox: migrate: %w", err)
		}
		vs, err := pgx.CollectRows(rows, pgx.RowTo[int32])
		if err != nil {
			return fmt.Errorf("outbox: migrate: %w", err)
		}
		applied := map[int]bool{}
		for _, v := range vs {
			applied[int(v)] = true
		}
		for _, m := range ms {
			if applied[m.version] {
				continue
			}
			if _, err := tx.Exec(ctx, m.sql); err != nil {
				return fmt.Errorf("outbox: migration %s: %w", m.name, err)
			}
			if _, err := tx.Exec(ctx, `INSERT INTO `+versions+` (table_name, version, name) VALUES ($1, $2, $3)`, o.cfg.Table, m.version, m.name); err != nil {
				return fmt.Errorf("outbox: migration %s: %w", m.name, err)
			}
		}
		return nil
	})
}

// Check reports whether the tables are migrated to this version of the
// package; an error wraps dedup.ErrNotMigrated when they are not.
func (o *Outbox) Check(ctx context.Context) error {
	ms, err := o.migrations()
	if err != nil {
		return err
	}
	versions := pgx.Identifier{o.cfg.Schema, "idem_schema_migrations"}.Sanitize()
	var have int32
	var table *string
	err = o.pool.QueryRow(ctx, `SELECT coalesce((SELECT max(version) FROM `+versions+` WHERE table_name = $1), 0), to_regclass($2)::text`,
		o.cfg.Table, o.table).Scan(&have, &table)
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == "42P01":
		return fmt.Errorf("%w: outbox: %s does not exist: call Outbox.Migrate first", dedup.ErrNotMigrated, versions)
	case err != nil:
		return fmt.Errorf("outbox: check: %w", err)
	case table == nil || int(have) < ms[len(ms)-1].version:
		return fmt.Errorf("%w: outbox: table %s is at migration %d of %d: call Outbox.Migrate first", dedup.ErrNotMigrated, o.table, have, ms[len(ms)-1].version)
	}
	return nil
}
