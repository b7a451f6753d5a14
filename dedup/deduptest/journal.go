package deduptest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/dedup"
)

// JournalFactory returns a fresh, empty, migrated store's journal for one
// test, cleaned up by t.Cleanup. The journal must be a dedup.Purger too,
// with cfg's ScopeRetention; cfg.LockTimeout is as in Factory.
type JournalFactory func(t *testing.T, cfg Config) dedup.Journal

// RunJournal runs the conformance suite of dedup.Journal: every sentence
// of its contract — new, busy, done and unknown steps, leases run out,
// fencing tokens on every write, operators' resolutions, the listing and
// the counts, concurrent holders, the store's clock, Purge, and a step
// asked for by another payload than the one that began it.
func RunJournal(t *testing.T, newJournal JournalFactory) {
	s := journalSuite{newJournal: newJournal}
	t.Run("NewStepCall", s.newStep)
	t.Run("RunningLeaseBusy", s.busy)
	t.Run("OutcomesDone", s.done)
	t.Run("UnknownResolve", s.unknownResolve)
	t.Run("LeaseRunOutResolve", s.leaseRunOut)
	t.Run("AttemptStepRenewsLease", s.attemptRenews)
	t.Run("StaleTokensRefused", s.staleTokens)
	t.Run("ResolveStep", s.resolveStep)
	t.Run("StepsAndCounts", s.stepsAndCounts)
	t.Run("StepsOfOneKey", s.stepsOfOneKey)
	t.Run("ConcurrentHoldersOneAtATime", s.concurrentHolders)
	t.Run("StoreClock", s.storeClock)
	t.Run("PurgeKeepsUnresolved", s.purge)
	t.Run("FingerprintMismatch", s.fingerprintMismatch)
}

type journalSuite struct{ newJournal JournalFactory }

// failureRecorder is the part of a dedup.Store the purge test writes key
// rows with: a journal's store is a dedup.Store.
type failureRecorder interface {
	RecordFailure(ctx context.Context, c dedup.Claim, reason string) error
}

func (s journalSuite) journal(t *testing.T, cfg Config) dedup.Journal {
	t.Helper()
	if cfg.LockTimeout == 0 {
		cfg.LockTimeout = 5 * time.Second
	}
	j := s.newJournal(t, cfg)
	if j == nil {
		t.Fatal("deduptest: the factory returned no journal")
	}
	return j
}

// Step names step of key id in scope.
func Step(scope, id, step string) dedup.StepRef {
	return dedup.StepRef{Key: dedup.Key{Scope: scope, ID: id}, Step: step}
}

func begin(t *testing.T, j dedup.Journal, ref dedup.StepRef, providerKey string, lease time.Duration, want dedup.StepVerdict) dedup.StepRecord {
	t.Helper()
	return beginFor(t, j, ref, providerKey, dedup.Fingerprint{}, lease, want)
}

// beginFor is begin for a request with fingerprint fp.
func beginFor(t *testing.T, j dedup.Journal, ref dedup.StepRef, providerKey string, fp dedup.Fingerprint, lease time.Duration, want dedup.StepVerdict) dedup.StepRecord {
	t.Helper()
	rec, err := j.BeginStep(ctxFor(t), ref, providerKey, fp, lease)
	if err != nil {
		t.Fatalf("BeginStep %v: %v", ref, err)
	}
	if rec.Verdict != want {
		t.Fatalf("BeginStep %v: verdict %v, want %v (%+v)", ref, rec.Verdict, want, rec)
	}
	if rec.Ref != ref {
		t.Fatalf("BeginStep %v: record of %v", ref, rec.Ref)
	}
	return rec
}

func finish(t *testing.T, j dedup.Journal, ref dedup.StepRef, token int64, out dedup.StepOutcome) {
	t.Helper()
	if err := j.FinishStep(ctxFor(t), ref, token, out); err != nil {
		t.Fatalf("FinishStep %v %v with token %d: %v", ref, out.State, token, err)
	}
}

func stepOf(t *testing.T, j dedup.Journal, ref dedup.StepRef) dedup.StepRecord {
	t.Helper()
	rec, ok, err := j.Step(ctxFor(t), ref)
	if err != nil || !ok {
		t.Fatalf("Step %v: %v, found %v", ref, err, ok)
	}
	if rec.Ref != ref {
		t.Fatalf("Step %v: record of %v", ref, rec.Ref)
	}
	return rec
}

func wantLost(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, dedup.ErrLeaseLost) {
		t.Fatalf("%s: %v, want ErrLeaseLost", what, err)
	}
}

// waitLeaseOut polls ref until the store finds its lease run out.
func waitLeaseOut(t *testing.T, j dedup.Journal, ref dedup.StepRef) dedup.StepRecord {
	t.Helper()
	var rec dedup.StepRecord
	eventually(t, fmt.Sprintf("the lease of %v to run out", ref), func() bool {
		rec = stepOf(t, j, ref)
		return rec.LeaseLeft < 0
	})
	return rec
}

// newStep: a new step is recorded pending with attempt 1, the provider
// key, a lease and a token, committed (Step reads it back); the verdict is
// StepCall. A step the journal lacks is not found; a bad ref is refused.
func (s journalSuite) newStep(t *testing.T) {
	j, ctx := s.journal(t, Config{}), ctxFor(t)
	ref := Step("refunds", "order-1", "refund")
	if _, ok, err := j.Step(ctx, ref); err != nil || ok {
		t.Fatalf("Step of a step never begun: found %v, %v", ok, err)
	}
	rec := begin(t, j, ref, "pk-order-1-refund", time.Hour, dedup.StepCall)
	if rec.State != dedup.StepPending || rec.Attempts != 1 || rec.Token <= 0 || rec.ProviderKey != "pk-order-1-refund" {
		t.Fatalf("new step %+v: want pending, attempt 1, a token, the provider key", rec)
	}
	if rec.LeaseLeft <= 0 || rec.LeaseLeft > time.Hour || rec.LeaseExpires.IsZero() {
		t.Fatalf("new step: lease left %v (expires %v), want up to an hour", rec.LeaseLeft, rec.LeaseExpires)
	}
	if rec.FirstAttemptAt.IsZero() || !rec.LastAttemptAt.Equal(rec.FirstAttemptAt) || rec.UpdatedAt.IsZero() {
		t.Fatalf("new step: first attempt %v, last %v, updated %v: want the first attempt's time in both", rec.FirstAttemptAt, rec.LastAttemptAt, rec.UpdatedAt)
	}
	got := stepOf(t, j, ref)
	if got.State != dedup.StepPending || got.Attempts != 1 || got.Token != rec.Token || got.ProviderKey != rec.ProviderKey ||
		!got.FirstAttemptAt.Equal(rec.FirstAttemptAt) || !got.LeaseExpires.Equal(rec.LeaseExpires) {
		t.Fatalf("Step after BeginStep: %+v, want %+v", got, rec)
	}
	// Another step of the same key, and the same step of another key or
	// scope, are steps of their own.
	for _, other := range []dedup.StepRef{Step("refunds", "order-1", "notify"), Step("refunds", "order-2", "refund"), Step("payouts", "order-1", "refund")} {
		o := begin(t, j, other, "pk", time.Hour, dedup.StepCall)
		if o.Token == rec.Token {
			t.Fatalf("step %v got token %d, the token of %v", other, o.Token, ref)
		}
	}
	for _, bad := range []dedup.StepRef{Step("refunds", "order-1", ""), Step("", "order-1", "refund"), Step("refunds", "", "refund")} {
		if _, err := j.BeginStep(ctx, bad, "pk", dedup.Fingerprint{}, time.Hour); err == nil {
			t.Fatalf("BeginStep of %+v: no error, want the ref refused", bad)
		}
	}
}

// busy: while the holder's lease runs, BeginStep answers StepBusy with the
// lease's remaining time, changes nothing, and keeps the first provider
// key.
func (s journalSuite) busy(t *testing.T) {
	j := s.journal(t, Config{})
	ref := Step("refunds", "order-1", "refund")
	a := begin(t, j, ref, "first", time.Hour, dedup.StepCall)
	b := begin(t, j, ref, "second", time.Hour, dedup.StepBusy)
	if b.State != dedup.StepPending || b.Token != a.Token || b.Attempts != 1 || b.ProviderKey != "first" || b.LeaseLeft <= 0 || b.LeaseLeft > time.Hour {
		t.Fatalf("busy %+v: want the holder's record (token %d, attempt 1, provider key \"first\") with its lease left", b, a.Token)
	}
	if got := stepOf(t, j, ref); got.Token != a.Token || got.Attempts != 1 || !got.LeaseExpires.Equal(a.LeaseExpires) {
		t.Fatalf("after a busy BeginStep: %+v, want it unchanged from %+v", got, a)
	}
}

// done: a succeeded, failed or in-doubt step is never handed out again:
// every later BeginStep returns its stored result, and the holder can no
// longer write.
func (s journalSuite) done(t *testing.T) {
	j, ctx := s.journal(t, Config{}), ctxFor(t)
	for _, out := range []dedup.StepOutcome{
		{State: dedup.StepSucceeded, Result: []byte("{\"refund_id\": 7}\x00\xff")},
		{State: dedup.StepFailed, Result: []byte(`{"code":"INSUFFICIENT_FUNDS"}`)},
		{State: dedup.StepInDoubt, Error: "timeout; the provider no longer keeps the key"},
	} {
		ref := Step("refunds", "order-"+out.State.String(), "refund")
		a := begin(t, j, ref, "pk-"+out.State.String(), time.Hour, dedup.StepCall)
		finish(t, j, ref, a.Token, out)
		for i := range 2 {
			d := begin(t, j, ref, "another", time.Hour, dedup.StepDone)
			if d.State != out.State || string(d.Result) != string(out.Result) || d.Error != out.Error ||
				d.Attempts != 1 || d.ProviderKey != "pk-"+out.State.String() || d.Token != a.Token {
				t.Fatalf("BeginStep %d of a %v step: %+v, want the stored outcome %+v, attempt 1, token %d", i+1, out.State, d, out, a.Token)
			}
		}
		wantLost(t, "FinishStep of a "+out.State.String()+" step",
			j.FinishStep(ctx, ref, a.Token, dedup.StepOutcome{State: dedup.StepSucceeded, Result: []byte("again")}))
		_, err := j.AttemptStep(ctx, ref, a.Token, time.Hour)
		wantLost(t, "AttemptStep of a "+out.State.String()+" step", err)
		if got := stepOf(t, j, ref); got.State != out.State || string(got.Result) != string(out.Result) || got.Attempts != 1 {
			t.Fatalf("after refused writes: %+v, want %v with %q", got, out.State, out.Result)
		}
	}
	ref := Step("refunds", "bad", "refund")
	a := begin(t, j, ref, "pk", time.Hour, dedup.StepCall)
	for _, st := range []dedup.StepState{dedup.StepPending, 0, 99} {
		if err := j.FinishStep(ctx, ref, a.Token, dedup.StepOutcome{State: st}); err == nil {
			t.Fatalf("FinishStep with state %v: no error, want it refused", st)
		}
	}
	if got := stepOf(t, j, ref); got.State != dedup.StepPending {
		t.Fatalf("after refused outcomes: %+v, want it still pending", got)
	}
}

// unknownResolve: an unknown outcome ends the lease; the next BeginStep
// takes the step with a larger token for a read-back (state and attempts
// unchanged) and holds it: a third caller is busy. A repeat is recorded
// with AttemptStep, and the outcome then found is final.
func (s journalSuite) unknownResolve(t *testing.T) {
	j := s.journal(t, Config{})
	ref := Step("refunds", "order-1", "refund")
	a := begin(t, j, ref, "pk", time.Hour, dedup.StepCall)
	finish(t, j, ref, a.Token, dedup.StepOutcome{State: dedup.StepUnknown, Error: "read tcp: i/o timeout"})
	u := stepOf(t, j, ref)
	if u.State != dedup.StepUnknown || u.Error != "read tcp: i/o timeout" || u.Token != a.Token || u.LeaseLeft > 0 {
		t.Fatalf("unknown step %+v: want unknown with its error, token %d, no lease running", u, a.Token)
	}
	b := begin(t, j, ref, "other", time.Hour, dedup.StepResolve)
	if b.State != dedup.StepUnknown || b.Attempts != 1 || b.Token <= a.Token || b.ProviderKey != "pk" || b.LeaseLeft <= 0 || b.LeaseLeft > time.Hour {
		t.Fatalf("resolve %+v: want unknown, attempt 1, a token above %d, provider key \"pk\", a new lease", b, a.Token)
	}
	c := begin(t, j, ref, "pk", time.Hour, dedup.StepBusy)
	if c.Token != b.Token {
		t.Fatalf("busy while the resolver holds the step: token %d, want the resolver's %d", c.Token, b.Token)
	}
	r, err := j.AttemptStep(ctxFor(t), ref, b.Token, time.Hour)
	if err != nil {
		t.Fatalf("AttemptStep by the resolver: %v", err)
	}
	if r.State != dedup.StepPending || r.Attempts != 2 || r.Token != b.Token || r.LeaseLeft <= 0 || r.LastAttemptAt.Before(r.FirstAttemptAt) || !r.FirstAttemptAt.Equal(a.FirstAttemptAt) {
		t.Fatalf("repeat %+v: want pending, attempt 2, token %d, a lease, the first attempt's time kept", r, b.Token)
	}
	finish(t, j, ref, b.Token, dedup.StepOutcome{State: dedup.StepSucceeded, Result: []byte("ok")})
	d := begin(t, j, ref, "pk", time.Hour, dedup.StepDone)
	if d.State != dedup.StepSucceeded || string(d.Result) != "ok" || d.Attempts != 2 {
		t.Fatalf("after the repeat succeeded: %+v", d)
	}
}

// leaseRunOut: a holder that died mid-call leaves a pending step whose
// lease runs out; the next BeginStep takes it for a read-back with a
// larger token, the step still pending with its attempts.
func (s journalSuite) leaseRunOut(t *testing.T) {
	j := s.journal(t, Config{})
	ref := Step("refunds", "order-1", "refund")
	a := begin(t, j, ref, "pk", 20*time.Millisecond, dedup.StepCall)
	waitLeaseOut(t, j, ref)
	b := begin(t, j, ref, "other", time.Hour, dedup.StepResolve)
	if b.State != dedup.StepPending || b.Attempts != 1 || b.Token <= a.Token || b.ProviderKey != "pk" || b.LeaseLeft <= 0 || !b.FirstAttemptAt.Equal(a.FirstAttemptAt) {
		t.Fatalf("takeover %+v: want pending, attempt 1, a token above %d, provider key \"pk\", a new lease", b, a.Token)
	}
	begin(t, j, ref, "pk", time.Hour, dedup.StepBusy)
	wantLost(t, "the dead holder's late FinishStep", j.FinishStep(ctxFor(t), ref, a.Token, dedup.StepOutcome{State: dedup.StepSucceeded}))
	finish(t, j, ref, b.Token, dedup.StepOutcome{State: dedup.StepFailed, Result: []byte("no such order")})
	begin(t, j, ref, "pk", time.Hour, dedup.StepDone)
}

// attemptRenews: AttemptStep by the holder grows attempts, moves the last
// attempt's time and gives a new lease from now — also after the old one
// ran out, while no one took the step over.
func (s journalSuite) attemptRenews(t *testing.T) {
	j := s.journal(t, Config{})
	ref := Step("refunds", "order-1", "refund")
	a := begin(t, j, ref, "pk", 20*time.Millisecond, dedup.StepCall)
	waitLeaseOut(t, j, ref)
	r, err := j.AttemptStep(ctxFor(t), ref, a.Token, time.Hour)
	if err != nil {
		t.Fatalf("AttemptStep: %v", err)
	}
	if r.Ref != ref || r.State != dedup.StepPending || r.Attempts != 2 || r.Token != a.Token || r.LeaseLeft <= 0 || !r.LeaseExpires.After(a.LeaseExpires) ||
		!r.LastAttemptAt.After(a.LastAttemptAt) || !r.FirstAttemptAt.Equal(a.FirstAttemptAt) {
		t.Fatalf("AttemptStep %+v after %+v: want attempt 2, the same token, a new lease, a later last attempt", r, a)
	}
	begin(t, j, ref, "pk", time.Hour, dedup.StepBusy)
	r, err = j.AttemptStep(ctxFor(t), ref, a.Token, time.Hour)
	if err != nil || r.Attempts != 3 {
		t.Fatalf("AttemptStep again: %+v, %v; want attempt 3", r, err)
	}
	if got := stepOf(t, j, ref); got.Attempts != 3 || got.State != dedup.StepPending || !got.LeaseExpires.Equal(r.LeaseExpires) {
		t.Fatalf("Step after two repeats: %+v, want attempt 3 and the last lease", got)
	}
}

// staleTokens: every write with a token that is not the step's is refused
// with ErrLeaseLost and changes nothing: a token never given, the token of
// a holder taken over, and any token of a step the journal lacks.
func (s journalSuite) staleTokens(t *testing.T) {
	j, ctx := s.journal(t, Config{}), ctxFor(t)
	ref := Step("refunds", "order-1", "refund")
	a := begin(t, j, ref, "pk", time.Hour, dedup.StepCall)
	missing := Step("refunds", "order-1", "never")
	for _, c := range []struct {
		what  string
		ref   dedup.StepRef
		token int64
	}{{"a token never given", ref, a.Token + 1}, {"token 0", ref, 0}, {"a step never begun", missing, a.Token}} {
		_, err := j.AttemptStep(ctx, c.ref, c.token, time.Hour)
		wantLost(t, "AttemptStep with "+c.what, err)
		wantLost(t, "FinishStep with "+c.what, j.FinishStep(ctx, c.ref, c.token, dedup.StepOutcome{State: dedup.StepSucceeded}))
	}
	if got := stepOf(t, j, ref); got.State != dedup.StepPending || got.Attempts != 1 || got.Token != a.Token {
		t.Fatalf("after refused writes: %+v, want it as begun", got)
	}
	finish(t, j, ref, a.Token, dedup.StepOutcome{State: dedup.StepUnknown, Error: "reset"})
	b := begin(t, j, ref, "pk", time.Hour, dedup.StepResolve)
	_, err := j.AttemptStep(ctx, ref, a.Token, time.Hour)
	wantLost(t, "AttemptStep by the holder taken over", err)
	wantLost(t, "FinishStep by the holder taken over", j.FinishStep(ctx, ref, a.Token, dedup.StepOutcome{State: dedup.StepSucceeded}))
	if got := stepOf(t, j, ref); got.State != dedup.StepUnknown || got.Attempts != 1 || got.Token != b.Token {
		t.Fatalf("after the old holder's writes: %+v, want unknown, attempt 1, token %d", got, b.Token)
	}
}

// resolveStep: an operator resolves only unresolved steps (unknown, in
// doubt, pending with its lease run out), fenced by the token it saw (0:
// whatever holds it); the token grows and the holder is fenced out.
func (s journalSuite) resolveStep(t *testing.T) {
	j, ctx := s.journal(t, Config{}), ctxFor(t)
	resolve := func(ref dedup.StepRef, token int64, out dedup.StepOutcome, want bool) {
		t.Helper()
		ok, err := j.ResolveStep(ctx, ref, token, out)
		if err != nil || ok != want {
			t.Fatalf("ResolveStep %v with token %d as %v: %v, %v; want %v", ref, token, out.State, ok, err, want)
		}
	}
	byOp := dedup.StepOutcome{State: dedup.StepSucceeded, Result: []byte("provider ref 2024-77"), Error: "resolved by alice"}

	// Unknown, with the token the operator saw.
	unknown := Step("refunds", "unknown", "refund")
	a := begin(t, j, unknown, "pk", time.Hour, dedup.StepCall)
	finish(t, j, unknown, a.Token, dedup.StepOutcome{State: dedup.StepUnknown, Error: "timeout"})
	resolve(unknown, a.Token+1, byOp, false)
	got := stepOf(t, j, unknown)
	if got.State != dedup.StepUnknown || got.Token != a.Token {
		t.Fatalf("after refused resolutions: %+v, want it unknown with token %d", got, a.Token)
	}
	resolve(unknown, a.Token, byOp, true)
	got = stepOf(t, j, unknown)
	if got.State != dedup.StepSucceeded || string(got.Result) != string(byOp.Result) || got.Error != byOp.Error || got.Token <= a.Token || got.Attempts != 1 {
		t.Fatalf("resolved %+v: want succeeded with the operator's reference, a token above %d", got, a.Token)
	}
	wantLost(t, "FinishStep by the holder an operator fenced", j.FinishStep(ctx, unknown, a.Token, dedup.StepOutcome{State: dedup.StepFailed}))
	d := begin(t, j, unknown, "pk", time.Hour, dedup.StepDone)
	if d.State != dedup.StepSucceeded || string(d.Result) != string(byOp.Result) {
		t.Fatalf("BeginStep after the resolution: %+v", d)
	}
	resolve(unknown, 0, dedup.StepOutcome{State: dedup.StepFailed}, false) // succeeded: left alone

	// In doubt, with token 0.
	doubt := Step("refunds", "doubt", "refund")
	a = begin(t, j, doubt, "pk", time.Hour, dedup.StepCall)
	finish(t, j, doubt, a.Token, dedup.StepOutcome{State: dedup.StepInDoubt, Error: "key TTL passed"})
	resolve(doubt, 0, dedup.StepOutcome{State: dedup.StepFailed, Error: "resolved by bob"}, true)
	if got := begin(t, j, doubt, "pk", time.Hour, dedup.StepDone); got.State != dedup.StepFailed || got.Token <= a.Token {
		t.Fatalf("in doubt resolved as failed: %+v, want failed with a token above %d", got, a.Token)
	}
	resolve(doubt, 0, byOp, false) // failed: left alone

	// Pending: left alone while its lease runs, resolved once it ran out.
	pending := Step("refunds", "pending", "refund")
	a = begin(t, j, pending, "pk", 20*time.Millisecond, dedup.StepCall)
	live := Step("refunds", "live", "refund")
	l := begin(t, j, live, "pk", time.Hour, dedup.StepCall)
	resolve(live, 0, byOp, false)
	resolve(live, l.Token, byOp, false)
	if got := stepOf(t, j, live); got.State != dedup.StepPending || got.Token != l.Token {
		t.Fatalf("a running step after resolutions: %+v, want it untouched", got)
	}
	waitLeaseOut(t, j, pending)
	resolve(pending, 0, byOp, true)
	if got := stepOf(t, j, pending); got.State != dedup.StepSucceeded || got.Token <= a.Token {
		t.Fatalf("expired pending resolved: %+v, want succeeded with a token above %d", got, a.Token)
	}
	_, err := j.AttemptStep(ctx, pending, a.Token, time.Hour)
	wantLost(t, "AttemptStep by the holder an operator fenced", err)

	resolve(Step("refunds", "never", "refund"), 0, byOp, false)
	// Only succeeded or failed are resolutions.
	u := Step("refunds", "unknown-2", "refund")
	a = begin(t, j, u, "pk", time.Hour, dedup.StepCall)
	finish(t, j, u, a.Token, dedup.StepOutcome{State: dedup.StepUnknown})
	for _, st := range []dedup.StepState{dedup.StepPending, dedup.StepUnknown, dedup.StepInDoubt, 0} {
		if ok, err := j.ResolveStep(ctx, u, 0, dedup.StepOutcome{State: st}); err == nil || ok {
			t.Fatalf("ResolveStep as %v: %v, %v; want an error", st, ok, err)
		}
	}
	if got := stepOf(t, j, u); got.State != dedup.StepUnknown || got.Token != a.Token {
		t.Fatalf("after refused resolutions: %+v, want it unknown with token %d", got, a.Token)
	}
}

// stepsAndCounts: Steps lists the unresolved steps by default (unknown, in
// doubt, pending with the lease run out), or those in the states asked,
// of one scope or all, the oldest first attempt first, at most Limit;
// CountSteps counts every state, the pending steps whose lease ran out
// apart.
func (s journalSuite) stepsAndCounts(t *testing.T) {
	j, ctx := s.journal(t, Config{}), ctxFor(t)
	// In order of first attempt: each begun after the one before.
	refs := map[string]dedup.StepRef{}
	for _, c := range []struct {
		name, scope string
		lease       time.Duration
		out         dedup.StepState // 0: left pending
	}{
		{"expired", "a", 20 * time.Millisecond, 0},
		{"unknown", "b", time.Hour, dedup.StepUnknown},
		{"running", "a", time.Hour, 0},
		{"doubt", "a", time.Hour, dedup.StepInDoubt},
		{"succeeded", "b", time.Hour, dedup.StepSucceeded},
		{"failed", "a", time.Hour, dedup.StepFailed},
		{"unknown-2", "a", time.Hour, dedup.StepUnknown},
	} {
		ref := Step(c.scope, c.name, "call")
		refs[c.name] = ref
		rec := begin(t, j, ref, "pk", c.lease, dedup.StepCall)
		if c.out != 0 {
			finish(t, j, ref, rec.Token, dedup.StepOutcome{State: c.out})
		}
		// The next step's first attempt comes strictly later by the
		// store's clock.
		eventually(t, "the store's clock to move past "+c.name+"'s first attempt", func() bool {
			return stepOf(t, j, ref).SinceFirstAttempt > 0
		})
	}
	waitLeaseOut(t, j, refs["expired"])
	list := func(f dedup.StepFilter, want ...string) {
		t.Helper()
		got, err := j.Steps(ctx, f)
		if err != nil {
			t.Fatalf("Steps(%+v): %v", f, err)
		}
		var names []string
		for _, r := range got {
			names = append(names, r.Ref.Key.ID)
			if r.Ref != refs[r.Ref.Key.ID] || r.State == 0 || r.Token <= 0 || r.ProviderKey != "pk" || r.Attempts != 1 || r.FirstAttemptAt.IsZero() {
				t.Fatalf("Steps(%+v): record %+v, want it whole", f, r)
			}
		}
		if !slices.Equal(names, want) {
			t.Fatalf("Steps(%+v) = %v, want %v", f, names, want)
		}
	}
	list(dedup.StepFilter{}, "expired", "unknown", "doubt", "unknown-2")
	list(dedup.StepFilter{Scope: "a"}, "expired", "doubt", "unknown-2")
	list(dedup.StepFilter{Scope: "b"}, "unknown")
	list(dedup.StepFilter{Scope: "c"})
	list(dedup.StepFilter{Limit: 2}, "expired", "unknown")
	list(dedup.StepFilter{States: []dedup.StepState{dedup.StepPending}}, "expired", "running")
	list(dedup.StepFilter{States: []dedup.StepState{dedup.StepSucceeded, dedup.StepFailed}}, "succeeded", "failed")
	list(dedup.StepFilter{States: []dedup.StepState{dedup.StepUnknown}, Scope: "a"}, "unknown-2")
	list(dedup.StepFilter{States: []dedup.StepState{dedup.StepUnknown, dedup.StepInDoubt, dedup.StepPending}, Limit: 3}, "expired", "unknown", "running")

	byState, expired, err := j.CountSteps(ctx)
	if err != nil {
		t.Fatalf("CountSteps: %v", err)
	}
	want := map[dedup.StepState]int64{dedup.StepPending: 1, dedup.StepUnknown: 2, dedup.StepInDoubt: 1, dedup.StepSucceeded: 1, dedup.StepFailed: 1}
	for st := dedup.StepPending; st <= dedup.StepInDoubt; st++ {
		if byState[st] != want[st] {
			t.Fatalf("CountSteps = %v, %d expired: want %v (pending: the running one only), 1 expired", byState, expired, want)
		}
	}
	if expired != 1 {
		t.Fatalf("CountSteps: %d expired pending, want 1", expired)
	}
	// The expired step taken over runs again: no longer listed nor
	// counted as expired.
	begin(t, j, refs["expired"], "pk", time.Hour, dedup.StepResolve)
	list(dedup.StepFilter{}, "unknown", "doubt", "unknown-2")
	if byState, expired, err := j.CountSteps(ctx); err != nil || expired != 0 || byState[dedup.StepPending] != 2 {
		t.Fatalf("CountSteps after the takeover: %v, %d, %v; want 2 pending, none expired", byState, expired, err)
	}
}

// stepsOfOneKey: StepFilter{Scope, Key, States: all} lists exactly that
// key's steps, whatever their states: not a step of the same ID in another
// scope, nor of a key the ID is a prefix of. Key without States lists the
// key's unresolved steps; Key without Scope is refused.
func (s journalSuite) stepsOfOneKey(t *testing.T) {
	j, ctx := s.journal(t, Config{}), ctxFor(t)
	for _, c := range []struct {
		scope, id, step string
		out             dedup.StepState // 0: left pending
	}{
		{"a", "k1", "charge", dedup.StepSucceeded},
		{"a", "k1", "refund", 0},
		{"a", "k1", "notify", dedup.StepFailed},
		{"a", "k1", "audit", dedup.StepUnknown},
		{"a", "k1", "payout", dedup.StepInDoubt},
		{"b", "k1", "charge", dedup.StepSucceeded},
		{"a", "k10", "charge", dedup.StepSucceeded},
		{"a", "k2", "charge", dedup.StepUnknown},
	} {
		ref := Step(c.scope, c.id, c.step)
		rec := begin(t, j, ref, "pk-"+c.scope+"-"+c.id+"-"+c.step, time.Hour, dedup.StepCall)
		if c.out != 0 {
			finish(t, j, ref, rec.Token, dedup.StepOutcome{State: c.out})
		}
	}
	all := []dedup.StepState{dedup.StepPending, dedup.StepSucceeded, dedup.StepFailed, dedup.StepUnknown, dedup.StepInDoubt}
	list := func(f dedup.StepFilter, want ...string) {
		t.Helper()
		got, err := j.Steps(ctx, f)
		if err != nil {
			t.Fatalf("Steps(%+v): %v", f, err)
		}
		var steps []string
		for _, r := range got {
			if r.Ref.Key != (dedup.Key{Scope: f.Scope, ID: f.Key}) || r.ProviderKey != "pk-"+f.Scope+"-"+f.Key+"-"+r.Ref.Step {
				t.Fatalf("Steps(%+v) listed step %s of key %s (provider key %s), of another key", f, r.Ref.Step, r.Ref.Key, r.ProviderKey)
			}
			steps = append(steps, r.Ref.Step)
		}
		slices.Sort(steps)
		if !slices.Equal(steps, want) {
			t.Fatalf("Steps(%+v) = %v, want %v", f, steps, want)
		}
	}
	list(dedup.StepFilter{Scope: "a", Key: "k1", States: all}, "audit", "charge", "notify", "payout", "refund")
	list(dedup.StepFilter{Scope: "b", Key: "k1", States: all}, "charge")
	list(dedup.StepFilter{Scope: "a", Key: "k1"}, "audit", "payout")
	list(dedup.StepFilter{Scope: "a", Key: "k1", States: []dedup.StepState{dedup.StepSucceeded, dedup.StepPending}}, "charge", "refund")
	list(dedup.StepFilter{Scope: "a", Key: "k3", States: all})
	if got, err := j.Steps(ctx, dedup.StepFilter{Key: "k1", States: all}); err == nil {
		t.Fatalf("Steps with Key and no Scope = %d steps, want an error: a key's ID is unique only within its scope", len(got))
	}
}

// concurrentHolders: N callers begin one new step at once: exactly one
// gets StepCall, the others StepBusy. Then, round after round, the holder
// reports an unknown outcome and N callers begin it again: exactly one
// gets StepResolve, each time with a token larger than every one before.
func (s journalSuite) concurrentHolders(t *testing.T) {
	j, ctx := s.journal(t, Config{}), ctxFor(t)
	ref := Step("refunds", "order-1", "refund")
	const n = 20
	round := func(want dedup.StepVerdict) dedup.StepRecord {
		t.Helper()
		var (
			wg       sync.WaitGroup
			mu       sync.Mutex
			holders  []dedup.StepRecord
			verdicts = map[dedup.StepVerdict]int{}
			errs     []error
		)
		for range n {
			wg.Go(func() {
				rec, err := j.BeginStep(ctx, ref, "pk", dedup.Fingerprint{}, time.Hour)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					errs = append(errs, err)
					return
				}
				verdicts[rec.Verdict]++
				if rec.Verdict == want {
					holders = append(holders, rec)
				}
			})
		}
		wg.Wait()
		for _, err := range errs {
			if !errors.Is(err, dedup.ErrInFlight) && !errors.Is(err, dedup.ErrStoreBusy) {
				t.Fatalf("BeginStep: %v", err)
			}
		}
		if len(holders) != 1 || verdicts[dedup.StepBusy]+len(errs) != n-1 {
			t.Fatalf("%d concurrent BeginSteps: verdicts %v, %d errors; want one %v, the rest busy", n, verdicts, len(errs), want)
		}
		return holders[0]
	}
	h := round(dedup.StepCall)
	for i := range 3 {
		finish(t, j, ref, h.Token, dedup.StepOutcome{State: dedup.StepUnknown})
		next := round(dedup.StepResolve)
		if next.Token <= h.Token {
			t.Fatalf("round %d: the new holder's token %d, want more than %d", i+1, next.Token, h.Token)
		}
		h = next
	}
	if got := stepOf(t, j, ref); got.Token != h.Token || got.Attempts != 1 {
		t.Fatalf("after the rounds: %+v, want the last holder's token %d, attempt 1", got, h.Token)
	}
}

// storeClock: the record's times are the store's, and its durations are
// computed by the store when the record was read.
func (s journalSuite) storeClock(t *testing.T) {
	j := s.journal(t, Config{})
	ref := Step("refunds", "order-1", "refund")
	const lease = time.Hour
	a := begin(t, j, ref, "pk", lease, dedup.StepCall)
	if got := a.LeaseExpires.Sub(a.FirstAttemptAt); got < lease-time.Millisecond || got > lease+time.Millisecond {
		t.Fatalf("lease expires %v after the first attempt, want %v", got, lease)
	}
	// Both durations are from the store's one now: they add up to the lease.
	within := func(what string, rec dedup.StepRecord) {
		t.Helper()
		if rec.SinceFirstAttempt < 0 || rec.SinceLastAttempt < 0 || rec.SinceFirstAttempt < rec.SinceLastAttempt {
			t.Fatalf("%s: since first attempt %v, since last %v", what, rec.SinceFirstAttempt, rec.SinceLastAttempt)
		}
		if sum := rec.LeaseLeft + rec.SinceLastAttempt; sum < lease-2*time.Millisecond || sum > lease+2*time.Millisecond {
			t.Fatalf("%s: lease left %v + since the last attempt %v = %v, want the lease %v", what, rec.LeaseLeft, rec.SinceLastAttempt, sum, lease)
		}
	}
	within("BeginStep", a)
	var b dedup.StepRecord
	eventually(t, "the store's clock to move 5ms past the first attempt", func() bool {
		b = stepOf(t, j, ref)
		return b.SinceFirstAttempt >= 5*time.Millisecond
	})
	within("Step", b)
	if b.LeaseLeft >= a.LeaseLeft {
		t.Fatalf("lease left %v, then %v: want it shrinking", a.LeaseLeft, b.LeaseLeft)
	}
	r, err := j.AttemptStep(ctxFor(t), ref, a.Token, lease)
	if err != nil {
		t.Fatal(err)
	}
	within("AttemptStep", r)
	if r.SinceFirstAttempt < 5*time.Millisecond || r.SinceLastAttempt >= r.SinceFirstAttempt {
		t.Fatalf("AttemptStep: since first attempt %v, since last %v: want the first older by 5ms or more", r.SinceFirstAttempt, r.SinceLastAttempt)
	}
}

// purge: a succeeded or failed step lives as long as its message's key
// row — Purge deletes it with that row once the scope's retention passed —
// and a step whose key has no row (its message never committed) is kept
// past the retention. An unknown, in-doubt or pending step is never
// purged, nor a step of a scope kept for ever. A purged step begins anew
// with a token above every earlier one.
func (s journalSuite) purge(t *testing.T) {
	j := s.journal(t, Config{ScopeRetention: map[string]time.Duration{"short": time.Millisecond}})
	ctx := ctxFor(t)
	p, ok := j.(dedup.Purger)
	if !ok {
		t.Fatal("deduptest: the journal is not a dedup.Purger")
	}
	rec, ok := j.(failureRecorder)
	if !ok {
		t.Fatal("deduptest: the journal's store has no RecordFailure to write a key row with")
	}
	tokens := map[string]int64{}
	keyRows := 0
	for _, c := range []struct {
		scope, name string
		lease       time.Duration
		out         dedup.StepState
		keyRow      bool // the message committed: its key has a row
	}{
		{"short", "succeeded", time.Hour, dedup.StepSucceeded, true},
		{"short", "failed", time.Hour, dedup.StepFailed, true},
		{"short", "uncommitted", time.Hour, dedup.StepSucceeded, false},
		{"short", "unknown", time.Hour, dedup.StepUnknown, true},
		{"short", "doubt", time.Hour, dedup.StepInDoubt, true},
		{"short", "expired", time.Millisecond, 0, true},
		{"short", "running", time.Hour, 0, true},
		{"kept", "succeeded", time.Hour, dedup.StepSucceeded, true},
	} {
		ref := Step(c.scope, c.name, "call")
		r := begin(t, j, ref, "pk", c.lease, dedup.StepCall)
		tokens[c.scope+"/"+c.name] = r.Token
		if c.out != 0 {
			finish(t, j, ref, r.Token, dedup.StepOutcome{State: c.out, Result: []byte("r")})
		}
		if c.keyRow {
			if err := rec.RecordFailure(ctx, Claim(c.scope, c.name, "p"), "done"); err != nil {
				t.Fatalf("RecordFailure %s/%s: %v", c.scope, c.name, err)
			}
			if c.scope == "short" {
				keyRows++
			}
		}
	}
	waitLeaseOut(t, j, Step("short", "expired", "call"))
	deleted, want := 0, keyRows+2 // the expired key rows and the two steps of committed keys
	eventually(t, "the expired key rows of scope short and their settled steps to be purged", func() bool {
		n, err := p.Purge(ctx, 100)
		if err != nil {
			t.Fatal(err)
		}
		deleted += n
		return deleted >= want
	})
	if n, err := p.Purge(ctx, 100); err != nil || n != 0 || deleted != want {
		t.Fatalf("purged %d, then %d, %v: want %d (key rows and steps), then none", deleted, n, err, want)
	}
	for _, c := range []struct {
		scope, name string
		kept        bool
	}{{"short", "succeeded", false}, {"short", "failed", false}, {"short", "uncommitted", true},
		{"short", "unknown", true}, {"short", "doubt", true}, {"short", "expired", true}, {"short", "running", true},
		{"kept", "succeeded", true}} {
		if _, ok, err := j.Step(ctx, Step(c.scope, c.name, "call")); err != nil || ok != c.kept {
			t.Fatalf("step %s/%s after purge: found %v, %v; want found %v", c.scope, c.name, ok, err, c.kept)
		}
	}
	again := begin(t, j, Step("short", "succeeded", "call"), "pk2", time.Hour, dedup.StepCall)
	for name, tok := range tokens {
		if again.Token <= tok {
			t.Fatalf("a purged step begun again: token %d, want more than %s's %d", again.Token, name, tok)
		}
	}
}

// fingerprintMismatch: a step keeps the fingerprint it was begun with. A
// BeginStep for another payload is StepMismatch with the kept record, in
// every state — running lease, lease run out, unknown, succeeded — and
// changes nothing: no lease, no token, the result not handed out as done.
// The same fingerprint, or none, goes on as before; a step begun with none
// never mismatches and keeps none.
func (s journalSuite) fingerprintMismatch(t *testing.T) {
	j := s.journal(t, Config{})
	first, other := dedup.FingerprintOf([]byte(`{"amount":100}`)), dedup.FingerprintOf([]byte(`{"amount":250}`))
	ref := Step("refunds", "order-1", "refund")
	unchanged := func(what string, want dedup.StepRecord) {
		t.Helper()
		got := stepOf(t, j, ref)
		if got.State != want.State || got.Token != want.Token || got.Attempts != want.Attempts || !got.LeaseExpires.Equal(want.LeaseExpires) ||
			got.Fingerprint != first || string(got.Result) != string(want.Result) || !got.UpdatedAt.Equal(want.UpdatedAt) {
			t.Fatalf("after a mismatch (%s): %+v, want it unchanged from %+v", what, got, want)
		}
	}
	mismatch := func(what string) {
		t.Helper()
		before := stepOf(t, j, ref)
		m := beginFor(t, j, ref, "another", other, time.Hour, dedup.StepMismatch)
		if m.Fingerprint != first || m.State != before.State || m.Token != before.Token || m.ProviderKey != "pk" {
			t.Fatalf("mismatch (%s): %+v, want the kept record (fingerprint %v, %v, token %d)", what, m, first, before.State, before.Token)
		}
		unchanged(what, before)
	}

	// A lease that runs through the checks of a running one on a loaded
	// machine (50 ms did not: the busy check found it run out), then is
	// waited out.
	a := beginFor(t, j, ref, "pk", first, 2*time.Second, dedup.StepCall)
	if a.Fingerprint != first || stepOf(t, j, ref).Fingerprint != first {
		t.Fatalf("new step: fingerprint %v, want %v kept", a.Fingerprint, first)
	}
	mismatch("running lease")
	beginFor(t, j, ref, "pk", first, time.Hour, dedup.StepBusy)
	beginFor(t, j, ref, "pk", dedup.Fingerprint{}, time.Hour, dedup.StepBusy)
	waitLeaseOut(t, j, ref)
	mismatch("lease run out")
	b := beginFor(t, j, ref, "pk", first, time.Hour, dedup.StepResolve)
	finish(t, j, ref, b.Token, dedup.StepOutcome{State: dedup.StepUnknown, Error: "timeout"})
	mismatch("unknown")
	c := beginFor(t, j, ref, "pk", dedup.Fingerprint{}, time.Hour, dedup.StepResolve)
	finish(t, j, ref, c.Token, dedup.StepOutcome{State: dedup.StepSucceeded, Result: []byte("refund 100")})
	mismatch("succeeded")
	if d := beginFor(t, j, ref, "pk", first, time.Hour, dedup.StepDone); string(d.Result) != "refund 100" || d.Fingerprint != first {
		t.Fatalf("the first payload again: %+v, want its result", d)
	}

	none := Step("refunds", "order-2", "refund")
	n := beginFor(t, j, none, "pk", dedup.Fingerprint{}, time.Hour, dedup.StepCall)
	if !n.Fingerprint.IsZero() {
		t.Fatalf("a step begun with none: fingerprint %v", n.Fingerprint)
	}
	finish(t, j, none, n.Token, dedup.StepOutcome{State: dedup.StepSucceeded, Result: []byte("ok")})
	for _, fp := range []dedup.Fingerprint{first, other} {
		if d := beginFor(t, j, none, "pk", fp, time.Hour, dedup.StepDone); !d.Fingerprint.IsZero() {
			t.Fatalf("a step begun with none, asked with %v: fingerprint %v, want none kept", fp, d.Fingerprint)
		}
	}
}

// TxStepsStore is a store whose journal reads steps in its transactions.
type TxStepsStore[TTx any] interface {
	dedup.Store[TTx]
	dedup.TxSteps[TTx]
}

// TxStepsFactory returns a fresh, empty, migrated store for one test,
// cleaned up by t.Cleanup.
type TxStepsFactory[TTx any] func(t *testing.T, cfg Config) TxStepsStore[TTx]

// RunTxSteps runs the conformance suite of dedup.TxSteps: LiveSteps lists,
// in a transaction, the records Steps lists for each key in every state
// but failed, in the same order, each key once, at most
// dedup.LiveStepsPerKey of a key (the oldest), and nothing for no keys.
func RunTxSteps[TTx any](t *testing.T, newStore TxStepsFactory[TTx]) {
	t.Run("LiveStepsOfKeys", func(t *testing.T) {
		st, ctx := newStore(t, Config{LockTimeout: 5 * time.Second}), ctxFor(t)
		for _, c := range []struct {
			scope, id, step string
			out             dedup.StepState // 0: left pending
		}{
			{"a", "k1", "charge", dedup.StepSucceeded},
			{"a", "k1", "refund", 0},
			{"a", "k1", "notify", dedup.StepFailed},
			{"a", "k1", "audit", dedup.StepUnknown},
			{"a", "k1", "payout", dedup.StepInDoubt},
			{"b", "k1", "charge", dedup.StepSucceeded},
			{"a", "k10", "charge", dedup.StepSucceeded},
			{"a", "k2", "charge", dedup.StepUnknown},
			{"a", "k4", "charge", dedup.StepFailed},
		} {
			ref := Step(c.scope, c.id, c.step)
			rec := begin(t, st, ref, "pk-"+c.scope+"-"+c.id+"-"+c.step, time.Hour, dedup.StepCall)
			if c.out != 0 {
				finish(t, st, ref, rec.Token, dedup.StepOutcome{State: c.out})
			}
		}
		keys := []dedup.Key{{Scope: "a", ID: "k1"}, {Scope: "b", ID: "k1"}, {Scope: "a", ID: "k3"}, {Scope: "a", ID: "k1"},
			{Scope: "a", ID: "k2"}, {Scope: "a", ID: "k4"}}
		var got []dedup.StepRecord
		if err := st.InTx(ctx, func(ctx context.Context, tx TTx) error {
			var err error
			got, err = st.LiveSteps(ctx, tx, keys)
			return err
		}); err != nil {
			t.Fatalf("LiveSteps: %v", err)
		}
		byKey := make(map[dedup.Key][]dedup.StepRecord)
		for _, r := range got {
			byKey[r.Ref.Key] = append(byKey[r.Ref.Key], r)
		}
		live := []dedup.StepState{dedup.StepPending, dedup.StepSucceeded, dedup.StepUnknown, dedup.StepInDoubt}
		for _, k := range []dedup.Key{{Scope: "a", ID: "k1"}, {Scope: "b", ID: "k1"}, {Scope: "a", ID: "k2"}, {Scope: "a", ID: "k3"}, {Scope: "a", ID: "k4"}} {
			want, err := st.Steps(ctx, dedup.StepFilter{Scope: k.Scope, Key: k.ID, States: live})
			if err != nil {
				t.Fatal(err)
			}
			if !slices.EqualFunc(byKey[k], want, sameStep) {
				t.Errorf("LiveSteps listed of key %s %s, Steps lists %s", k, stepNames(byKey[k]), stepNames(want))
			}
			delete(byKey, k)
		}
		if len(byKey) != 0 {
			t.Errorf("LiveSteps listed steps of keys it was not given: %v", byKey)
		}
		if n := len(got); n != 6 {
			t.Errorf("LiveSteps listed %d steps, want 6: a/k1's four, b/k1's, a/k2's, each once", n)
		}
		if err := st.InTx(ctx, func(ctx context.Context, tx TTx) error {
			none, err := st.LiveSteps(ctx, tx, nil)
			if err == nil && len(none) != 0 {
				err = fmt.Errorf("%d steps", len(none))
			}
			return err
		}); err != nil {
			t.Errorf("LiveSteps of no keys: %v, want none", err)
		}
	})
	t.Run("LiveStepsBounded", func(t *testing.T) {
		st, ctx := newStore(t, Config{LockTimeout: 5 * time.Second}), ctxFor(t)
		for i := range dedup.LiveStepsPerKey + 2 {
			begin(t, st, Step("a", "k", fmt.Sprintf("s%03d", i)), fmt.Sprintf("pk-%d", i), time.Hour, dedup.StepCall)
		}
		begin(t, st, Step("a", "j", "s000"), "pk-j", time.Hour, dedup.StepCall)
		var got []dedup.StepRecord
		if err := st.InTx(ctx, func(ctx context.Context, tx TTx) error {
			var err error
			got, err = st.LiveSteps(ctx, tx, []dedup.Key{{Scope: "a", ID: "k"}, {Scope: "a", ID: "j"}})
			return err
		}); err != nil {
			t.Fatalf("LiveSteps: %v", err)
		}
		var k []string
		j := 0
		for _, r := range got {
			if r.Ref.Key.ID == "j" {
				j++
			} else {
				k = append(k, r.Ref.Step)
			}
		}
		if len(k) != dedup.LiveStepsPerKey || k[0] != "s000" || k[len(k)-1] != fmt.Sprintf("s%03d", dedup.LiveStepsPerKey-1) || j != 1 {
			t.Fatalf("LiveSteps listed %d steps of a/k (%s), %d of a/j; want its %d oldest, s000 to s%03d, and a/j's one",
				len(k), strings.Join(k, ", "), j, dedup.LiveStepsPerKey, dedup.LiveStepsPerKey-1)
		}
	})
}

// sameStep reports whether a and b are one record of one step.
func sameStep(a, b dedup.StepRecord) bool {
	return a.Ref == b.Ref && a.State == b.State && a.ProviderKey == b.ProviderKey && a.Token == b.Token &&
		a.Attempts == b.Attempts && a.Fingerprint == b.Fingerprint && a.FirstAttemptAt.Equal(b.FirstAttemptAt)
}

// stepNames names records as "step state".
func stepNames(recs []dedup.StepRecord) string {
	names := make([]string, len(recs))
	for i, r := range recs {
		names[i] = r.Ref.Step + " " + r.State.String()
	}
	return "[" + strings.Join(names, ", ") + "]"
}
