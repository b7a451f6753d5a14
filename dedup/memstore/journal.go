package memstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/idemkit/idem/dedup"
)

// step is one row of the effect journal; see dedup.Journal.
type step struct {
	state        dedup.StepState
	providerKey  string
	fingerprint  dedup.Fingerprint
	attempts     int
	token        int64
	leaseExpires time.Time
	firstAttempt time.Time
	lastAttempt  time.Time
	result       []byte
	err          string
	updated      time.Time
}

// nextToken returns a fencing token: one counter for the whole journal,
// so that a token is larger than every token before it; s.mu is held.
func (s *Store) nextToken() int64 {
	s.lastToken++
	return s.lastToken
}

func (s *Store) record(ref dedup.StepRef, st *step, now time.Time) dedup.StepRecord {
	r := dedup.StepRecord{
		Ref:               ref,
		State:             st.state,
		ProviderKey:       st.providerKey,
		Fingerprint:       st.fingerprint,
		Attempts:          st.attempts,
		Token:             st.token,
		LeaseExpires:      st.leaseExpires,
		FirstAttemptAt:    st.firstAttempt,
		LastAttemptAt:     st.lastAttempt,
		SinceFirstAttempt: now.Sub(st.firstAttempt),
		SinceLastAttempt:  now.Sub(st.lastAttempt),
		Result:            slices.Clone(st.result),
		Error:             st.err,
		UpdatedAt:         st.updated,
	}
	if !st.leaseExpires.IsZero() {
		r.LeaseLeft = st.leaseExpires.Sub(now)
	}
	return r
}

// leaseRuns reports whether a holder's lease runs at now: a pending step
// under its lease, or an unknown one a resolver holds.
func leaseRuns(st *step, now time.Time) bool {
	return (st.state == dedup.StepPending || st.state == dedup.StepUnknown) && st.leaseExpires.After(now)
}

func final(st dedup.StepState) bool {
	return st == dedup.StepSucceeded || st == dedup.StepFailed || st == dedup.StepInDoubt
}

func checkLease(lease time.Duration) error {
	if lease <= 0 {
		return fmt.Errorf("memstore: a step's lease must be positive, got %v", lease)
	}
	return nil
}

// BeginStep takes ref for one call; see dedup.Journal.
func (s *Store) BeginStep(ctx context.Context, ref dedup.StepRef, providerKey string, fp dedup.Fingerprint, lease time.Duration) (dedup.StepRecord, error) {
	if err := ctx.Err(); err != nil {
		return dedup.StepRecord{}, err
	}
	if err := ref.Validate(); err != nil {
		return dedup.StepRecord{}, err
	}
	if err := checkLease(lease); err != nil {
		return dedup.StepRecord{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.cfg.Now()
	st, ok := s.steps[ref]
	switch {
	case !ok:
		if providerKey == "" {
			return dedup.StepRecord{}, errors.New("memstore: a new step needs a provider key")
		}
		st = &step{state: dedup.StepPending, providerKey: providerKey, fingerprint: fp, attempts: 1, token: s.nextToken(),
			leaseExpires: now.Add(lease), firstAttempt: now, lastAttempt: now, updated: now}
		s.steps[ref] = st
		r := s.record(ref, st, now)
		r.Verdict = dedup.StepCall
		return r, nil
	case st.fingerprint.Mismatches(fp):
		r := s.record(ref, st, now)
		r.Verdict = dedup.StepMismatch
		return r, nil
	case final(st.state):
		r := s.record(ref, st, now)
		r.Verdict = dedup.StepDone
		return r, nil
	case leaseRuns(st, now):
		r := s.record(ref, st, now)
		r.Verdict = dedup.StepBusy
		return r, nil
	default: // unknown, or pending with its lease run out
		st.token = s.nextToken()
		st.leaseExpires = now.Add(lease)
		st.updated = now
		r := s.record(ref, st, now)
		r.Verdict = dedup.StepResolve
		return r, nil
	}
}

// held returns ref's step when token holds it and it is not final.
func (s *Store) held(ref dedup.StepRef, token int64) (*step, error) {
	st, ok := s.steps[ref]
	if !ok {
		return nil, fmt.Errorf("%w: step %q of %s has no record", dedup.ErrLeaseLost, ref.Step, ref.Key)
	}
	if st.token != token {
		return nil, fmt.Errorf("%w: step %q of %s is held by token %d, not %d", dedup.ErrLeaseLost, ref.Step, ref.Key, st.token, token)
	}
	if final(st.state) {
		return nil, fmt.Errorf("%w: step %q of %s is %s already", dedup.ErrLeaseLost, ref.Step, ref.Key, st.state)
	}
	return st, nil
}

// AttemptStep records another request of the holder of token; see
// dedup.Journal.
func (s *Store) AttemptStep(ctx context.Context, ref dedup.StepRef, token int64, lease time.Duration) (dedup.StepRecord, error) {
	if err := ctx.Err(); err != nil {
		return dedup.StepRecord{}, err
	}
	if err := ref.Validate(); err != nil {
		return dedup.StepRecord{}, err
	}
	if err := checkLease(lease); err != nil {
		return dedup.StepRecord{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	st, err := s.held(ref, token)
	if err != nil {
		return dedup.StepRecord{}, err
	}
	now := s.cfg.Now()
	st.attempts++
	st.lastAttempt = now
	st.state = dedup.StepPending
	st.leaseExpires = now.Add(lease)
	st.updated = now
	return s.record(ref, st, now), nil
}

// FinishStep records the outcome of the holder of token; see dedup.Journal.
func (s *Store) FinishStep(ctx context.Context, ref dedup.StepRef, token int64, out dedup.StepOutcome) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := ref.Validate(); err != nil {
		return err
	}
	switch out.State {
	case dedup.StepSucceeded, dedup.StepFailed, dedup.StepUnknown, dedup.StepInDoubt:
	default:
		return fmt.Errorf("memstore: FinishStep records succeeded, failed, unknown or in_doubt, not %s", out.State)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	st, err := s.held(ref, token)
	if err != nil {
		return err
	}
	now := s.cfg.Now()
	st.state = out.State
	st.result = slices.Clone(out.Result)
	st.err = out.Error
	st.leaseExpires = time.Time{}
	st.updated = now
	return nil
}

// ResolveStep is an operator's resolution of an unresolved step; see
// dedup.Journal.
func (s *Store) ResolveStep(ctx context.Context, ref dedup.StepRef, token int64, out dedup.StepOutcome) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	if err := ref.Validate(); err != nil {
		return false, err
	}
	if out.State != dedup.StepSucceeded && out.State != dedup.StepFailed {
		return false, fmt.Errorf("memstore: ResolveStep records succeeded or failed, not %s", out.State)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	st, ok := s.steps[ref]
	if !ok {
		return false, nil
	}
	now := s.cfg.Now()
	if st.state == dedup.StepSucceeded || st.state == dedup.StepFailed || leaseRuns(st, now) {
		return false, nil
	}
	if token > 0 && st.token != token {
		return false, nil
	}
	st.token = s.nextToken()
	st.state = out.State
	st.result = slices.Clone(out.Result)
	st.err = out.Error
	st.leaseExpires = time.Time{}
	st.updated = now
	return true, nil
}

// Step returns ref's record; see dedup.Journal.
func (s *Store) Step(ctx context.Context, ref dedup.StepRef) (dedup.StepRecord, bool, error) {
	if err := ctx.Err(); err != nil {
		return dedup.StepRecord{}, false, err
	}
	if err := ref.Validate(); err != nil {
		return dedup.StepRecord{}, false, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	st, ok := s.steps[ref]
	if !ok {
		return dedup.StepRecord{}, false, nil
	}
	return s.record(ref, st, s.cfg.Now()), true, nil
}

// unresolved reports whether an operator should look at st: unknown, in
// doubt, or pending with its lease run out.
func unresolved(st *step, now time.Time) bool {
	switch st.state {
	case dedup.StepUnknown, dedup.StepInDoubt:
		return true
	case dedup.StepPending:
		return !st.leaseExpires.After(now)
	}
	return false
}

// Steps lists steps for operators; see dedup.Journal.
func (s *Store) Steps(ctx context.Context, f dedup.StepFilter) ([]dedup.StepRecord, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := f.Validate(); err != nil {
		return nil, fmt.Errorf("memstore: steps: %w", err)
	}
	limit := f.Limit
	if limit <= 0 {
		limit = 100
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.cfg.Now()
	var out []dedup.StepRecord
	for ref, st := range s.steps {
		if f.Scope != "" && ref.Key.Scope != f.Scope || f.Key != "" && ref.Key.ID != f.Key {
			continue
		}
		if len(f.States) == 0 && !unresolved(st, now) || len(f.States) > 0 && !slices.Contains(f.States, st.state) {
			continue
		}
		out = append(out, s.record(ref, st, now))
	}
	slices.SortFunc(out, func(a, b dedup.StepRecord) int {
		return cmp.Or(a.FirstAttemptAt.Compare(b.FirstAttemptAt),
			cmp.Compare(a.Ref.Key.Scope, b.Ref.Key.Scope), cmp.Compare(a.Ref.Key.ID, b.Ref.Key.ID), cmp.Compare(a.Ref.Step, b.Ref.Step))
	})
	if len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

// LiveSteps returns the steps of keys that are not failed; see
// dedup.TxSteps. The journal commits each step at once, so tx sees what
// any other caller sees.
func (s *Store) LiveSteps(ctx context.Context, tx *Tx, keys []dedup.Key) ([]dedup.StepRecord, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if tx.finished {
		return nil, errors.New("memstore: transaction is finished")
	}
	want := make(map[dedup.Key]bool, len(keys))
	for _, k := range keys {
		if err := k.Validate(); err != nil {
			return nil, fmt.Errorf("memstore: live steps: %w", err)
		}
		want[k] = true
	}
	if len(want) == 0 {
		return nil, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.cfg.Now()
	var out []dedup.StepRecord
	for ref, st := range s.steps {
		if want[ref.Key] && st.state != dedup.StepFailed {
			out = append(out, s.record(ref, st, now))
		}
	}
	slices.SortFunc(out, func(a, b dedup.StepRecord) int {
		return cmp.Or(cmp.Compare(a.Ref.Key.Scope, b.Ref.Key.Scope), cmp.Compare(a.Ref.Key.ID, b.Ref.Key.ID),
			a.FirstAttemptAt.Compare(b.FirstAttemptAt), cmp.Compare(a.Ref.Step, b.Ref.Step))
	})
	perKey := make(map[dedup.Key]int, len(want))
	kept := out[:0]
	for _, r := range out {
		if perKey[r.Ref.Key]++; perKey[r.Ref.Key] <= dedup.LiveStepsPerKey {
			kept = append(kept, r)
		}
	}
	return kept, nil
}

// CountSteps counts steps by state; see dedup.Journal.
func (s *Store) CountSteps(ctx context.Context) (map[dedup.StepState]int64, int64, error) {
	if err := ctx.Err(); err != nil {
		return nil, 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.cfg.Now()
	by, expired := make(map[dedup.StepState]int64), int64(0)
	for _, st := range s.steps {
		if st.state == dedup.StepPending && !st.leaseExpires.After(now) {
			expired++ // counted apart, not as pending
			continue
		}
		by[st.state]++
	}
	return by, expired, nil
}

// purgeSteps deletes the succeeded and failed steps of the keys whose
// rows Purge deleted; s.mu is held.
func (s *Store) purgeSteps(gone map[dedup.Key]bool) int {
	if len(gone) == 0 {
		return 0
	}
	n := 0
	for ref, st := range s.steps {
		if gone[ref.Key] && (st.state == dedup.StepSucceeded || st.state == dedup.StepFailed) {
			delete(s.steps, ref)
			n++
		}
	}
	return n
}

var _ dedup.TxSteps[*Tx] = (*Store)(nil)
