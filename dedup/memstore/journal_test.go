package memstore_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/memstore"
)

type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// TestJournalLifecycle walks one step through every verdict of
// dedup.Journal on the store's clock: call, busy, resolve after an unknown
// outcome and after a dead holder, fencing of the older tokens, the final
// outcome returned without a call, an operator's resolution and purge.
func TestJournalLifecycle(t *testing.T) {
	ctx := context.Background()
	clk := &clock{now: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	s := memstore.New(memstore.Config{Now: clk.Now, Retention: time.Hour})
	ref := dedup.StepRef{Key: dedup.Key{Scope: "refunds", ID: "r1"}, Step: "refund"}

	r, err := s.BeginStep(ctx, ref, "pk1", dedup.Fingerprint{}, time.Minute)
	if err != nil || r.Verdict != dedup.StepCall || r.State != dedup.StepPending || r.Attempts != 1 || r.ProviderKey != "pk1" {
		t.Fatalf("first BeginStep = %+v, %v; want call, pending, attempt 1, pk1", r, err)
	}
	first := r.Token
	clk.Add(10 * time.Second)
	if b, _ := s.BeginStep(ctx, ref, "other", dedup.Fingerprint{}, time.Minute); b.Verdict != dedup.StepBusy || b.LeaseLeft != 50*time.Second {
		t.Fatalf("BeginStep under a running lease = %v (lease left %v), want busy, 50s", b.Verdict, b.LeaseLeft)
	}
	if err := s.FinishStep(ctx, ref, first, dedup.StepOutcome{State: dedup.StepUnknown, Error: "timeout"}); err != nil {
		t.Fatal(err)
	}
	r2, _ := s.BeginStep(ctx, ref, "other", dedup.Fingerprint{}, time.Minute)
	if r2.Verdict != dedup.StepResolve || r2.State != dedup.StepUnknown || r2.Token <= first || r2.ProviderKey != "pk1" || r2.Error != "timeout" {
		t.Fatalf("BeginStep after unknown = %+v, want resolve, unknown, larger token, pk1", r2)
	}
	if b, _ := s.BeginStep(ctx, ref, "pk1", dedup.Fingerprint{}, time.Minute); b.Verdict != dedup.StepBusy {
		t.Fatalf("BeginStep while a resolver holds the step = %v, want busy", b.Verdict)
	}
	if err := s.FinishStep(ctx, ref, first, dedup.StepOutcome{State: dedup.StepSucceeded}); !errors.Is(err, dedup.ErrLeaseLost) {
		t.Fatalf("FinishStep with the older token = %v, want ErrLeaseLost", err)
	}
	clk.Add(5 * time.Second)
	a, err := s.AttemptStep(ctx, ref, r2.Token, time.Minute)
	if err != nil || a.Attempts != 2 || a.State != dedup.StepPending || a.SinceFirstAttempt != 15*time.Second || a.SinceLastAttempt != 0 {
		t.Fatalf("AttemptStep = %+v, %v; want attempt 2, pending, first 15s ago", a, err)
	}
	// The holder dies mid-call: once its lease ran out, the next one resolves.
	clk.Add(time.Minute)
	r3, _ := s.BeginStep(ctx, ref, "pk1", dedup.Fingerprint{}, time.Minute)
	if r3.Verdict != dedup.StepResolve || r3.State != dedup.StepPending || r3.Attempts != 2 || r3.Token <= r2.Token {
		t.Fatalf("BeginStep after a dead holder = %+v, want resolve, pending, attempts 2", r3)
	}
	if _, err := s.AttemptStep(ctx, ref, r2.Token, time.Minute); !errors.Is(err, dedup.ErrLeaseLost) {
		t.Fatalf("AttemptStep by the dead holder = %v, want ErrLeaseLost", err)
	}
	if err := s.FinishStep(ctx, ref, r3.Token, dedup.StepOutcome{State: dedup.StepSucceeded, Result: []byte("ok")}); err != nil {
		t.Fatal(err)
	}
	if d, _ := s.BeginStep(ctx, ref, "pk1", dedup.Fingerprint{}, time.Minute); d.Verdict != dedup.StepDone || string(d.Result) != "ok" {
		t.Fatalf("BeginStep of a succeeded step = %+v, want done with its result", d)
	}
	if err := s.FinishStep(ctx, ref, r3.Token, dedup.StepOutcome{State: dedup.StepFailed}); !errors.Is(err, dedup.ErrLeaseLost) {
		t.Fatalf("FinishStep of a succeeded step = %v, want ErrLeaseLost", err)
	}
	if ok, err := s.ResolveStep(ctx, ref, 0, dedup.StepOutcome{State: dedup.StepFailed}); ok || err != nil {
		t.Fatalf("ResolveStep of a succeeded step = %v, %v; want left alone", ok, err)
	}
	if n, _ := s.Purge(ctx, 10); n != 0 {
		t.Fatalf("Purge within retention deleted %d", n)
	}
	clk.Add(2 * time.Hour)
	if n, _ := s.Purge(ctx, 10); n != 0 {
		t.Fatalf("Purge past retention deleted %d, want the step of a key without a row kept", n)
	}
	// The message commits (here: recorded failed): the step goes with its key row.
	if err := s.RecordFailure(ctx, dedup.Claim{Key: ref.Key}, "done"); err != nil {
		t.Fatal(err)
	}
	clk.Add(2 * time.Hour)
	if n, _ := s.Purge(ctx, 10); n != 2 {
		t.Fatalf("Purge past the key row's retention deleted %d, want the row and its succeeded step", n)
	}
}

// TestJournalOperators: an in-doubt step is listed, counted and resolved
// by an operator only under the token the operator saw; purge keeps it.
func TestJournalOperators(t *testing.T) {
	ctx := context.Background()
	clk := &clock{now: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	s := memstore.New(memstore.Config{Now: clk.Now, Retention: time.Minute})
	doubt := dedup.StepRef{Key: dedup.Key{Scope: "refunds", ID: "d"}, Step: "refund"}
	dead := dedup.StepRef{Key: dedup.Key{Scope: "payouts", ID: "p"}, Step: "payout"}
	r, _ := s.BeginStep(ctx, doubt, "pkd", dedup.Fingerprint{}, time.Minute)
	if err := s.FinishStep(ctx, doubt, r.Token, dedup.StepOutcome{State: dedup.StepInDoubt, Error: "key expired"}); err != nil {
		t.Fatal(err)
	}
	clk.Add(time.Second)
	if _, err := s.BeginStep(ctx, dead, "pkp", dedup.Fingerprint{}, time.Minute); err != nil {
		t.Fatal(err)
	}
	if l, _ := s.Steps(ctx, dedup.StepFilter{}); len(l) != 1 || l[0].Ref != doubt {
		t.Fatalf("unresolved steps = %+v, want the in-doubt one (the other's lease runs)", l)
	}
	clk.Add(2 * time.Minute)
	l, _ := s.Steps(ctx, dedup.StepFilter{})
	if len(l) != 2 || l[0].Ref != doubt || l[1].Ref != dead {
		t.Fatalf("unresolved steps = %+v, want in-doubt then the dead holder's", l)
	}
	if l, _ := s.Steps(ctx, dedup.StepFilter{Scope: "payouts", States: []dedup.StepState{dedup.StepPending}}); len(l) != 1 || l[0].Ref != dead {
		t.Fatalf("filtered steps = %+v", l)
	}
	by, expired, _ := s.CountSteps(ctx)
	if by[dedup.StepInDoubt] != 1 || by[dedup.StepPending] != 0 || expired != 1 {
		t.Fatalf("CountSteps = %v, %d", by, expired)
	}
	if n, _ := s.Purge(ctx, 10); n != 0 {
		t.Fatalf("Purge deleted %d unresolved steps", n)
	}
	if ok, _ := s.ResolveStep(ctx, doubt, r.Token+100, dedup.StepOutcome{State: dedup.StepSucceeded}); ok {
		t.Fatal("ResolveStep under a token the step no longer has resolved it")
	}
	if ok, err := s.ResolveStep(ctx, doubt, r.Token, dedup.StepOutcome{State: dedup.StepSucceeded, Result: []byte("ref-1"), Error: "ops"}); !ok || err != nil {
		t.Fatalf("ResolveStep = %v, %v", ok, err)
	}
	if got, _, _ := s.Step(ctx, doubt); got.State != dedup.StepSucceeded || string(got.Result) != "ref-1" || got.Token <= r.Token {
		t.Fatalf("resolved step = %+v", got)
	}
}
