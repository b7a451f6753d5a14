package sqlmigrate

import (
	"context"
	"database/sql"
)

// SQLiteSession is the Session of an SQLite transaction begun IMMEDIATE:
// it holds the database's one write lock, which keeps other migrators (and
// every other writer) out, and its migrations commit together with their
// version rows, or none does.
type SQLiteSession struct{ tx *sql.Tx }

// SQLite returns the Session of tx, which must have begun IMMEDIATE.
func SQLite(tx *sql.Tx) *SQLiteSession { return &SQLiteSession{tx: tx} }

// sqliteNow is SQLite's clock in Unix milliseconds.
const sqliteNow = `CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)`

const sqliteVersions = `"` + Versions + `"`

// Applied returns the versions recorded for table, creating the versions
// table when missing.
func (s *SQLiteSession) Applied(ctx context.Context, table string) ([]int, error) {
	if _, err := s.tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS `+sqliteVersions+` (
    table_name TEXT    NOT NULL,
    version    INTEGER NOT NULL,
    name       TEXT    NOT NULL,
    applied_at INTEGER NOT NULL DEFAULT (`+sqliteNow+`),
    PRIMARY KEY (table_name, version)
) WITHOUT ROWID`); err != nil {
		return nil, err
	}
	return queryInts(ctx, s.tx, `SELECT version FROM `+sqliteVersions+` WHERE table_name = ?`, table)
}

// Apply runs m and records it.
func (s *SQLiteSession) Apply(ctx context.Context, table string, m Migration) error {
	if _, err := s.tx.ExecContext(ctx, m.SQL); err != nil {
		return err
	}
	return s.record(ctx, table, m)
}

// Adopt records the migrations of ms up to version upTo as applied without
// running them: the schema they make was made before migrations were
// versioned (an unversioned Migrate created it in place). Versions already
// recorded are left as they are.
func (s *SQLiteSession) Adopt(ctx context.Context, table string, ms []Migration, upTo int) error {
	for _, m := range ms {
		if m.Version > upTo {
			break
		}
		if err := s.record(ctx, table, m); err != nil {
			return err
		}
	}
	return nil
}

func (s *SQLiteSession) record(ctx context.Context, table string, m Migration) error {
	_, err := s.tx.ExecContext(ctx, `INSERT INTO `+sqliteVersions+` (table_name, version, name) VALUES (?, ?, ?)
ON CONFLICT (table_name, version) DO NOTHING`, table, m.Version, m.Name)
	return err
}

// SQLiteVersion returns the version recorded for table in q's database: 0
// when none is, or when the versions table does not exist.
func SQLiteVersion(ctx context.Context, q interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}, table string) (int, error) {
	var n int
	if err := q.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?`, Versions).Scan(&n); err != nil || n == 0 {
		return 0, err
	}
	var v int
	err := q.QueryRowContext(ctx, `SELECT coalesce(max(version), 0) FROM `+sqliteVersions+` WHERE table_name = ?`, table).Scan(&v)
	return v, err
}
