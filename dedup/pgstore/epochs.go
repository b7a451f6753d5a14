package pgstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/internal/storekit/rowscan"
)

// Release epochs: the table <Table>_epochs (migration 004) holds one row
// per scope that was ever released, with its epoch, and the release in
// progress (its token and when its hold runs out); see dedup.EpochStore.
// Each method is one statement, its own transaction; BeginRelease's upsert
// moves nothing while another release's hold is live, by the database's
// clock.

// EpochsTable returns the sanitized, schema-qualified name of the epochs
// table.
func (s *Store) EpochsTable() string { return s.epochs }

// Epochs returns the epoch of every scope that has one; see
// dedup.EpochStore.
func (s *Store) Epochs(ctx context.Context) (map[string]dedup.Epoch, error) {
	out, err := rowscan.Epochs(s.pool.Query(ctx, `SELECT scope, epoch, coalesce(release_until > now(), false) FROM `+s.epochs))
	if err != nil {
		return nil, s.epochErr("read", err)
	}
	return out, nil
}

// AdvanceEpoch moves scope's epoch forward; see dedup.EpochStore.
func (s *Store) AdvanceEpoch(ctx context.Context, scope string) (int64, error) {
	var n int64
	err := retryConflicts(ctx, func() error {
		return s.pool.QueryRow(ctx, `INSERT INTO `+s.epochs+` AS e (scope, epoch) VALUES ($1, 1)
ON CONFLICT (scope) DO UPDATE SET epoch = e.epoch + 1, updated_at = now()
RETURNING epoch`, scope).Scan(&n)
	})
	if err != nil {
		return 0, s.epochErr("advance "+scope, err)
	}
	return n, nil
}

// BeginRelease marks a release of scope; see dedup.EpochStore.
func (s *Store) BeginRelease(ctx context.Context, scope string, hold time.Duration) (int64, error) {
	if hold <= 0 {
		return 0, fmt.Errorf("pgstore: begin release of %s: hold %v is not positive", scope, hold)
	}
	var token int64
	err := retryConflicts(ctx, func() error {
		return s.pool.QueryRow(ctx, `INSERT INTO `+s.epochs+` AS e (scope, epoch, release_token, release_until)
VALUES ($1, 1, 1, now() + $2::int8 * interval '1 millisecond')
ON CONFLICT (scope) DO UPDATE
SET epoch = e.epoch + 1, release_token = e.epoch + 1, release_until = excluded.release_until, updated_at = now()
WHERE e.release_until IS NULL OR e.release_until <= now()
RETURNING epoch`, scope, hold.Milliseconds()).Scan(&token)
	})
	if errors.Is(err, pgx.ErrNoRows) {
		var until time.Time
		if err := s.pool.QueryRow(ctx, `SELECT release_until FROM `+s.epochs+` WHERE scope = $1`, scope).Scan(&until); err != nil {
			return 0, fmt.Errorf("%w: %s", dedup.ErrReleaseInProgress, scope)
		}
		return 0, fmt.Errorf("%w: %s, held until %s", dedup.ErrReleaseInProgress, scope, until.UTC().Format(time.RFC3339))
	}
	if err != nil {
		return 0, s.epochErr("begin release of "+scope, err)
	}
	return token, nil
}

// EndRelease ends the release of token; see dedup.EpochStore.
func (s *Store) EndRelease(ctx context.Context, scope string, token int64) error {
	err := retryConflicts(ctx, func() error {
		_, err := s.pool.Exec(ctx, `UPDATE `+s.epochs+`
SET epoch = epoch + 1, updated_at = now(),
    release_until = CASE WHEN release_token = $2 THEN NULL ELSE release_until END,
    release_token = CASE WHEN release_token = $2 THEN NULL ELSE release_token END
WHERE scope = $1`, scope, token)
		return err
	})
	if err != nil {
		return s.epochErr("end release of "+scope, err)
	}
	return nil
}

// retryConflicts runs one statement again while it fails with a
// serialization failure or a deadlock: under SERIALIZABLE (distributed
// mode) racing writers of one epoch row conflict, and each is an operator's
// call with nothing else in its transaction to redo. Ten attempts at most.
func retryConflicts(ctx context.Context, stmt func() error) error {
	var err error
	for attempt := range 10 {
		var pgErr *pgconn.PgError
		if err = stmt(); !errors.As(err, &pgErr) || (pgErr.Code != "40001" && pgErr.Code != "40P01") {
			return err
		}
		t := time.NewTimer(time.Duration(attempt+1) * time.Duration(1+rand.IntN(10)) * time.Millisecond)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return errors.Join(err, ctx.Err())
		}
	}
	return err
}

func (s *Store) epochErr(op string, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" {
		return fmt.Errorf("%w: pgstore: %s does not exist: call Store.Migrate", dedup.ErrNotMigrated, s.epochs)
	}
	return fmt.Errorf("pgstore: epochs: %s: %w", op, err)
}

var _ dedup.EpochStore = (*Store)(nil)
