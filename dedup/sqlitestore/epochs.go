package sqlitestore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/internal/storekit/rowscan"
)

// Release epochs: the table <Table>_epochs holds one row per scope that was
// ever released, with its epoch, and the release in progress (its token
// and when its hold runs out, Unix milliseconds); see dedup.EpochStore.
// Each write is one statement in a transaction of its own, which SQLite's
// single writer serialises.

func (s *Store) epochsTable() string { return `"` + s.cfg.Table + `_epochs"` }

// Epochs returns the epoch of every scope that has one; see
// dedup.EpochStore.
func (s *Store) Epochs(ctx context.Context) (map[string]dedup.Epoch, error) {
	out, err := rowscan.Epochs(s.db.QueryContext(ctx, `SELECT scope, epoch, coalesce(release_until > `+nowMillis+`, 0) FROM `+s.epochsTable()))
	if err != nil {
		return nil, s.epochErr("read", err)
	}
	return out, nil
}

// AdvanceEpoch moves scope's epoch forward; see dedup.EpochStore.
func (s *Store) AdvanceEpoch(ctx context.Context, scope string) (int64, error) {
	var n int64
	err := s.db.QueryRowContext(ctx, `INSERT INTO `+s.epochsTable()+` AS e (scope, epoch) VALUES (?, 1)
ON CONFLICT (scope) DO UPDATE SET epoch = e.epoch + 1
RETURNING epoch`, scope).Scan(&n)
	if err != nil {
		return 0, s.epochErr("advance "+scope, err)
	}
	return n, nil
}

// BeginRelease marks a release of scope; see dedup.EpochStore.
func (s *Store) BeginRelease(ctx context.Context, scope string, hold time.Duration) (int64, error) {
	if hold <= 0 {
		return 0, fmt.Errorf("sqlitestore: begin release of %s: hold %v is not positive", scope, hold)
	}
	var token int64
	err := s.db.QueryRowContext(ctx, `INSERT INTO `+s.epochsTable()+` AS e (scope, epoch, release_token, release_until)
VALUES (?1, 1, 1, `+nowMillis+` + ?2)
ON CONFLICT (scope) DO UPDATE
SET epoch = e.epoch + 1, release_token = e.epoch + 1, release_until = excluded.release_until
WHERE e.release_until IS NULL OR e.release_until <= `+nowMillis+`
RETURNING epoch`, scope, hold.Milliseconds()).Scan(&token)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, fmt.Errorf("%w: %s", dedup.ErrReleaseInProgress, scope)
	}
	if err != nil {
		return 0, s.epochErr("begin release of "+scope, err)
	}
	return token, nil
}

// EndRelease ends the release of token; see dedup.EpochStore.
func (s *Store) EndRelease(ctx context.Context, scope string, token int64) error {
	_, err := s.db.ExecContext(ctx, `UPDATE `+s.epochsTable()+`
SET epoch = epoch + 1,
    release_until = CASE WHEN release_token = ?2 THEN NULL ELSE release_until END,
    release_token = CASE WHEN release_token = ?2 THEN NULL ELSE release_token END
WHERE scope = ?1`, scope, token)
	if err != nil {
		return s.epochErr("end release of "+scope, err)
	}
	return nil
}

// epochErr names a missing table (SQLite says so only in the message of a
// plain SQLITE_ERROR, so the catalogue is asked) as dedup.ErrNotMigrated.
func (s *Store) epochErr(op string, err error) error {
	var se *sqlite.Error
	if errors.As(err, &se) && se.Code()&0xff == sqlite3.SQLITE_ERROR {
		var n int
		if s.db.QueryRow(`SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?`, s.cfg.Table+"_epochs").Scan(&n) == nil && n == 0 {
			return fmt.Errorf("%w: sqlitestore: %s does not exist: call Store.Migrate", dedup.ErrNotMigrated, s.epochsTable())
		}
	}
	return s.wrap("epochs: "+op, err)
}

var _ dedup.EpochStore = (*Store)(nil)
