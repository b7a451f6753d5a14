package pgmigrate

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/internal/retry"
	"github.com/idemkit/idem/internal/storekit/sqlmigrate"
)

// leaseFor is how long a distributed-mode migrator holds the migration
// lock row without renewing it. It renews the lease before each DDL
// statement; a migrator that crashed blocks the others for at most this
// long.
const leaseFor = time.Minute

// MigrateDistributed is Migrate for distributed SQL databases, which lack
// (or stub) advisory locks and limit DDL in transactions:
//
//   - the schema and the lock table idem_schema_lock are created first, each
//     CREATE … IF NOT EXISTS on its own, retried when a concurrent migrator
//     wins the race to create it;
//   - the lock is a row of idem_schema_lock with a holder and a lease (a
//     minute): taken when absent or expired, renewed before each
//     statement, deleted at the end. A migrator that crashed leaves its row
//     behind; the next one takes it over once the lease has run out;
//   - every statement of every migration runs alone in its own (implicit)
//     transaction. A migration interrupted half-way is resumed from the
//     start: every statement is idempotent (IF NOT EXISTS), and an ADD
//     CONSTRAINT that finds its constraint (42710) is one an earlier run
//     made;
//   - the version row is written after the migration's last statement.
func MigrateDistributed(ctx context.Context, pool *pgxpool.Pool, schema, table string, ms []sqlmigrate.Migration) error {
	lock := pgx.Identifier{schema, "idem_schema_lock"}.Sanitize()
	for _, stmt := range []string{
		`CREATE SCHEMA IF NOT EXISTS ` + pgx.Identifier{schema}.Sanitize(),
		`CREATE TABLE IF NOT EXISTS ` + lock + ` (
    name       text        PRIMARY KEY,
    holder     text        NOT NULL,
    expires_at timestamptz NOT NULL
)`,
	} {
		if err := ddl(ctx, pool, stmt, false); err != nil {
			return fmt.Errorf("migrate: %w", err)
		}
	}
	l, err := lockMigrations(ctx, pool, lock)
	if err != nil {
		return err
	}
	defer l.release()
	return sqlmigrate.Run(ctx, &distSession{pool: pool, lock: l, versions: versionsOf(schema)}, table, ms)
}

// distSession migrates statement by statement, renewing its lock row.
type distSession struct {
	pool     *pgxpool.Pool
	lock     *migrationLock
	versions string
}

func (s *distSession) Applied(ctx context.Context, table string) ([]int, error) {
	if err := ddl(ctx, s.pool, `CREATE TABLE IF NOT EXISTS `+s.versions+versionsDDL, false); err != nil {
		return nil, err
	}
	return appliedVersions(ctx, s.pool, s.versions, table)
}

func (s *distSession) Apply(ctx context.Context, table string, m sqlmigrate.Migration) error {
	for i, stmt := range sqlmigrate.Split(m.SQL) {
		if err := s.lock.renew(ctx); err != nil {
			return err
		}
		if err := ddl(ctx, s.pool, stmt, true); err != nil {
			return fmt.Errorf("statement %d: %w", i+1, err)
		}
	}
	if err := s.lock.renew(ctx); err != nil {
		return err
	}
	_, err := s.pool.Exec(ctx, `INSERT INTO `+s.versions+` (table_name, version, name) VALUES ($1, $2, $3) ON CONFLICT (table_name, version) DO NOTHING`,
		table, m.Version, m.Name)
	return err
}

// ddlAttempts bounds the retries of one DDL statement that lost a race or a
// serialization conflict.
const ddlAttempts = 20

// ddl runs one statement in its own implicit transaction. It retries it
// when a concurrent CREATE … IF NOT EXISTS won the race on the catalog
// (Postgres reports 23505, 42710 for the table's row type, 42P06 or 42P07)
// or the transaction met a conflict (40001, 40P01).
// With done, a duplicate-object error (42710: ADD CONSTRAINT of a
// constraint that exists) means an earlier run did the statement.
func ddl(ctx context.Context, pool *pgxpool.Pool, stmt string, done bool) error {
	for attempt := 1; ; attempt++ {
		_, err := pool.Exec(ctx, stmt)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) {
			return err
		}
		switch code := pgErr.Code; {
		case code == "42710" && done:
			return nil
		case code == "23505", code == "42710", code == "42P06", code == "42P07", code == "40001", code == "40P01":
			if attempt < ddlAttempts {
				if err := retry.Sleep(ctx, time.Duration(attempt)*10*time.Millisecond); err != nil {
					return err
				}
				continue
			}
		}
		return err
	}
}

// migrationLock is a held lock row.
type migrationLock struct {
	pool   *pgxpool.Pool
	table  string
	holder string
}

// lockPollMax caps the wait between two tries of a held lock row.
const lockPollMax = time.Second

// lockMigrations takes the lock row, waiting while another migrator's lease
// runs. It gives up with ctx.
func lockMigrations(ctx context.Context, pool *pgxpool.Pool, table string) (*migrationLock, error) {
	var id [8]byte
	_, _ = rand.Read(id[:])
	l := &migrationLock{pool: pool, table: table, holder: hex.EncodeToString(id[:])}
	take := `INSERT INTO ` + table + ` AS l (name, holder, expires_at)
VALUES ('migrate', $1, now() + $2::bigint * interval '1 millisecond')
ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at
WHERE l.expires_at < now()
RETURNING holder`
	wait := 10 * time.Millisecond
	for {
		var got string
		err := pool.QueryRow(ctx, take, l.holder, leaseFor.Milliseconds()).Scan(&got)
		var pgErr *pgconn.PgError
		switch {
		case err == nil:
			return l, nil
		case errors.Is(err, pgx.ErrNoRows):
			// Held by a live lease.
		case errors.As(err, &pgErr) && (pgErr.Code == "40001" || pgErr.Code == "40P01"):
			// A conflict with another migrator taking it.
		default:
			return nil, fmt.Errorf("migrate: lock: %w", err)
		}
		if err := retry.Sleep(ctx, wait); err != nil {
			var holder string
			var left time.Duration
			var ms int64
			if pool.QueryRow(context.WithoutCancel(ctx), `SELECT holder, (extract(epoch FROM expires_at - now()) * 1000)::bigint FROM `+table+` WHERE name = 'migrate'`).Scan(&holder, &ms) == nil {
				left = time.Duration(ms) * time.Millisecond
			}
			return nil, fmt.Errorf("migrate: waiting for the migration lock row held by %q (lease left %v): %w", holder, left, err)
		}
		wait = min(2*wait, lockPollMax)
	}
}

// renew extends the lease, or fails when another migrator has taken the
// row: this one's lease ran out while a statement ran.
func (l *migrationLock) renew(ctx context.Context) error {
	tag, err := l.pool.Exec(ctx, `UPDATE `+l.table+` SET expires_at = now() + $2::bigint * interval '1 millisecond' WHERE name = 'migrate' AND holder = $1`,
		l.holder, leaseFor.Milliseconds())
	if err != nil {
		return fmt.Errorf("renew lock: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("lost the migration lock row: a statement outlasted the lease (%v) and another migrator took over", leaseFor)
	}
	return nil
}

// releaseTimeout bounds the lock row's deletion.
const releaseTimeout = 5 * time.Second

// release deletes the row, also when ctx is done.
func (l *migrationLock) release() {
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	_, _ = l.pool.Exec(ctx, `DELETE FROM `+l.table+` WHERE name = 'migrate' AND holder = $1`, l.holder)
}
