package pgstore

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Lock takes a session advisory lock (pg_advisory_lock) on a hash of the
// store's table and name, on a connection of its own held until unlock;
// Postgres lets it go when that connection ends. In distributed mode,
// which has no advisory locks, the lock is name's row of the table's
// _locks table, held FOR UPDATE by a transaction open until unlock. It
// implements dedup.Admin.Lock.
func (a *Admin) Lock(ctx context.Context, name string) (func(), error) {
	conn, err := a.s.pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("pgstore: lock %s: %w", name, err)
	}
	if a.s.cfg.Distributed {
		return a.lockRow(ctx, conn.Conn(), conn.Release, name)
	}
	id := a.s.table + " " + name
	if _, err := conn.Exec(ctx, `select pg_advisory_lock(hashtextextended($1, 0))`, id); err != nil {
		conn.Release()
		return nil, fmt.Errorf("pgstore: lock %s: %w", name, err)
	}
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := conn.Exec(ctx, `select pg_advisory_unlock(hashtextextended($1, 0))`, id); err != nil {
			_ = conn.Conn().Close(ctx) // closing the session lets the lock go
		}
		conn.Release()
	}, nil
}

// lockRow holds name's row of the _locks table FOR UPDATE in a
// transaction on conn until unlock rolls it back.
func (a *Admin) lockRow(ctx context.Context, conn *pgx.Conn, release func(), name string) (func(), error) {
	if _, err := conn.Exec(ctx, `INSERT INTO `+a.s.locks+` (name) VALUES ($1) ON CONFLICT (name) DO NOTHING`, name); err != nil {
		release()
		return nil, fmt.Errorf("pgstore: lock %s: %w", name, err)
	}
	tx, err := conn.Begin(ctx)
	if err == nil {
		_, err = tx.Exec(ctx, `SELECT name FROM `+a.s.locks+` WHERE name = $1 FOR UPDATE`, name)
	}
	if err != nil {
		_ = conn.Close(context.Background()) // ends the transaction, whatever its state
		release()
		return nil, fmt.Errorf("pgstore: lock %s: %w", name, err)
	}
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := tx.Rollback(ctx); err != nil {
			_ = conn.Close(ctx)
		}
		release()
	}, nil
}
