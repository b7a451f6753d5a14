package sqlmigrate

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// ErrLocked: another migrator held the migration lock for longer than the
// wait.
var ErrLocked = errors.New("the migration lock is held by another Migrate")

// LockMySQL takes the named lock name (GET_LOCK) on conn, waiting at most
// wait (whole seconds), and returns its release. MySQL commits DDL
// implicitly, so the lock, not a transaction, keeps two migrators apart:
// each migration is one idempotent statement (CREATE TABLE IF NOT EXISTS,
// …) followed by its version row.
func LockMySQL(ctx context.Context, conn *sql.Conn, name string, wait time.Duration) (release func(context.Context) error, err error) {
	secs := max(int(wait/time.Second), 1)
	var got sql.NullInt64
	if err := conn.QueryRowContext(ctx, `SELECT GET_LOCK(?, ?)`, name, secs).Scan(&got); err != nil {
		return nil, fmt.Errorf("lock: %w", err)
	}
	if got.Int64 != 1 {
		return nil, fmt.Errorf("%w: %s, still after %d s", ErrLocked, name, secs)
	}
	return func(ctx context.Context) error {
		if _, err := conn.ExecContext(context.WithoutCancel(ctx), `DO RELEASE_LOCK(?)`, name); err != nil {
			return fmt.Errorf("unlock: %w", err)
		}
		return nil
	}, nil
}

// MySQL is the Session of a MySQL or MariaDB connection that holds the
// migration lock (LockMySQL). versions is the quoted versions table, with
// its database when the store names one.
func MySQL(conn *sql.Conn, versions string) Session {
	return &mysqlSession{conn: conn, versions: versions}
}

type mysqlSession struct {
	conn     *sql.Conn
	versions string
}

func (s *mysqlSession) Applied(ctx context.Context, table string) ([]int, error) {
	if _, err := s.conn.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS `+s.versions+` (
    table_name VARCHAR(64)  NOT NULL,
    version    INT          NOT NULL,
    name       VARCHAR(255) NOT NULL,
    applied_at DATETIME(6)  NOT NULL,
    PRIMARY KEY (table_name, version)
) ENGINE = InnoDB DEFAULT CHARACTER SET = utf8mb4`); err != nil {
		return nil, err
	}
	return queryInts(ctx, s.conn, `SELECT version FROM `+s.versions+` WHERE table_name = ?`, table)
}

func (s *mysqlSession) Apply(ctx context.Context, table string, m Migration) error {
	if _, err := s.conn.ExecContext(ctx, m.SQL); err != nil {
		return err
	}
	_, err := s.conn.ExecContext(ctx, `INSERT INTO `+s.versions+` (table_name, version, name, applied_at) VALUES (?, ?, ?, UTC_TIMESTAMP(6))`,
		table, m.Version, m.Name)
	return err
}

type querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

func queryInts(ctx context.Context, q querier, query string, args ...any) ([]int, error) {
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []int
	for rows.Next() {
		var v int
		if err := rows.Scan(&v); err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}
