package sqlitestore

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
// 006): one row per (scope, key, step), times in Unix milliseconds by
// SQLite's clock. Every method is one transaction of its own: BeginStep
// and ResolveStep an IMMEDIATE one, which holds the database's write lock
// from its start, so that of two callers beginning one step the second
// finds what the first left. Tokens are drawn from the counter of lease
// tokens (requests.go): they only grow, also across a purge of the step.

func (s *Store) stepsTable() string { return `"` + s.cfg.Table + `_steps"` }

// stepCols are a step's columns as scanStep reads them, with the
// durations computed by SQLite's clock in the same statement.
const stepCols = `scope, key, step, state, provider_key, fingerprint, attempts, token, lease_expires_at,
    first_attempt_at, last_attempt_at, result, error, updated_at,
    lease_expires_at - ` + nowMillis + `, ` + nowMillis + ` - first_attempt_at, ` + nowMillis + ` - last_attempt_at`

// stepOpen says which steps are unresolved: unknown, in doubt, and
// pending with the lease run out.
const stepOpen = `(state IN ('unknown', 'in_doubt') OR state = 'pending' AND lease_expires_at <= ` + nowMillis + `)`

const stepPK = `scope = ? AND key = ? AND step = ?`

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
	rec.LeaseExpires, rec.FirstAttemptAt, rec.LastAttemptAt, rec.UpdatedAt = time.UnixMilli(lease), time.UnixMilli(first), time.UnixMilli(last), time.UnixMilli(upd)
	rec.LeaseLeft = time.Duration(left) * time.Millisecond
	rec.SinceFirstAttempt = time.Duration(sf) * time.Millisecond
	rec.SinceLastAttempt = time.Duration(sl) * time.Millisecond
	return rec, nil
}

func (s *Store) getStep(ctx context.Context, q execQuerier, ref dedup.StepRef) (dedup.StepRecord, error) {
	return scanStep(q.QueryRowContext(ctx, `SELECT `+stepCols+` FROM `+s.stepsTable()+` WHERE `+stepPK, ref.Key.Scope, ref.Key.ID, ref.Step))
}

// stepLease checks a ref and a lease and returns the lease in ms.
func stepLease(ref dedup.StepRef, lease time.Duration) (int64, error) {
	if err := ref.Validate(); err != nil {
		return 0, err
	}
	if lease <= 0 {
		return 0, fmt.Errorf("sqlitestore: a step's lease must be positive, not %v", lease)
	}
	return max(lease.Milliseconds(), 1), nil
}

func leaseLost(ref dedup.StepRef, token int64) error {
	return fmt.Errorf("%w: step %s/%s, token %d", dedup.ErrLeaseLost, ref.Key, ref.Step, token)
}

// BeginStep takes ref for one call; see dedup.Journal.
func (s *Store) BeginStep(ctx context.Context, ref dedup.StepRef, providerKey string, fp dedup.Fingerprint, lease time.Duration) (dedup.StepRecord, error) {
	ms, err := stepLease(ref, lease)
	if err != nil {
		return dedup.StepRecord{}, err
	}
	var rec dedup.StepRecord
	err = s.InTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		cur, err := s.getStep(ctx, tx, ref)
		var verdict dedup.StepVerdict
		switch {
		case errors.Is(err, sql.ErrNoRows):
			token, err := s.nextToken(ctx, tx)
			if err != nil {
				return err
			}
			var fpArg []byte // NULL: none
			if !fp.IsZero() {
				fpArg = fp[:]
			}
			if _, err := tx.ExecContext(ctx, `INSERT INTO `+s.stepsTable()+` (scope, key, step, state, provider_key, fingerprint, attempts, token,
    lease_expires_at, first_attempt_at, last_attempt_at, updated_at)
SELECT ?, ?, ?, 'pending', ?, ?, 1, ?, now + ?, now, now, now FROM (SELECT `+nowMillis+` AS now)`,
				ref.Key.Scope, ref.Key.ID, ref.Step, providerKey, fpArg, token, ms); err != nil {
				return err
			}
			verdict = dedup.StepCall
		case err != nil:
			return err
		case cur.Fingerprint.Mismatches(fp):
			rec, rec.Verdict = cur, dedup.StepMismatch
			return nil
		case (cur.State == dedup.StepPending || cur.State == dedup.StepUnknown) && cur.LeaseLeft <= 0:
			token, err := s.nextToken(ctx, tx)
			if err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, `UPDATE `+s.stepsTable()+`
SET token = max(token + 1, ?), lease_expires_at = `+nowMillis+` + ?, updated_at = `+nowMillis+`
WHERE `+stepPK, token, ms, ref.Key.Scope, ref.Key.ID, ref.Step); err != nil {
				return err
			}
			verdict = dedup.StepResolve
		case cur.State == dedup.StepPending || cur.State == dedup.StepUnknown:
			rec, rec.Verdict = cur, dedup.StepBusy
			return nil
		default:
			rec, rec.Verdict = cur, dedup.StepDone
			return nil
		}
		rec, err = s.getStep(ctx, tx, ref)
		rec.Verdict = verdict
		return err
	})
	if err != nil {
		return dedup.StepRecord{}, s.wrap("begin step", err)
	}
	return rec, nil
}

// AttemptStep records another request of the holder of token; see
// dedup.Journal.
func (s *Store) AttemptStep(ctx context.Context, ref dedup.StepRef, token int64, lease time.Duration) (dedup.StepRecord, error) {
	ms, err := stepLease(ref, lease)
	if err != nil {
		return dedup.StepRecord{}, err
	}
	rec, err := scanStep(s.db.QueryRowContext(ctx, `UPDATE `+s.stepsTable()+`
SET attempts = attempts + 1, last_attempt_at = `+nowMillis+`, state = 'pending', lease_expires_at = `+nowMillis+` + ?, updated_at = `+nowMillis+`
WHERE `+stepPK+` AND token = ? AND state IN ('pending', 'unknown')
RETURNING `+stepCols, ms, ref.Key.Scope, ref.Key.ID, ref.Step, token))
	if errors.Is(err, sql.ErrNoRows) {
		return rec, leaseLost(ref, token)
	}
	if err != nil {
		return rec, s.wrap("attempt step", err)
	}
	return rec, nil
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
		return fmt.Errorf("sqlitestore: finish step: an outcome is succeeded, failed, unknown or in_doubt, not %v", out.State)
	}
	res, err := s.db.ExecContext(ctx, `UPDATE `+s.stepsTable()+`
SET state = ?, result = ?, error = ?, lease_expires_at = `+nowMillis+`, updated_at = `+nowMillis+`
WHERE `+stepPK+` AND token = ? AND state IN ('pending', 'unknown')`,
		out.State.String(), out.Result, out.Error, ref.Key.Scope, ref.Key.ID, ref.Step, token)
	if err != nil {
		return s.wrap("finish step", err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return s.wrap("finish step", err)
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
		return false, fmt.Errorf("sqlitestore: resolve step: a resolution is succeeded or failed, not %v", out.State)
	}
	var resolved bool
	err := s.InTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		next, err := s.nextToken(ctx, tx)
		if err != nil {
			return err
		}
		res, err := tx.ExecContext(ctx, `UPDATE `+s.stepsTable()+`
SET state = ?, result = ?, error = ?, token = max(token + 1, ?), lease_expires_at = `+nowMillis+`, updated_at = `+nowMillis+`
WHERE `+stepPK+` AND (? = 0 OR token = ?) AND `+stepOpen,
			out.State.String(), out.Result, out.Error, next, ref.Key.Scope, ref.Key.ID, ref.Step, token, token)
		if err != nil {
			return err
		}
		n, err := res.RowsAffected()
		resolved = n > 0
		return err
	})
	return resolved, s.wrap("resolve step", err)
}

// Step returns ref's record; see dedup.Journal.
func (s *Store) Step(ctx context.Context, ref dedup.StepRef) (dedup.StepRecord, bool, error) {
	if err := ref.Validate(); err != nil {
		return dedup.StepRecord{}, false, err
	}
	rec, err := s.getStep(ctx, s.db, ref)
	if errors.Is(err, sql.ErrNoRows) {
		return rec, false, nil
	}
	if err != nil {
		return rec, false, s.wrap("step", err)
	}
	return rec, true, nil
}

// Steps lists steps for operators; see dedup.Journal.
func (s *Store) Steps(ctx context.Context, f dedup.StepFilter) ([]dedup.StepRecord, error) {
	if err := f.Validate(); err != nil {
		return nil, fmt.Errorf("sqlitestore: steps: %w", err)
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
		where = `state IN (` + strings.Join(marks, ", ") + `)`
	}
	if f.Scope != "" {
		where, args = where+` AND scope = ?`, append(args, f.Scope)
	}
	if f.Key != "" {
		where, args = where+` AND key = ?`, append(args, f.Key)
	}
	rows, err := s.db.QueryContext(ctx, `SELECT `+stepCols+` FROM `+s.stepsTable()+` WHERE `+where+`
ORDER BY first_attempt_at, scope, key, step LIMIT ?`, append(args, limit)...)
	if err != nil {
		return nil, s.wrap("steps", err)
	}
	defer rows.Close()
	var recs []dedup.StepRecord
	for rows.Next() {
		rec, err := scanStep(rows)
		if err != nil {
			return nil, s.wrap("steps", err)
		}
		recs = append(recs, rec)
	}
	return recs, s.wrap("steps", rows.Err())
}

// LiveSteps returns the steps of keys that are not failed, read in tx in
// one statement; see dedup.TxSteps.
func (s *Store) LiveSteps(ctx context.Context, tx *sql.Tx, keys []dedup.Key) ([]dedup.StepRecord, error) {
	var where strings.Builder
	args := make([]any, 0, 2*len(keys))
	seen := make(map[dedup.Key]int, len(keys)) // a key's records, once read
	for _, k := range keys {
		if err := k.Validate(); err != nil {
			return nil, fmt.Errorf("sqlitestore: live steps: %w", err)
		}
		if _, ok := seen[k]; ok {
			continue
		}
		seen[k] = 0
		if len(args) > 0 {
			where.WriteString(" OR ")
		}
		where.WriteString("(scope = ? AND key = ?)")
		args = append(args, k.Scope, k.ID)
	}
	if len(args) == 0 {
		return nil, nil
	}
	rows, err := tx.QueryContext(ctx, "SELECT "+stepCols+" FROM "+s.stepsTable()+" WHERE state <> 'failed' AND ("+where.String()+
		") ORDER BY first_attempt_at, step", args...)
	if err != nil {
		return nil, s.wrap("live steps", err)
	}
	defer rows.Close()
	var recs []dedup.StepRecord
	for rows.Next() {
		rec, err := scanStep(rows)
		if err != nil {
			return nil, s.wrap("live steps", err)
		}
		if seen[rec.Ref.Key]++; seen[rec.Ref.Key] <= dedup.LiveStepsPerKey {
			recs = append(recs, rec)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, s.wrap("live steps", err)
	}
	return recs, nil
}

// CountSteps counts steps by state; see dedup.Journal. StepPending counts
// the steps whose lease runs, expiredPending the others.
func (s *Store) CountSteps(ctx context.Context) (map[dedup.StepState]int64, int64, error) {
	byState, expired, err := rowscan.StepCounts(s.db.QueryContext(ctx, `SELECT state, state = 'pending' AND lease_expires_at <= `+nowMillis+`, count(*)
FROM `+s.stepsTable()+` GROUP BY 1, 2`))
	if err != nil {
		return nil, 0, s.wrap("count steps", err)
	}
	return byState, expired, nil
}

// purgeSteps deletes, in Purge's transaction tx, the succeeded and failed
// steps of the keys whose rows it deleted.
func (s *Store) purgeSteps(ctx context.Context, tx *sql.Tx, keys []dedup.Key) (int, error) {
	n := 0
	for _, k := range keys {
		res, err := tx.ExecContext(ctx, `DELETE FROM `+s.stepsTable()+` WHERE scope = ? AND key = ? AND state IN ('succeeded', 'failed')`, k.Scope, k.ID)
		if err != nil {
			return n, s.wrap("purge steps", err)
		}
		m, err := res.RowsAffected()
		if err != nil {
			return n, s.wrap("purge steps", err)
		}
		n += int(m)
	}
	return n, nil
}

var _ dedup.TxSteps[*sql.Tx] = (*Store)(nil)
