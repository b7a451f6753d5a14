package payments

import (
	"context"
	"database/sql"
	"errors"
	"regexp"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DB is what the example needs of a database handle or transaction. SQL uses
// $1, $2, … placeholders, which both Postgres and SQLite accept; the MySQL
// adapter rewrites them.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (rowsAffected int64, err error)
	QueryRow(ctx context.Context, sql string, args ...any) Row
}

// Row is a single-row result; Scan returns ErrNoRows when there is none.
type Row interface{ Scan(dest ...any) error }

// ErrNoRows: the query returned no row.
var ErrNoRows = errors.New("payments: no rows")

type pgxDB struct {
	exec  func(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	query func(ctx context.Context, sql string, args ...any) pgx.Row
}

// Pgx adapts a pgx transaction, connection or pool.
func Pgx(q interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}) DB {
	return pgxDB{exec: q.Exec, query: q.QueryRow}
}

func (d pgxDB) Exec(ctx context.Context, sql string, args ...any) (int64, error) {
	tag, err := d.exec(ctx, sql, args...)
	return tag.RowsAffected(), err
}

func (d pgxDB) QueryRow(ctx context.Context, sql string, args ...any) Row {
	return pgxRow{d.query(ctx, sql, args...)}
}

type pgxRow struct{ pgx.Row }

func (r pgxRow) Scan(dest ...any) error {
	if err := r.Row.Scan(dest...); errors.Is(err, pgx.ErrNoRows) {
		return ErrNoRows
	} else {
		return err
	}
}

type sqlDB struct {
	exec  func(ctx context.Context, query string, args ...any) (sql.Result, error)
	query func(ctx context.Context, query string, args ...any) *sql.Row
}

// SQL adapts a database/sql transaction or database.
func SQL(q interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}) DB {
	return sqlDB{exec: q.ExecContext, query: q.QueryRowContext}
}

func (d sqlDB) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	res, err := d.exec(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func (d sqlDB) QueryRow(ctx context.Context, query string, args ...any) Row {
	return sqlRow{d.query(ctx, query, args...)}
}

type sqlRow struct{ *sql.Row }

func (r sqlRow) Scan(dest ...any) error {
	if err := r.Row.Scan(dest...); errors.Is(err, sql.ErrNoRows) {
		return ErrNoRows
	} else {
		return err
	}
}

// MySQL adapts a database/sql transaction or database on MySQL or MariaDB
// (go-sql-driver/mysql). The example's SQL is Postgres's and SQLite's; the
// adapter turns its $n placeholders into ? (repeating and reordering the
// arguments as the numbers say) and its one upsert, ON CONFLICT (col) DO
// NOTHING, into ON DUPLICATE KEY UPDATE col = col.
func MySQL(q interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}) DB {
	return mysqlDB{SQL(q).(sqlDB)}
}

type mysqlDB struct{ sqlDB }

func (d mysqlDB) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	query, args = toMySQL(query, args)
	return d.sqlDB.Exec(ctx, query, args...)
}

func (d mysqlDB) QueryRow(ctx context.Context, query string, args ...any) Row {
	query, args = toMySQL(query, args)
	return d.sqlDB.QueryRow(ctx, query, args...)
}

var onConflictDoNothing = regexp.MustCompile(`ON CONFLICT \((\w+)\) DO NOTHING`)

// toMySQL rewrites placeholders outside quoted literals, and the upsert.
func toMySQL(query string, args []any) (string, []any) {
	query = onConflictDoNothing.ReplaceAllString(query, "ON DUPLICATE KEY UPDATE $1 = $1")
	var b strings.Builder
	var out []any
	quoted := false
	for i := 0; i < len(query); i++ {
		c := query[i]
		if c == '\'' {
			quoted = !quoted
		}
		if c != '$' || quoted {
			b.WriteByte(c)
			continue
		}
		j := i + 1
		for j < len(query) && query[j] >= '0' && query[j] <= '9' {
			j++
		}
		n, err := strconv.Atoi(query[i+1 : j])
		if err != nil || n < 1 || n > len(args) {
			b.WriteByte(c) // not a placeholder; the server will say
			continue
		}
		b.WriteByte('?')
		out = append(out, args[n-1])
		i = j - 1
	}
	return b.String(), out
}
