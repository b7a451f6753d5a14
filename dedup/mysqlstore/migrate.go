package mysqlstore

import (
	"bytes"
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"
	"text/template"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

type migration struct {
	version int
	name    string
	sql     string
}

// collations are the utf8mb4 collations that compare byte for byte and do
// not pad: with utf8mb4_bin (PAD SPACE) "k" and "k " would be one key.
// MariaDB has utf8mb4_nopad_bin (10.2+), MySQL utf8mb4_0900_bin (8.0.17+).
var collations = []string{"utf8mb4_nopad_bin", "utf8mb4_0900_bin"}

// migrations renders the embedded migrations for this store's table.
func (s *Store) migrations(collation string) ([]migration, error) {
	entries, err := fs.Glob(migrationFS, "migrations/*.sql")
	if err != nil {
		return nil, err
	}
	data := struct {
		Table, Epochs, Collation string
		Name                     func(string) string
	}{
		Table:     s.table,
		Epochs:    s.epochs,
		Collation: collation,
		Name:      func(suffix string) string { return quote(s.cfg.Table + "_" + suffix) },
	}
	var ms []migration
	for _, e := range entries {
		base := strings.TrimPrefix(e, "migrations/")
		v, err := strconv.Atoi(strings.SplitN(base, "_", 2)[0])
		if err != nil {
			return nil, fmt.Errorf("mysqlstore: migration %s: no version prefix", base)
		}
		raw, err := migrationFS.ReadFile(e)
		if err != nil {
			return nil, err
		}
		tmpl, err := template.New(base).Parse(string(raw))
		if err != nil {
			return nil, fmt.Errorf("mysqlstore: migration %s: %w", base, err)
		}
		var buf bytes.Buffer
		if err := tmpl.Execute(&buf, data); err != nil {
			return nil, fmt.Errorf("mysqlstore: migration %s: %w", base, err)
		}
		ms = append(ms, migration{version: v, name: base, sql: buf.String()})
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].version < ms[j].version })
	return ms, nil
}

// lastVersion is the version Check wants.
func (s *Store) lastVersion() (int, error) {
	ms, err := s.migrations("")
	if err != nil {
		return 0, err
	}
	return ms[len(ms)-1].version, nil
}

// Migrate creates or upgrades the store's table. It is safe to run from
// many processes at once: it holds the named lock idem.mysqlstore.migrate
// (GET_LOCK) on one connection and records applied versions per table in
// idem_schema_migrations, beside the table. MySQL commits DDL implicitly, so
// each migration is one idempotent statement (CREATE TABLE IF NOT EXISTS, …)
// followed by its version row.
func (s *Store) Migrate(ctx context.Context) (err error) {
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return s.connErr("migrate", err)
	}
	defer conn.Close()
	var got sql.NullInt64
	if err := conn.QueryRowContext(ctx, `SELECT GET_LOCK('idem.mysqlstore.migrate', 60)`).Scan(&got); err != nil {
		return s.connErr("migrate: lock", err)
	}
	if got.Int64 != 1 {
		return errors.New("mysqlstore: migrate: idem.mysqlstore.migrate is still locked by another Migrate after 60 s")
	}
	defer func() {
		if _, uerr := conn.ExecContext(context.WithoutCancel(ctx), `DO RELEASE_LOCK('idem.mysqlstore.migrate')`); uerr != nil && err == nil {
			err = fmt.Errorf("mysqlstore: migrate: unlock: %w", uerr)
		}
	}()

	var collation string
	q := `SELECT COLLATION_NAME FROM information_schema.COLLATIONS WHERE COLLATION_NAME IN ('` + strings.Join(collations, "', '") + `')`
	rows, err := conn.QueryContext(ctx, q)
	if err != nil {
		return s.connErr("migrate", err)
	}
	have := map[string]bool{}
	for rows.Next() {
		var c string
		if err := rows.Scan(&c); err != nil {
			rows.Close()
			return s.connErr("migrate", err)
		}
		have[c] = true
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return s.connErr("migrate", err)
	}
	for _, c := range collations {
		if have[c] {
			collation = c
			break
		}
	}
	if collation == "" {
		return fmt.Errorf("mysqlstore: migrate: the server has neither of the collations %v that compare keys byte for byte without padding: MySQL 8.0.17 or MariaDB 10.2 or later is needed", collations)
	}

	ms, err := s.migrations(collation)
	if err != nil {
		return err
	}
	if _, err := conn.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS `+s.versions+` (
    table_name VARCHAR(64)  NOT NULL,
    version    INT          NOT NULL,
    name       VARCHAR(255) NOT NULL,
    applied_at DATETIME(6)  NOT NULL,
    PRIMARY KEY (table_name, version)
) ENGINE = InnoDB DEFAULT CHARACTER SET = utf8mb4`); err != nil {
		return s.connErr("migrate", err)
	}
	applied := map[int]bool{}
	vrows, err := conn.QueryContext(ctx, `SELECT version FROM `+s.versions+` WHERE table_name = ?`, s.cfg.Table)
	if err != nil {
		return s.connErr("migrate", err)
	}
	for vrows.Next() {
		var v int
		if err := vrows.Scan(&v); err != nil {
			vrows.Close()
			return s.connErr("migrate", err)
		}
		applied[v] = true
	}
	vrows.Close()
	if err := vrows.Err(); err != nil {
		return s.connErr("migrate", err)
	}
	for _, m := range ms {
		if applied[m.version] {
			continue
		}
		if _, err := conn.ExecContext(ctx, m.sql); err != nil {
			return fmt.Errorf("mysqlstore: migration %s: %w", m.name, err)
		}
		if _, err := conn.ExecContext(ctx, `INSERT INTO `+s.versions+` (table_name, version, name, applied_at) VALUES (?, ?, ?, UTC_TIMESTAMP(6))`,
			s.cfg.Table, m.version, m.name); err != nil {
			return fmt.Errorf("mysqlstore: migration %s: %w", m.name, err)
		}
	}
	return nil
}
