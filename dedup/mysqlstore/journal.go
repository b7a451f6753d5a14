package mysqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/internal/storekit/rowscan"
)

// The effect journal (dedup.Journal) is the table <table>_steps (migration
// 005): one row per (scope, key, step), times in UTC by the server's clock.
// Every method is one READ COMMITTED transaction of its own, whatever
// Config.Isolation says: a locking read of a missing row then takes no gap
// lock, which two callers beginning one new step would deadlock on.
//
// BeginStep reads the step's row FOR UPDATE. A new step, or one taken
// over, draws a token from the counter row of <table>_tokens (migrations
// 003 and 004), whose lock the drawing transaction holds until it commits: of two
// callers beginning one new step, the second draws after the first
// committed its row, then reads the row again, locked, and finds it.
// The counter only grows, so tokens do too, also across a purge of the
// step. A transaction that holds a step's row takes the counter's after
// it (a takeover, ResolveStep); only a new step's second read comes after
// the draw, and should that row have been made, have run out its lease and
// be taken over meanwhile, the two wait on each other and InnoDB ends one
// (1213, a conflict). Draws are one row's updates in turn: the journal
// is for calls to other systems, a few per message, not for the claim
// path.

// stepCols are a step's columns as scanStep reads them: times in µs since
// the epoch, durations computed by the server's clock in the same
// statement.
const stepCols = "scope, `key`, step, state, provider_key, fingerprint, attempts, token, " +
	"TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', lease_expires_at), " +
	"TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', first_attempt_at), " +
	"TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', last_attempt_at), result, `error`, " +
	"TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', updated_at), " +
	"TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), lease_expires_at), " +
	"TIMESTAMPDIFF(MICROSECOND, first_attempt_at, UTC_TIMESTAMP(6)), " +
	"TIMESTAMPDIFF(MICROSECOND, last_attempt_at, UTC_TIMESTAMP(6))"

const stepPK = "scope = ? AND `key` = ? AND step = ?"

// stepOpen says which steps are unresolved: unknown, in doubt, and
// pending with the lease run out.
const stepOpen = "(state IN ('unknown', 'in_doubt') OR state = 'pending' AND lease_expires_at <= UTC_TIMESTAMP(6))"

type rowScanner interface{ Scan(dest ...any) error }

// scanStep reads a row of stepCols into a record.
func scanStep(row rowScanner) (dedup.StepRecord, error) {
	var (
		rec                                   dedup.StepRecord
		state                                 string
		fp                                    []byte
		lease, first, last, upd, left, sf, sl int64
	)
	err := row.Scan(&rec.Ref.Key.Scope, &rec.Ref.Key.ID, &rec.Ref.Step, &state, &rec.ProviderKey, &fp, &rec.Attempts, &rec.Token,
		&lease, &first, &last, &rec.Result, &rec.Error, &upd, &left, &sf, &sl)
	if err != nil {
		return rec, err
	}
	if rec.State, err = dedup.ParseStepState(state); err != nil {
		return rec, fmt.Errorf("step %s/%s: %w", rec.Ref.Key, rec.Ref.Step, err)
	}
	copy(rec.Fingerprint[:], fp) // NULL: none
	rec.LeaseExpires, rec.FirstAttemptAt, rec.LastAttemptAt, rec.UpdatedAt = time.UnixMicro(lease), time.UnixMicro(first), time.UnixMicro(last), time.UnixMicro(upd)
	rec.LeaseLeft = time.Duration(left) * time.Microsecond
	rec.SinceFirstAttempt = time.Duration(sf) * time.Microsecond
	rec.SinceLastAttempt = time.Duration(sl) * time.Microsecond
	return rec, nil
}

type querier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

func (s *Store) getStep(ctx context.Context, q querier, ref dedup.StepRef, lock string) (dedup.StepRecord, error) {
	return scanStep(q.QueryRowContext(ctx, "SELECT "+stepCols+" FROM "+s.steps+" WHERE "+stepPK+lock, ref.Key.Scope, ref.Key.ID, ref.Step))
}

// stepTx runs fn in a READ COMMITTED transaction of its own.
func (s *Store) stepTx(ctx context.Context, op string, fn func(tx *sql.Tx) error) (err error) {
	tx, err := s.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return s.connErr(op, err)
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	if err := fn(tx); err != nil {
		if errors.Is(err, dedup.ErrLeaseLost) || errors.Is(err, dedup.ErrNotMigrated) {
			return err // the journal's own, not the driver's
		}
		return s.connErr(op, err)
	}
	if err := tx.Commit(); err != nil {
		return s.connErr(op, err)
	}
	return nil
}

// nextToken draws a token in tx: larger than every one drawn before.
// LAST_INSERT_ID(expr) hands the new value back in the statement's answer.
func (s *Store) nextToken(ctx context.Context, tx *sql.Tx) (int64, error) {
	res, err := tx.ExecContext(ctx, "UPDATE "+s.tokens+" SET last = LAST_INSERT_ID(last + 1) WHERE id = 1")
	if err != nil {
		return 0, err
	}
	if n, err := res.RowsAffected(); err != nil {
		return 0, err
	} else if n == 0 {
		return 0, fmt.Errorf("%w: mysqlstore: %s has no row: call Store.Migrate", dedup.ErrNotMigrated, s.tokens)
	}
	return res.LastInsertId()
}

// stepLease checks a ref and a lease and returns the lease in µs.
func stepLease(ref dedup.StepRef, lease time.Duration) (int64, error) {
	if err := ref.Validate(); err != nil {
		return 0, err
	}
	if lease <= 0 {
		return 0, fmt.Errorf("mysqlstore: a step's lease must be positive, not %v", lease)
	}
	return max(lease.Microseconds(), 1), nil
}

func leaseLost(ref dedup.StepRef, token int64) error {
	return fmt.Errorf("%w: step %s/%s, token %d", dedup.ErrLeaseLost, ref.Key, ref.Step, token)
}

// BeginStep takes ref for one call; see dedup.Journal.
func (s *Store) BeginStep(ctx context.Context, ref dedup.StepRef, providerKey string, fp dedup.Fingerprint, lease time.Duration) (dedup.StepRecord, error) {
	us, err := stepLease(ref, lease)
	if err != nil {
		return dedup.StepRecord{}, err
	}
	var rec dedup.StepRecord
	err = s.stepTx(ctx, "begin step", func(tx *sql.Tx) error {
		cur, err := s.getStep(ctx, tx, ref, " FOR UPDATE")
		if errors.Is(err, sql.ErrNoRows) {
			token, err := s.nextToken(ctx, tx)
			if err != nil {
				return err
			}
			// Whoever made the row meanwhile drew before and committed:
			// read again, locked, before inserting.
			cur, err = s.getStep(ctx, tx, ref, " FOR UPDATE")
			if err == nil {
				return s.beginFound(ctx, tx, ref, cur, fp, us, &rec)
			} else if !errors.Is(err, sql.ErrNoRows) {
				return err
			}
			var fpArg []byte // NULL: none
			if !fp.IsZero() {
				fpArg = fp[:]
			}
			_, err = tx.ExecContext(ctx, "INSERT INTO "+s.steps+" (scope, `key`, step, state, provider_key, fingerprint, attempts, token, "+
				"lease_expires_at, first_attempt_at, last_attempt_at, `error`, updated_at) "+
				"VALUES (?, ?, ?, 'pending', ?, ?, 1, ?, DATE_ADD(UTC_TIMESTAMP(6), INTERVAL ? MICROSECOND), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), '', UTC_TIMESTAMP(6))",
				ref.Key.Scope, ref.Key.ID, ref.Step, providerKey, fpArg, token, us)
			if err != nil {
				return err
			}
			rec, err = s.getStep(ctx, tx, ref, "")
			rec.Verdict = dedup.StepCall
			return err
		} else if err != nil {
			return err
		}
		return s.beginFound(ctx, tx, ref, cur, fp, us, &rec)
	})
	if err != nil {
		return dedup.StepRecord{}, err
	}
	return rec, nil
}

// beginFound is BeginStep of a step found, its row locked by tx.
func (s *Store) beginFound(ctx context.Context, tx *sql.Tx, ref dedup.StepRef, cur dedup.StepRecord, fp dedup.Fingerprint, us int64, rec *dedup.StepRecord) error {
	switch {
	case cur.Fingerprint.Mismatches(fp):
		*rec, rec.Verdict = cur, dedup.StepMismatch
	case (cur.State == dedup.StepPending || cur.State == dedup.StepUnknown) && cur.LeaseLeft <= 0:
		token, err := s.nextToken(ctx, tx)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, "UPDATE "+s.steps+" SET token = GREATEST(token + 1, ?), "+
			"lease_expires_at = DATE_ADD(UTC_TIMESTAMP(6), INTERVAL ? MICROSECOND), updated_at = UTC_TIMESTAMP(6) WHERE "+stepPK,
			token, us, ref.Key.Scope, ref.Key.ID, ref.Step); err != nil {
			return err
		}
		*rec, err = s.getStep(ctx, tx, ref, "")
		rec.Verdict = dedup.StepResolve
		return err
	case cur.State == dedup.StepPending || cur.State == dedup.StepUnknown:
		*rec, rec.Verdict = cur, dedup.StepBusy
	default:
		*rec, rec.Verdict = cur, dedup.StepDone
	}
	return nil
}

// AttemptStep records another request of the holder of token; see
// dedup.Journal.
func (s *Store) AttemptStep(ctx context.Context, ref dedup.StepRef, token int64, lease time.Duration) (dedup.StepRecord, error) {
	us, err := stepLease(ref, lease)
	if err != nil {
		return dedup.StepRecord{}, err
	}
	var rec dedup.StepRecord
	err = s.stepTx(ctx, "attempt step", func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, "UPDATE "+s.steps+" SET attempts = attempts + 1, last_attempt_at = UTC_TIMESTAMP(6), state = 'pending', "+
			"lease_expires_at = DATE_ADD(UTC_TIMESTAMP(6), INTERVAL ? MICROSECOND), updated_at = UTC_TIMESTAMP(6) "+
			"WHERE "+stepPK+" AND token = ? AND state IN ('pending', 'unknown')", us, ref.Key.Scope, ref.Key.ID, ref.Step, token)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil {
			return err
		} else if n == 0 {
			return leaseLost(ref, token)
		}
		rec, err = s.getStep(ctx, tx, ref, "")
		return err
	})
	return rec, err
}

// FinishStep records the outcome of the holder of token; see
// dedup.Journal.
func (s *Store) FinishStep(ctx context.Context, ref dedup.StepRef, token int64, out dedup.StepOutcome) error {
	if err := ref.Validate(); err != nil {
		return err
	}
	switch out.State {
	case dedup.StepSucceeded, dedup.StepFailed, dedup.StepUnknown, dedup.StepInDoubt:
	default:
		return fmt.Errorf("mysqlstore: finish step: an outcome is succeeded, failed, unknown or in_doubt, not %v", out.State)
	}
	res, err := s.db.ExecContext(ctx, "UPDATE "+s.steps+" SET state = ?, result = ?, `error` = ?, "+
		"lease_expires_at = UTC_TIMESTAMP(6), updated_at = UTC_TIMESTAMP(6) "+
		"WHERE "+stepPK+" AND token = ? AND state IN ('pending', 'unknown')",
		out.State.String(), out.Result, out.Error, ref.Key.Scope, ref.Key.ID, ref.Step, token)
	if err != nil {
		return s.connErr("finish step", err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return s.connErr("finish step", err)
	} else if n == 0 {
		return leaseLost(ref, token)
	}
	return nil
}

// ResolveStep records an operator's resolution of an unresolved step; see
// dedup.Journal.
func (s *Store) ResolveStep(ctx context.Context, ref dedup.StepRef, token int64, out dedup.StepOutcome) (bool, error) {
	if err := ref.Validate(); err != nil {
		return false, err
	}
	if out.State != dedup.StepSucceeded && out.State != dedup.StepFailed {
		return false, fmt.Errorf("mysqlstore: resolve step: a resolution is succeeded or failed, not %v", out.State)
	}
	var resolved bool
	err := s.stepTx(ctx, "resolve step", func(tx *sql.Tx) error {
		// The step's row before the counter's, as BeginStep: no deadlock.
		if _, err := s.getStep(ctx, tx, ref, " FOR UPDATE"); errors.Is(err, sql.ErrNoRows) {
			return nil
		} else if err != nil {
			return err
		}
		next, err := s.nextToken(ctx, tx)
		if err != nil {
			return err
		}
		res, err := tx.ExecContext(ctx, "UPDATE "+s.steps+" SET state = ?, result = ?, `error` = ?, token = GREATEST(token + 1, ?), "+
			"lease_expires_at = UTC_TIMESTAMP(6), updated_at = UTC_TIMESTAMP(6) "+
			"WHERE "+stepPK+" AND (? = 0 OR token = ?) AND "+stepOpen,
			out.State.String(), out.Result, out.Error, next, ref.Key.Scope, ref.Key.ID, ref.Step, token, token)
		if err != nil {
			return err
		}
		n, err := res.RowsAffected()
		resolved = n > 0
		return err
	})
	return resolved, err
}

// Step returns ref's record; see dedup.Journal.
func (s *Store) Step(ctx context.Context, ref dedup.StepRef) (dedup.StepRecord, bool, error) {
	if err := ref.Validate(); err != nil {
		return dedup.StepRecord{}, false, err
	}
	rec, err := s.getStep(ctx, s.db, ref, "")
	if errors.Is(err, sql.ErrNoRows) {
		return rec, false, nil
	}
	if err != nil {
		return rec, false, s.connErr("step", err)
	}
	return rec, true, nil
}

// Steps lists steps for operators; see dedup.Journal.
func (s *Store) Steps(ctx context.Context, f dedup.StepFilter) ([]dedup.StepRecord, error) {
	if err := f.Validate(); err != nil {
		return nil, fmt.Errorf("mysqlstore: steps: %w", err)
	}
	limit := f.Limit
	if limit <= 0 {
		limit = 100
	}
	where, args := stepOpen, []any{}
	if len(f.States) > 0 {
		marks := make([]string, len(f.States))
		for i, st := range f.States {
			marks[i], args = "?", append(args, st.String())
		}
		where = "state IN (" + strings.Join(marks, ", ") + ")"
	}
	if f.Scope != "" {
		where, args = where+" AND scope = ?", append(args, f.Scope)
	}
	if f.Key != "" {
		where, args = where+" AND `key` = ?", append(args, f.Key)
	}
	rows, err := s.db.QueryContext(ctx, "SELECT "+stepCols+" FROM "+s.steps+" WHERE "+where+
		" ORDER BY first_attempt_at, scope, `key`, step LIMIT ?", append(args, limit)...)
	if err != nil {
		return nil, s.connErr("steps", err)
	}
	defer rows.Close()
	var recs []dedup.StepRecord
	for rows.Next() {
		rec, err := scanStep(rows)
		if err != nil {
			return nil, s.connErr("steps", err)
		}
		recs = append(recs, rec)
	}
	if err := rows.Err(); err != nil {
		return nil, s.connErr("steps", err)
	}
	return recs, nil
}

// LiveSteps returns the steps of keys that are not failed, read in tx in
// one statement; see dedup.TxSteps.
func (s *Store) LiveSteps(ctx context.Context, tx *sql.Tx, keys []dedup.Key) ([]dedup.StepRecord, error) {
	var where strings.Builder
	args := make([]any, 0, 2*len(keys))
	seen := make(map[dedup.Key]int, len(keys)) // a key's records, once read
	for _, k := range keys {
		if err := k.Validate(); err != nil {
			return nil, fmt.Errorf("mysqlstore: live steps: %w", err)
		}
		if _, ok := seen[k]; ok {
			continue
		}
		seen[k] = 0
		if len(args) > 0 {
			where.WriteString(" OR ")
		}
		where.WriteString("(scope = ? AND `key` = ?)")
		args = append(args, k.Scope, k.ID)
	}
	if len(args) == 0 {
		return nil, nil
	}
	rows, err := tx.QueryContext(ctx, "SELECT "+stepCols+" FROM "+s.steps+" WHERE state <> 'failed' AND ("+where.String()+
		") ORDER BY first_attempt_at, step", args...)
	if err != nil {
		return nil, s.connErr("live steps", err)
	}
	defer rows.Close()
	var recs []dedup.StepRecord
	for rows.Next() {
		rec, err := scanStep(rows)
		if err != nil {
			return nil, s.connErr("live steps", err)
		}
		if seen[rec.Ref.Key]++; seen[rec.Ref.Key] <= dedup.LiveStepsPerKey {
			recs = append(recs, rec)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, s.connErr("live steps", err)
	}
	return recs, nil
}

// CountSteps counts steps by state; see dedup.Journal. StepPending counts
// the steps whose lease runs, expiredPending the others.
func (s *Store) CountSteps(ctx context.Context) (map[dedup.StepState]int64, int64, error) {
	byState, expired, err := rowscan.StepCounts(s.db.QueryContext(ctx, "SELECT state, state = 'pending' AND lease_expires_at <= UTC_TIMESTAMP(6), count(*) FROM "+
		s.steps+" GROUP BY 1, 2"))
	if err != nil {
		return nil, 0, s.connErr("count steps", err) // state is an ENUM: every error is the connection's
	}
	return byState, expired, nil
}

// purgeSteps deletes, in Purge's transaction tx, the succeeded and failed
// steps of keys, whose rows it deleted.
func (s *Store) purgeSteps(ctx context.Context, tx *sql.Tx, keys []dedup.Key) (int, error) {
	if len(keys) == 0 {
		return 0, nil
	}
	var q strings.Builder
	args := make([]any, 0, 2*len(keys))
	q.WriteString("DELETE FROM " + s.steps + " WHERE state IN ('succeeded', 'failed') AND (")
	for i, k := range keys {
		if i > 0 {
			q.WriteString(" OR ")
		}
		q.WriteString("(scope = ? AND `key` = ?)")
		args = append(args, k.Scope, k.ID)
	}
	q.WriteString(")")
	res, err := tx.ExecContext(ctx, q.String(), args...)
	if err != nil {
		return 0, s.connErr("purge steps", err)
	}
	n, _ := res.RowsAffected()
	return int(n), nil
}

var _ dedup.TxSteps[*sql.Tx] = (*Store)(nil)
