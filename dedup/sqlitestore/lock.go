package sqlitestore

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/idemkit/idem/dedup"
)

// Lock takes the lock called name: an exclusive transaction on a lock
// file beside the database (<database>-idem-lock-<hash of table and
// name>, left in place), which the operating system lets go when its
// holder dies; a database without a file (in memory) is one process's,
// and its lock is too. It implements dedup.Admin.Lock.
func (a *Admin) Lock(ctx context.Context, name string) (func(), error) {
	var file string
	if err := a.s.db.QueryRowContext(ctx, `select file from pragma_database_list where name = 'main'`).Scan(&file); err != nil {
		return nil, fmt.Errorf("sqlitestore: lock %s: %w", name, err)
	}
	if file == "" {
		return a.lockInProcess(ctx, name)
	}
	sum := sha256.Sum256([]byte(a.s.table + "\x00" + name))
	path := file + "-idem-lock-" + hex.EncodeToString(sum[:8])
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(0)")
	if err != nil {
		return nil, fmt.Errorf("sqlitestore: lock %s: %w", name, err)
	}
	db.SetMaxOpenConns(1)
	conn, err := db.Conn(ctx)
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("sqlitestore: lock %s: %w", name, err)
	}
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		_, err := conn.ExecContext(ctx, `begin exclusive`)
		if err == nil {
			break
		}
		if ctx.Err() == nil && Classify(err) == dedup.ClassConflict { // SQLITE_BUSY: another holds it
			err = nil
		}
		if err != nil {
			conn.Close()
			db.Close()
			return nil, fmt.Errorf("sqlitestore: lock %s: %w", name, err)
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			conn.Close()
			db.Close()
			return nil, fmt.Errorf("sqlitestore: lock %s: %w", name, ctx.Err())
		}
	}
	return func() {
		_, _ = conn.ExecContext(context.Background(), `rollback`)
		conn.Close()
		db.Close()
	}, nil
}

func (a *Admin) lockInProcess(ctx context.Context, name string) (func(), error) {
	v, _ := a.s.locks.LoadOrStore(name, make(chan struct{}, 1))
	ch := v.(chan struct{})
	select {
	case ch <- struct{}{}:
		return func() { <-ch }, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("sqlitestore: lock %s: %w", name, ctx.Err())
	}
}
