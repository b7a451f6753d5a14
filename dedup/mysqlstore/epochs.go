package mysqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/internal/storekit/rowscan"
)

// Release epochs: the table <Table>_epochs (migration 002) holds one row
// per scope that was ever released, with its epoch, and the release in
// progress (its token and when its hold runs out, by UTC_TIMESTAMP); see
// dedup.EpochStore. Each write is a transaction of its own that reads the
// row FOR UPDATE (or inserts it) and then updates it: racing writers queue
// on the row lock; a deadlock is retried.

// Epochs returns the epoch of every scope that has one; see
// dedup.EpochStore.
func (s *Store) Epochs(ctx context.Context) (map[string]dedup.Epoch, error) {
	out, err := rowscan.Epochs(s.db.QueryContext(ctx, "SELECT scope, epoch, coalesce(release_until > UTC_TIMESTAMP(6), 0) FROM "+s.epochs))
	if err != nil {
		return nil, s.epochErr("read", err)
	}
	return out, nil
}

// epochRow is a scope's row, read FOR UPDATE in tx (created at epoch 0
// when missing, which the update that follows moves to 1 before the
// transaction commits).
type epochRow struct {
	epoch     int64
	token     sql.NullInt64
	releasing bool
}

func (s *Store) lockEpoch(ctx context.Context, tx *sql.Tx, scope string) (epochRow, error) {
	// An upsert that changes nothing takes the row's exclusive lock (a
	// plain INSERT IGNORE would take a shared one, and two of them
	// deadlock on the update).
	if _, err := tx.ExecContext(ctx, "INSERT INTO "+s.epochs+" (scope, epoch) VALUES (?, 0) ON DUPLICATE KEY UPDATE scope = scope", scope); err != nil {
		return epochRow{}, err
	}
	var r epochRow
	err := tx.QueryRowContext(ctx, "SELECT epoch, release_token, coalesce(release_until > UTC_TIMESTAMP(6), 0) FROM "+s.epochs+
		" WHERE scope = ? FOR UPDATE", scope).Scan(&r.epoch, &r.token, &r.releasing)
	return r, err
}

// epochTx runs fn in a transaction of its own, again after a deadlock.
func (s *Store) epochTx(ctx context.Context, op string, fn func(tx *sql.Tx) error) error {
	var err error
	for range 10 {
		err = func() error {
			tx, err := s.db.BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			defer func() { _ = tx.Rollback() }()
			if err := fn(tx); err != nil {
				return err
			}
			return tx.Commit()
		}()
		var me *mysql.MySQLError
		if !errors.As(err, &me) || me.Number != erLockDeadlock {
			break
		}
	}
	if err != nil && !errors.Is(err, dedup.ErrReleaseInProgress) {
		return s.epochErr(op, err)
	}
	return err
}

// AdvanceEpoch moves scope's epoch forward; see dedup.EpochStore.
func (s *Store) AdvanceEpoch(ctx context.Context, scope string) (int64, error) {
	var n int64
	err := s.epochTx(ctx, "advance "+scope, func(tx *sql.Tx) error {
		r, err := s.lockEpoch(ctx, tx, scope)
		if err != nil {
			return err
		}
		n = r.epoch + 1
		_, err = tx.ExecContext(ctx, "UPDATE "+s.epochs+" SET epoch = ? WHERE scope = ?", n, scope)
		return err
	})
	return n, err
}

// BeginRelease marks a release of scope; see dedup.EpochStore.
func (s *Store) BeginRelease(ctx context.Context, scope string, hold time.Duration) (int64, error) {
	if hold <= 0 {
		return 0, fmt.Errorf("mysqlstore: begin release of %s: hold %v is not positive", scope, hold)
	}
	var token int64
	err := s.epochTx(ctx, "begin release of "+scope, func(tx *sql.Tx) error {
		r, err := s.lockEpoch(ctx, tx, scope)
		if err != nil {
			return err
		}
		if r.token.Valid && r.releasing {
			return fmt.Errorf("%w: %s", dedup.ErrReleaseInProgress, scope)
		}
		token = r.epoch + 1
		_, err = tx.ExecContext(ctx, "UPDATE "+s.epochs+" SET epoch = ?, release_token = ?, "+
			"release_until = DATE_ADD(UTC_TIMESTAMP(6), INTERVAL ? MICROSECOND) WHERE scope = ?", token, token, hold.Microseconds(), scope)
		return err
	})
	return token, err
}

// EndRelease ends the release of token; see dedup.EpochStore.
func (s *Store) EndRelease(ctx context.Context, scope string, token int64) error {
	return s.epochTx(ctx, "end release of "+scope, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, "UPDATE "+s.epochs+" SET epoch = epoch + 1, "+
			"release_until = CASE WHEN release_token = ? THEN NULL ELSE release_until END, "+
			"release_token = CASE WHEN release_token = ? THEN NULL ELSE release_token END WHERE scope = ?", token, token, scope)
		return err
	})
}

// epochErr names a missing table (1146) as dedup.ErrNotMigrated.
func (s *Store) epochErr(op string, err error) error {
	var me *mysql.MySQLError
	if errors.As(err, &me) && me.Number == 1146 {
		return fmt.Errorf("%w: mysqlstore: %s does not exist: call Store.Migrate", dedup.ErrNotMigrated, s.epochs)
	}
	return s.connErr("epochs: "+op, err)
}

var _ dedup.EpochStore = (*Store)(nil)
