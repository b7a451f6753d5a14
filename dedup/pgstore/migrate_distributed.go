package pgstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// MigrationLease is how long a distributed-mode migrator holds the
// migration lock row without renewing it. It renews the lease before each
// DDL statement; a migrator that crashed blocks the others for at most this
// long.
const MigrationLease = time.Minute

// migrateDistributed is Migrate for distributed SQL databases, which lack
// (or stub) advisory locks and limit DDL in transactions:
//
//   - the schema and the lock table idem_schema_lock are created first, each
//     CREATE … IF NOT EXISTS on its own, retried when a concurrent migrator
//     wins the race to create it;
//   - the lock is a row of idem_schema_lock with a holder and a lease
//     (MigrationLease): taken when absent or expired, renewed before each
//     statement, deleted at the end. A migrator that crashed leaves its row
//     behind; the next one takes it over once the lease has run out;
//   - every statement of every migration runs alone in its own (implicit)
//     transaction. A migration interrupted half-way is resumed from the
//     start: every statement is idempotent (IF NOT EXISTS), and an ADD
//     CONSTRAINT that finds its constraint (42710) is one an earlier run
//     made;
//   - the version row is written after the migration's last statement.
func (s *Store) migrateDistributed(ctx context.Context, ms []migration) error {
	schema := pgx.Identifier{s.cfg.Schema}.Sanitize()
	lock := pgx.Identifier{s.cfg.Schema, "idem_schema_lock"}.Sanitize()
	versions := pgx.Identifier{s.cfg.Schema, "idem_schema_migrations"}.Sanitize()
	for _, stmt := range []string{
		`CREATE SCHEMA IF NOT EXISTS ` + schema,
		`CREATE TABLE IF NOT EXISTS ` + lock + ` (
    name       text        PRIMARY KEY,
    holder     text        NOT NULL,
    expires_at timestamptz NOT NULL
)`,
	} {
		if err := s.ddl(ctx, stmt, false); err != nil {
			return fmt.Errorf("pgstore: migrate: %w", err)
		}
	}
	l, err := s.lockMigrations(ctx, lock)
	if err != nil {
		return err
	}
	defer l.release()

	if err := s.ddl(ctx, `CREATE TABLE IF NOT EXISTS `+versions+` (
    table_name text NOT NULL,
    version    int  NOT NULL,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (table_name, version)
)`, false); err != nil {
		return fmt.Errorf("pgstore: migrate: %w", err)
	}
	rows, err := s.pool.Query(ctx, `SELECT version FROM `+versions+` WHERE table_name = $1`, s.cfg.Table)
	if err != nil {
		return fmt.Errorf("pgstore: migrate: %w", err)
	}
	vs, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return fmt.Errorf("pgstore: migrate: %w", err)
	}
	applied := map[int]bool{}
	for _, v := range vs {
		applied[int(v)] = true
	}
	for _, m := range ms {
		if applied[m.version] {
			continue
		}
		for i, stmt := range splitStatements(m.sql) {
			if err := l.renew(ctx); err != nil {
				return err
			}
			if err := s.ddl(ctx, stmt, true); err != nil {
				return fmt.Errorf("pgstore: migration %s, statement %d: %w", m.name, i+1, err)
			}
		}
		if err := l.renew(ctx); err != nil {
			return err
		}
		if _, err := s.pool.Exec(ctx, `INSERT INTO `+versions+` (table_name, version, name) VALUES ($1, $2, $3) ON CONFLICT (table_name, version) DO NOTHING`,
			s.cfg.Table, m.version, m.name); err != nil {
			return fmt.Errorf("pgstore: migration %s: %w", m.name, err)
		}
	}
	var sharded bool
	if err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM information_schema.columns WHERE table_schema = $1 AND table_name = $2 AND column_name = 'shard')`,
		s.cfg.Schema, s.cfg.Table).Scan(&sharded); err != nil {
		return fmt.Errorf("pgstore: migrate: %w", err)
	}
	if !sharded {
		return s.mismatch(false)
	}
	return nil
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
func (s *Store) ddl(ctx context.Context, stmt string, done bool) error {
	for attempt := 1; ; attempt++ {
		_, err := s.pool.Exec(ctx, stmt)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) {
			return err
		}
		switch code := pgErr.Code; {
		case code == "42710" && done:
			return nil
		case code == "23505", code == "42710", code == "42P06", code == "42P07", code == "40001", code == "40P01":
			if attempt < ddlAttempts {
				if err := sleepCtx(ctx, time.Duration(attempt)*10*time.Millisecond); err != nil {
					return err
				}
				continue
			}
		}
		return err
	}
}

// splitStatements splits a migration into its statements: comments
// removed, split at semicolons. The embedded migrations have no semicolon
// nor "--" inside a literal; TestSplitStatements holds them to it.
func splitStatements(sql string) []string {
	var b strings.Builder
	for _, line := range strings.Split(sql, "\n") {
		if i := strings.Index(line, "--"); i >= 0 {
			line = line[:i]
		}
		b.WriteString(line)
		b.WriteByte('\n')
	}
	var out []string
	for _, stmt := range strings.Split(b.String(), ";") {
		if stmt = strings.TrimSpace(stmt); stmt != "" {
			out = append(out, stmt)
		}
	}
	return out
}

// migrationLock is a held lock row.
type migrationLock struct {
	s       *Store
	table   string
	holder  string
	renewed time.Time
}

// lockPollMax caps the wait between two tries of a held lock row.
const lockPollMax = time.Second

// lockMigrations takes the lock row, waiting while another migrator's lease
// runs. It gives up with ctx.
func (s *Store) lockMigrations(ctx context.Context, table string) (*migrationLock, error) {
	var id [8]byte
	_, _ = rand.Read(id[:])
	l := &migrationLock{s: s, table: table, holder: hex.EncodeToString(id[:])}
	take := `INSERT INTO ` + table + ` AS l (name, holder, expires_at)
VALUES ('migrate', $1, now() + $2::bigint * interval '1 millisecond')
ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at
WHERE l.expires_at < now()
RETURNING holder`
	wait := 10 * time.Millisecond
	for {
		var got string
		err := s.pool.QueryRow(ctx, take, l.holder, MigrationLease.Milliseconds()).Scan(&got)
		var pgErr *pgconn.PgError
		switch {
		case err == nil:
			return l, nil
		case errors.Is(err, pgx.ErrNoRows):
			// Held by a live lease.
		case errors.As(err, &pgErr) && (pgErr.Code == "40001" || pgErr.Code == "40P01"):
			// A conflict with another migrator taking it.
		default:
			return nil, fmt.Errorf("pgstore: migrate: lock: %w", err)
		}
		if err := sleepCtx(ctx, wait); err != nil {
			var holder string
			var left time.Duration
			var ms int64
			if s.pool.QueryRow(context.WithoutCancel(ctx), `SELECT holder, (extract(epoch FROM expires_at - now()) * 1000)::bigint FROM `+table+` WHERE name = 'migrate'`).Scan(&holder, &ms) == nil {
				left = time.Duration(ms) * time.Millisecond
			}
			return nil, fmt.Errorf("pgstore: migrate: waiting for the migration lock row held by %q (lease left %v): %w", holder, left, err)
		}
		wait = min(2*wait, lockPollMax)
	}
}

// renew extends the lease, or fails when another migrator has taken the
// row: this one's lease ran out while a statement ran.
func (l *migrationLock) renew(ctx context.Context) error {
	tag, err := l.s.pool.Exec(ctx, `UPDATE `+l.table+` SET expires_at = now() + $2::bigint * interval '1 millisecond' WHERE name = 'migrate' AND holder = $1`,
		l.holder, MigrationLease.Milliseconds())
	if err != nil {
		return fmt.Errorf("pgstore: migrate: renew lock: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("pgstore: migrate: lost the migration lock row: a statement outlasted the lease (%v) and another migrator took over", MigrationLease)
	}
	return nil
}

// release deletes the row, also when ctx is done.
func (l *migrationLock) release() {
	ctx, cancel := context.WithTimeout(context.Background(), pingTimeout)
	defer cancel()
	_, _ = l.s.pool.Exec(ctx, `DELETE FROM `+l.table+` WHERE name = 'migrate' AND holder = $1`, l.holder)
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
