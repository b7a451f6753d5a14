package pgstore

import (
	"bytes"
	"context"
	"embed"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"
	"text/template"

	"github.com/jackc/pgx/v5"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

type migration struct {
	version int
	name    string
	sql     string
}

// migrations renders the embedded migrations for this store's table.
func (s *Store) migrations() ([]migration, error) {
	entries, err := fs.Glob(migrationFS, "migrations/*.sql")
	if err != nil {
		return nil, err
	}
	data := struct {
		Table       string
		Offsets     string
		Epochs      string
		Distributed bool
		Index       func(string) string
	}{
		Table:       s.table,
		Offsets:     s.offsets,
		Epochs:      s.epochs,
		Distributed: s.cfg.Distributed,
		Index:       func(suffix string) string { return pgx.Identifier{s.cfg.Table + "_" + suffix}.Sanitize() },
	}
	var ms []migration
	for _, e := range entries {
		base := strings.TrimPrefix(e, "migrations/")
		v, err := strconv.Atoi(strings.SplitN(base, "_", 2)[0])
		if err != nil {
			return nil, fmt.Errorf("pgstore: migration %s: no version prefix", base)
		}
		raw, err := migrationFS.ReadFile(e)
		if err != nil {
			return nil, err
		}
		tmpl, err := template.New(base).Parse(string(raw))
		if err != nil {
			return nil, fmt.Errorf("pgstore: migration %s: %w", base, err)
		}
		var buf bytes.Buffer
		if err := tmpl.Execute(&buf, data); err != nil {
			return nil, fmt.Errorf("pgstore: migration %s: %w", base, err)
		}
		ms = append(ms, migration{version: v, name: base, sql: buf.String()})
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].version < ms[j].version })
	return ms, nil
}

// Migrate creates or upgrades the store's schema and table. It is safe to run
// from many processes at once: it holds a transaction-scoped advisory lock and
// records applied versions per table in idem_schema_migrations. In
// distributed mode it holds a lock row instead and runs one DDL statement per
// transaction; see migrateDistributed.
func (s *Store) Migrate(ctx context.Context) error {
	ms, err := s.migrations()
	if err != nil {
		return err
	}
	if s.cfg.Distributed {
		return s.migrateDistributed(ctx, ms)
	}
	return pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('idem.pgstore.migrate'))`); err != nil {
			return fmt.Errorf("pgstore: migrate: lock: %w", err)
		}
		schema := pgx.Identifier{s.cfg.Schema}.Sanitize()
		versions := pgx.Identifier{s.cfg.Schema, "idem_schema_migrations"}.Sanitize()
		setup := `CREATE SCHEMA IF NOT EXISTS ` + schema + `;
CREATE TABLE IF NOT EXISTS ` + versions + ` (
    table_name text NOT NULL,
    version    int  NOT NULL,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (table_name, version)
)`
		if _, err := tx.Exec(ctx, setup); err != nil {
			return fmt.Errorf("pgstore: migrate: %w", err)
		}
		applied := map[int]bool{}
		rows, err := tx.Query(ctx, `SELECT version FROM `+versions+` WHERE table_name = $1`, s.cfg.Table)
		if err != nil {
			return fmt.Errorf("pgstore: migrate: %w", err)
		}
		vs, err := pgx.CollectRows(rows, pgx.RowTo[int32])
		if err != nil {
			return fmt.Errorf("pgstore: migrate: %w", err)
		}
		for _, v := range vs {
			applied[int(v)] = true
		}
		for _, m := range ms {
			if applied[m.version] {
				continue
			}
			if _, err := tx.Exec(ctx, m.sql); err != nil {
				return fmt.Errorf("pgstore: migration %s: %w", m.name, err)
			}
			if _, err := tx.Exec(ctx, `INSERT INTO `+versions+` (table_name, version, name) VALUES ($1, $2, $3)`, s.cfg.Table, m.version, m.name); err != nil {
				return fmt.Errorf("pgstore: migration %s: %w", m.name, err)
			}
		}
		return nil
	})
}
