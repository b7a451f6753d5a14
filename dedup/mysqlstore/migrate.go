package mysqlstore

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/idemkit/idem/internal/storekit/sqlmigrate"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// collations are the utf8mb4 collations that compare byte for byte and do
// not pad: with utf8mb4_bin (PAD SPACE) "k" and "k " would be one key.
// MariaDB has utf8mb4_nopad_bin (10.2+), MySQL utf8mb4_0900_bin (8.0.17+).
var collations = []string{"utf8mb4_nopad_bin", "utf8mb4_0900_bin"}

// migrations renders the embedded migrations for this store's table.
func (s *Store) migrations(collation string) ([]sqlmigrate.Migration, error) {
	ms, err := sqlmigrate.Load(migrationFS, "migrations", struct {
		Table, Epochs, Tokens, Steps, Collation string
		Watermarks, Stale                       string
		ParkedKeys, Parked                      string
		Name                                    func(string) string
	}{
		Table:      s.table,
		Epochs:     s.epochs,
		Tokens:     s.tokens,
		Steps:      s.steps,
		Watermarks: s.marks,
		Stale:      s.stale,
		ParkedKeys: s.parkedKeys,
		Parked:     s.parked,
		Collation:  collation,
		Name:       func(suffix string) string { return quote(s.cfg.Table + "_" + suffix) },
	})
	if err != nil {
		return nil, fmt.Errorf("mysqlstore: %w", err)
	}
	return ms, nil
}

// lockWait bounds Migrate's wait for another Migrate's lock.
const lockWait = 60 * time.Second

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
	unlock, err := sqlmigrate.LockMySQL(ctx, conn, "idem.mysqlstore.migrate", lockWait)
	if errors.Is(err, sqlmigrate.ErrLocked) {
		return fmt.Errorf("mysqlstore: migrate: %w", err)
	}
	if err != nil {
		return s.connErr("migrate", err)
	}
	defer func() {
		if uerr := unlock(ctx); uerr != nil && err == nil {
			err = s.connErr("migrate", uerr)
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
	if err := sqlmigrate.Run(ctx, sqlmigrate.MySQL(conn, s.versions), s.cfg.Table, ms); err != nil {
		return s.connErr("migrate", err)
	}
	return nil
}
