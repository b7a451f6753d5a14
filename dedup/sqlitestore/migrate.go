package sqlitestore

import (
	"context"
	"database/sql"
	"embed"
	"fmt"

	"github.com/idemkit/idem/internal/storekit/sqlmigrate"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// migrations renders the embedded migrations for this store's table.
func (s *Store) migrations() ([]sqlmigrate.Migration, error) {
	ms, err := sqlmigrate.Load(migrationFS, "migrations", struct {
		Table, Tokens, Epochs, Audit, Steps, Now string
		Watermarks, Stale                        string
		ParkedKeys, Parked                       string
		Index                                    func(string) string
	}{
		Table:      s.table,
		Tokens:     s.tokens,
		Epochs:     s.epochsTable(),
		Audit:      s.auditTable(),
		Steps:      s.stepsTable(),
		Watermarks: s.marksTable(),
		Stale:      s.staleTable(),
		ParkedKeys: s.parkedKeysTable(),
		Parked:     s.parkedTable(),
		Now:        nowMillis,
		Index:      func(suffix string) string { return `"` + s.cfg.Table + "_" + suffix + `"` },
	})
	if err != nil {
		return nil, fmt.Errorf("sqlitestore: %w", err)
	}
	return ms, nil
}

// Migrate creates or upgrades the store's table, the counter of lease
// tokens and the release epochs' table, from the embedded migrations, in
// one IMMEDIATE transaction: its write lock keeps other migrators out, and
// the migrations and their versions (idem_schema_migrations) commit
// together or not at all.
//
// A database whose table an earlier, unversioned Migrate created is
// adopted: the migrations its table already has (the table, and the HTTP
// request columns when it has them) are recorded without running, the
// rest applied.
func (s *Store) Migrate(ctx context.Context) error {
	ms, err := s.migrations()
	if err != nil {
		return err
	}
	err = s.InTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		m := sqlmigrate.SQLite(tx)
		applied, err := m.Applied(ctx, s.cfg.Table)
		if err != nil {
			return err
		}
		if len(applied) == 0 {
			has, err := s.unversioned(ctx, tx)
			if err != nil {
				return err
			}
			if err := m.Adopt(ctx, s.cfg.Table, ms, has); err != nil {
				return err
			}
		}
		return sqlmigrate.Run(ctx, m, s.cfg.Table, ms)
	})
	if err != nil {
		return fmt.Errorf("sqlitestore: %w", err)
	}
	return nil
}

// unversioned returns the last migration an unversioned Migrate left the
// table at: 0 without a table, 2 with the HTTP request columns (migration
// 002), 1 without. The migrations after 002 are idempotent, and run.
func (s *Store) unversioned(ctx context.Context, q execQuerier) (int, error) {
	var tables, cols int
	if err := q.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?`, s.cfg.Table).Scan(&tables); err != nil || tables == 0 {
		return 0, err
	}
	if err := q.QueryRowContext(ctx, `SELECT count(*) FROM pragma_table_info(?) WHERE name = 'state'`, s.cfg.Table).Scan(&cols); err != nil || cols == 0 {
		return 1, err
	}
	return 2, nil
}

// Check reports whether the table is migrated to this version of the
// store; see dedup.Store.
func (s *Store) Check(ctx context.Context) error {
	ms, err := s.migrations()
	if err != nil {
		return err
	}
	have, err := sqlmigrate.SQLiteVersion(ctx, s.db, s.cfg.Table)
	if err != nil {
		return fmt.Errorf("sqlitestore: check: %w", err)
	}
	var n int
	if err := s.db.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?`, s.cfg.Table).Scan(&n); err != nil {
		return fmt.Errorf("sqlitestore: check: %w", err)
	}
	return sqlmigrate.Check("sqlitestore", s.table, n > 0, have, ms, "Store.Migrate before Run")
}
