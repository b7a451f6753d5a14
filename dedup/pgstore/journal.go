package pgstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/internal/storekit/rowscan"
)

// The effect journal (dedup.Journal) is the table <Table>_steps (migration
// 007): one row per (scope, key, step). Every method is one short
// transaction of its own, committed before it returns.
//
// BeginStep is one round trip: an INSERT … ON CONFLICT DO UPDATE whose
// WHERE lets it take over only a step whose lease ended (pending, or
// unknown), then a SELECT of the row, sent together in one implicit
// transaction. Two callers beginning a new step at once: the second
// INSERT waits for the first to commit and then finds its row, with its
// lease running: busy. Two callers beginning a step whose lease ended: the
// second waits for the first's row lock, then evaluates the WHERE again
// on the row the first left, whose new lease runs: busy. The conflicting
// row stays locked by the upsert even when its WHERE does not hold, so the
// SELECT after it reads the row as the upsert judged it. xmax = 0 tells an
// inserted row from an updated one: an upsert that updates leaves its
// transaction ID in the new row's xmax (the row lock it took first).
//
// Tokens come from pg_current_xact_id, as the request leases' do
// (requests.go): they only grow, also across a purge of the step.

// ErrDistributedJournal: the effect journal of a store in distributed
// mode. Its fencing tokens are transaction IDs (pg_current_xact_id),
// which CockroachDB and YugabyteDB do not give. Keep the journal in a
// Store without Distributed. It wraps dedup.ErrNoJournal.
var ErrDistributedJournal = fmt.Errorf("%w (pgstore with Distributed): its tokens need pg_current_xact_id, which Config.Distributed does without: keep the journal in a Store without Distributed", dedup.ErrNoJournal)

// stepQueries are a store's journal statements, built once for its table.
type stepQueries struct {
	begin, get, attempt, finish, resolve, count string
	list, listStates, listKey, listKeyStates    string // Steps: by scope, and by scope and key
	live                                        string // LiveSteps: of many keys, in a transaction
}

// stepCols are a step's columns as scanStep reads them, with the
// durations computed by the database's clock, in microseconds.
const stepCols = `scope, key, step, state, provider_key, fingerprint, attempts, token, lease_expires_at,
    first_attempt_at, last_attempt_at, result, error, updated_at,
    (extract(epoch FROM lease_expires_at - now()) * 1000000)::bigint,
    (extract(epoch FROM now() - first_attempt_at) * 1000000)::bigint,
    (extract(epoch FROM now() - last_attempt_at) * 1000000)::bigint`

// stepLease is the end of a lease of $5 µs from now.
const stepLease = `now() + $5::bigint * interval '1 microsecond'`

// openSteps says which steps are unresolved: unknown, in doubt, and
// pending with the lease run out.
const openSteps = `(state IN ('unknown', 'in_doubt') OR state = 'pending' AND lease_expires_at <= now())`

func newStepQueries(t string) stepQueries {
	pk := `scope = $1 AND key = $2 AND step = $3`
	return stepQueries{
		begin: `INSERT INTO ` + t + ` AS s (scope, key, step, state, provider_key, fingerprint, attempts, token,
    lease_expires_at, first_attempt_at, last_attempt_at, updated_at)
VALUES ($1, $2, $3, 'pending', $4, $6, 1, ` + tokenSQL + `, ` + stepLease + `, now(), now(), now())
ON CONFLICT (scope, key, step) DO UPDATE
SET token = greatest(s.token + 1, ` + tokenSQL + `), lease_expires_at = ` + stepLease + `, updated_at = now()
WHERE s.state IN ('pending', 'unknown') AND s.lease_expires_at <= now()
    AND (s.fingerprint IS NULL OR $6::bytea IS NULL OR s.fingerprint = $6)
RETURNING s.xmax = 0, ` + stepCols,
		get: `SELECT ` + stepCols + ` FROM ` + t + ` WHERE ` + pk,
		attempt: `UPDATE ` + t + `
SET attempts = attempts + 1, last_attempt_at = now(), state = 'pending', lease_expires_at = ` + stepLease + `, updated_at = now()
WHERE ` + pk + ` AND token = $4 AND state IN ('pending', 'unknown')
RETURNING ` + stepCols,
		finish: `UPDATE ` + t + `
SET state = $5, result = $6, error = $7, lease_expires_at = now(), updated_at = now()
WHERE ` + pk + ` AND token = $4 AND state IN ('pending', 'unknown')`,
		resolve: `UPDATE ` + t + `
SET state = $5, result = $6, error = $7, token = greatest(token + 1, ` + tokenSQL + `), lease_expires_at = now(), updated_at = now()
WHERE ` + pk + ` AND ($4::bigint = 0 OR token = $4) AND ` + openSteps,
		list: `SELECT ` + stepCols + ` FROM ` + t + `
WHERE ($1::text = '' OR scope = $1) AND ` + openSteps + `
ORDER BY first_attempt_at, scope, key, step LIMIT $2`,
		listStates: `SELECT ` + stepCols + ` FROM ` + t + `
WHERE ($1::text = '' OR scope = $1) AND state = ANY ($3::text[])
ORDER BY first_attempt_at, scope, key, step LIMIT $2`,
		listKey: `SELECT ` + stepCols + ` FROM ` + t + `
WHERE scope = $1 AND key = $3 AND ` + openSteps + `
ORDER BY first_attempt_at, step LIMIT $2`,
		listKeyStates: `SELECT ` + stepCols + ` FROM ` + t + `
WHERE scope = $1 AND key = $3 AND state = ANY ($4::text[])
ORDER BY first_attempt_at, step LIMIT $2`,
		count: `SELECT state, state = 'pending' AND lease_expires_at <= now(), count(*) FROM ` + t + ` GROUP BY 1, 2`,
		live: `SELECT s.* FROM unnest($1::text[], $2::text[]) AS k(scope, key)
CROSS JOIN LATERAL (SELECT ` + stepCols + ` FROM ` + t + `
    WHERE scope = k.scope AND key = k.key AND state <> 'failed'
    ORDER BY first_attempt_at, step LIMIT ` + strconv.Itoa(dedup.LiveStepsPerKey) + `) s`,
	}
}

// scanStep reads a row of stepCols into a record.
func scanStep(row pgx.Row, dest ...any) (dedup.StepRecord, error) {
	var (
		rec                   dedup.StepRecord
		state                 string
		fp                    []byte
		left, sinceF, sinceL  int64
		lease, first, last, u time.Time
	)
	err := row.Scan(append(dest, &rec.Ref.Key.Scope, &rec.Ref.Key.ID, &rec.Ref.Step, &state, &rec.ProviderKey, &fp, &rec.Attempts, &rec.Token,
		&lease, &first, &last, &rec.Result, &rec.Error, &u, &left, &sinceF, &sinceL)...)
	if err != nil {
		return rec, err
	}
	if rec.State, err = dedup.ParseStepState(state); err != nil {
		return rec, fmt.Errorf("pgstore: step %s/%s: %w", rec.Ref.Key, rec.Ref.Step, err)
	}
	copy(rec.Fingerprint[:], fp) // NULL: none
	rec.LeaseExpires, rec.FirstAttemptAt, rec.LastAttemptAt, rec.UpdatedAt = lease, first, last, u
	rec.LeaseLeft = time.Duration(left) * time.Microsecond
	rec.SinceFirstAttempt = time.Duration(sinceF) * time.Microsecond
	rec.SinceLastAttempt = time.Duration(sinceL) * time.Microsecond
	return rec, nil
}

// stepArgs are a step's primary key, after checking the ref.
func (s *Store) stepArgs(ref dedup.StepRef) ([]any, error) {
	if s.cfg.Distributed {
		return nil, ErrDistributedJournal
	}
	if err := ref.Validate(); err != nil {
		return nil, err
	}
	return []any{ref.Key.Scope, ref.Key.ID, ref.Step}, nil
}

func micros(d time.Duration) (int64, error) {
	if d <= 0 {
		return 0, fmt.Errorf("pgstore: a step's lease must be positive, not %v", d)
	}
	return max(d.Microseconds(), 1), nil
}

// BeginStep takes ref for one call; see dedup.Journal.
func (s *Store) BeginStep(ctx context.Context, ref dedup.StepRef, providerKey string, fp dedup.Fingerprint, lease time.Duration) (dedup.StepRecord, error) {
	args, err := s.stepArgs(ref)
	if err != nil {
		return dedup.StepRecord{}, err
	}
	us, err := micros(lease)
	if err != nil {
		return dedup.StepRecord{}, err
	}
	var b pgx.Batch
	var fpArg []byte // NULL: none
	if !fp.IsZero() {
		fpArg = fp[:]
	}
	b.Queue(s.steps.begin, append(args, providerKey, us, fpArg)...)
	b.Queue(s.steps.get, args...)
	br := s.pool.SendBatch(ctx, &b)
	defer br.Close()
	var created bool
	rec, err := scanStep(br.QueryRow(), &created)
	switch {
	case err == nil && created:
		rec.Verdict = dedup.StepCall
	case err == nil:
		rec.Verdict = dedup.StepResolve
	case errors.Is(err, pgx.ErrNoRows):
		// Busy, done or begun for another payload: the row as the upsert
		// found it, locked.
		if rec, err = scanStep(br.QueryRow()); err != nil {
			return rec, fmt.Errorf("pgstore: begin step: %w", err)
		}
		switch {
		case rec.Fingerprint.Mismatches(fp):
			rec.Verdict = dedup.StepMismatch
		case rec.State == dedup.StepPending, rec.State == dedup.StepUnknown:
			rec.Verdict = dedup.StepBusy
		default:
			rec.Verdict = dedup.StepDone
		}
	default:
		return rec, fmt.Errorf("pgstore: begin step: %w", err)
	}
	if err := br.Close(); err != nil {
		return rec, fmt.Errorf("pgstore: begin step: %w", err)
	}
	return rec, nil
}

// AttemptStep records another request of the holder of token; see
// dedup.Journal.
func (s *Store) AttemptStep(ctx context.Context, ref dedup.StepRef, token int64, lease time.Duration) (dedup.StepRecord, error) {
	args, err := s.stepArgs(ref)
	if err != nil {
		return dedup.StepRecord{}, err
	}
	us, err := micros(lease)
	if err != nil {
		return dedup.StepRecord{}, err
	}
	rec, err := scanStep(s.pool.QueryRow(ctx, s.steps.attempt, append(args, token, us)...))
	if errors.Is(err, pgx.ErrNoRows) {
		return rec, fmt.Errorf("%w: step %s/%s, token %d", dedup.ErrLeaseLost, ref.Key, ref.Step, token)
	}
	if err != nil {
		return rec, fmt.Errorf("pgstore: attempt step: %w", err)
	}
	return rec, nil
}

// FinishStep records the outcome of the holder of token; see
// dedup.Journal.
func (s *Store) FinishStep(ctx context.Context, ref dedup.StepRef, token int64, out dedup.StepOutcome) error {
	args, err := s.stepArgs(ref)
	if err != nil {
		return err
	}
	switch out.State {
	case dedup.StepSucceeded, dedup.StepFailed, dedup.StepUnknown, dedup.StepInDoubt:
	default:
		return fmt.Errorf("pgstore: finish step: an outcome is succeeded, failed, unknown or in_doubt, not %v", out.State)
	}
	tag, err := s.pool.Exec(ctx, s.steps.finish, append(args, token, out.State.String(), out.Result, out.Error)...)
	if err != nil {
		return fmt.Errorf("pgstore: finish step: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("%w: step %s/%s, token %d", dedup.ErrLeaseLost, ref.Key, ref.Step, token)
	}
	return nil
}

// ResolveStep records an operator's resolution of an unresolved step; see
// dedup.Journal.
func (s *Store) ResolveStep(ctx context.Context, ref dedup.StepRef, token int64, out dedup.StepOutcome) (bool, error) {
	args, err := s.stepArgs(ref)
	if err != nil {
		return false, err
	}
	if out.State != dedup.StepSucceeded && out.State != dedup.StepFailed {
		return false, fmt.Errorf("pgstore: resolve step: a resolution is succeeded or failed, not %v", out.State)
	}
	tag, err := s.pool.Exec(ctx, s.steps.resolve, append(args, token, out.State.String(), out.Result, out.Error)...)
	if err != nil {
		return false, fmt.Errorf("pgstore: resolve step: %w", err)
	}
	return tag.RowsAffected() == 1, nil
}

// Step returns ref's record; see dedup.Journal.
func (s *Store) Step(ctx context.Context, ref dedup.StepRef) (dedup.StepRecord, bool, error) {
	args, err := s.stepArgs(ref)
	if err != nil {
		return dedup.StepRecord{}, false, err
	}
	rec, err := scanStep(s.pool.QueryRow(ctx, s.steps.get, args...))
	if errors.Is(err, pgx.ErrNoRows) {
		return rec, false, nil
	}
	if err != nil {
		return rec, false, fmt.Errorf("pgstore: step: %w", err)
	}
	return rec, true, nil
}

// Steps lists steps for operators; see dedup.Journal.
func (s *Store) Steps(ctx context.Context, f dedup.StepFilter) ([]dedup.StepRecord, error) {
	if s.cfg.Distributed {
		return nil, ErrDistributedJournal
	}
	if err := f.Validate(); err != nil {
		return nil, fmt.Errorf("pgstore: steps: %w", err)
	}
	limit := f.Limit
	if limit <= 0 {
		limit = 100
	}
	q, qStates, args := s.steps.list, s.steps.listStates, []any{f.Scope, limit}
	if f.Key != "" {
		q, qStates, args = s.steps.listKey, s.steps.listKeyStates, append(args, f.Key)
	}
	if len(f.States) > 0 {
		states := make([]string, len(f.States))
		for i, st := range f.States {
			states[i] = st.String()
		}
		q, args = qStates, append(args, states)
	}
	rows, err := s.pool.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("pgstore: steps: %w", err)
	}
	defer rows.Close()
	var recs []dedup.StepRecord
	for rows.Next() {
		rec, err := scanStep(rows)
		if err != nil {
			return nil, fmt.Errorf("pgstore: steps: %w", err)
		}
		recs = append(recs, rec)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("pgstore: steps: %w", err)
	}
	return recs, nil
}

// LiveSteps returns the steps of keys that are not failed, read in tx in
// one statement (each key's rows found by the primary key's index); see
// dedup.TxSteps. In distributed mode: ErrDistributedJournal, before any
// statement.
func (s *Store) LiveSteps(ctx context.Context, tx pgx.Tx, keys []dedup.Key) ([]dedup.StepRecord, error) {
	if s.cfg.Distributed {
		return nil, ErrDistributedJournal
	}
	scopes, ids := make([]string, 0, len(keys)), make([]string, 0, len(keys))
	seen := make(map[dedup.Key]bool, len(keys))
	for _, k := range keys {
		if err := k.Validate(); err != nil {
			return nil, fmt.Errorf("pgstore: live steps: %w", err)
		}
		if !seen[k] {
			seen[k] = true
			scopes, ids = append(scopes, k.Scope), append(ids, k.ID)
		}
	}
	if len(ids) == 0 {
		return nil, nil
	}
	rows, err := tx.Query(ctx, s.steps.live, scopes, ids)
	if err != nil {
		return nil, fmt.Errorf("pgstore: live steps: %w", err)
	}
	defer rows.Close()
	var recs []dedup.StepRecord
	for rows.Next() {
		rec, err := scanStep(rows)
		if err != nil {
			return nil, fmt.Errorf("pgstore: live steps: %w", err)
		}
		recs = append(recs, rec)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("pgstore: live steps: %w", err)
	}
	return recs, nil
}

// CountSteps counts steps by state; see dedup.Journal. StepPending counts
// the steps whose lease runs, expiredPending the others.
func (s *Store) CountSteps(ctx context.Context) (map[dedup.StepState]int64, int64, error) {
	if s.cfg.Distributed {
		return nil, 0, ErrDistributedJournal
	}
	byState, expired, err := rowscan.StepCounts(s.pool.Query(ctx, s.steps.count))
	if err != nil {
		return nil, 0, fmt.Errorf("pgstore: count steps: %w", err)
	}
	return byState, expired, nil
}

// purgeWithSteps turns del, a DELETE of expired key rows, into one
// statement that also deletes the succeeded and failed steps of the keys
// it deletes, and returns the count of both.
func purgeWithSteps(del, steps string) string {
	return `WITH k AS (` + del + ` RETURNING scope, key),
s AS (DELETE FROM ` + steps + ` s USING k WHERE s.scope = k.scope AND s.key = k.key AND s.state IN ('succeeded', 'failed') RETURNING 1)
SELECT (SELECT count(*) FROM k) + (SELECT count(*) FROM s)`
}

// dropStepsOf deletes the succeeded and failed steps of the keys of the
// detached partition q: it runs in the transaction that drops q.
func (s *Store) dropStepsOf(q string) string {
	return `DELETE FROM ` + s.stepTab + ` s USING ` + q + ` d WHERE s.scope = d.scope AND s.key = d.key AND s.state IN ('succeeded', 'failed')`
}

var _ dedup.TxSteps[pgx.Tx] = (*Store)(nil)
