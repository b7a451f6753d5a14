package effect_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/memstore"
	"github.com/idemkit/idem/effect"
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

// bank is a provider in memory: it executes a request once per key, keeps
// the largest fencing token per key and refuses smaller ones, and does
// what fault says with each request (after executing it or not).
type bank struct {
	mu       sync.Mutex
	executed map[string]int   // executions per provider key: the truth
	fence    map[string]int64 // largest token seen per key
	calls    int
	keys     []string
	reads    int
	fault    func(n int) error // the n-th call's fault (from 1); nil: none
	before   bool              // fault strikes before executing
	readBack func(n int, executed bool) (effect.ReadBack, error)
}

var errTimeout = errors.New("read tcp: i/o timeout")

func newBank() *bank { return &bank{executed: map[string]int{}, fence: map[string]int64{}} }

func (b *bank) call(_ context.Context, c effect.Call) ([]byte, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.calls++
	b.keys = append(b.keys, c.ProviderKey)
	if c.Token < b.fence[c.ProviderKey] {
		return nil, fmt.Errorf("409 stale fencing token %d", c.Token)
	}
	b.fence[c.ProviderKey] = c.Token
	var err error
	if b.fault != nil {
		err = b.fault(b.calls)
	}
	if err != nil && b.before {
		return nil, err
	}
	if b.executed[c.ProviderKey] == 0 {
		b.executed[c.ProviderKey]++
	}
	if err != nil {
		return nil, err
	}
	return []byte("refund-of-" + c.ProviderKey), nil
}

func (b *bank) read(_ context.Context, c effect.Call) (effect.ReadBack, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.reads++
	done := b.executed[c.ProviderKey] > 0
	if b.readBack != nil {
		return b.readBack(b.reads, done)
	}
	if done {
		return effect.ReadBack{Status: effect.Executed, Result: []byte("refund-of-" + c.ProviderKey)}, nil
	}
	return effect.ReadBack{Status: effect.NotFound}, nil
}

func (b *bank) total() (calls, executions int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, n := range b.executed {
		executions += n
	}
	return b.calls, executions
}

type fixture struct {
	t     *testing.T
	clk   *clock
	store *memstore.Store
	bank  *bank
	key   dedup.Key
	fp    dedup.Fingerprint // of the request the steps are run for
	step  effect.Step
}

func newFixture(t *testing.T) *fixture {
	clk := &clock{now: time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)}
	f := &fixture{t: t, clk: clk, store: memstore.New(memstore.Config{Now: clk.Now}), bank: newBank(),
		key: dedup.Key{Scope: "refunds", ID: "R-1"}, fp: dedup.FingerprintOf([]byte(`{"amount":100}`))}
	f.step = effect.Step{Name: "refund", KeyTTL: 30 * time.Minute, Lease: 30 * time.Second, Call: f.bank.call}
	return f
}

func (f *fixture) do() ([]byte, error) {
	return effect.DoKey(context.Background(), f.store, f.key, f.fp, f.step)
}

// want checks the provider's own count of calls and executions.
func (f *fixture) want(calls, executions int) {
	f.t.Helper()
	if c, e := f.bank.total(); c != calls || e != executions {
		f.t.Fatalf("provider saw %d calls and %d executions, want %d and %d", c, e, calls, executions)
	}
}

func (f *fixture) state() dedup.StepRecord {
	f.t.Helper()
	r, ok, err := f.store.Step(context.Background(), dedup.StepRef{Key: f.key, Step: f.step.Name})
	if err != nil || !ok {
		f.t.Fatalf("step record: %v, %v", ok, err)
	}
	return r
}

func TestSucceededIsNeverCalledAgain(t *testing.T) {
	f := newFixture(t)
	res, err := f.do()
	if err != nil || string(res) != "refund-of-"+effect.DefaultProviderKey(f.key, "refund") {
		t.Fatalf("Do = %q, %v", res, err)
	}
	for range 3 {
		again, err := f.do()
		if err != nil || string(again) != string(res) {
			t.Fatalf("Do again = %q, %v; want the stored result", again, err)
		}
	}
	f.want(1, 1)
}

// TestAnotherPayloadIsRefused (39.6): a step answers only the request that
// began it. Another request under the same key — another amount — is
// refused with dedup.ErrFingerprintMismatch, marked Reject (dead-lettered
// as fingerprint_mismatch, the key left free), whether the step succeeded
// or its outcome is unknown: it is neither given the first one's result,
// nor does it read back, call, or take the step over. The first request,
// and a caller with no fingerprint, go on as before.
func TestAnotherPayloadIsRefused(t *testing.T) {
	for _, unknown := range []bool{false, true} {
		f := newFixture(t)
		f.step.ReadBack = f.bank.read
		if unknown {
			f.bank.fault = func(int) error { return errTimeout }
		}
		first := f.fp
		_, _ = f.do()
		before := f.state()
		f.fp = dedup.FingerprintOf([]byte(`{"amount":250}`))
		for range 2 {
			res, err := f.do()
			if !errors.Is(err, dedup.ErrFingerprintMismatch) || !consumer.IsRejected(err) || consumer.IsPermanent(err) || res != nil {
				t.Fatalf("unknown %v: Do for another payload = %q, %v; want a rejected ErrFingerprintMismatch", unknown, res, err)
			}
		}
		f.want(1, 1)
		if s := f.state(); s.Token != before.Token || s.State != before.State || s.Fingerprint != first || f.bank.reads != 0 {
			t.Fatalf("unknown %v: step %+v after the mismatches (%d read-backs), want it unchanged from %+v", unknown, s, f.bank.reads, before)
		}
		f.bank.fault = nil
		for _, fp := range []dedup.Fingerprint{first, {}} {
			f.fp = fp
			if res, err := f.do(); err != nil || !strings.HasPrefix(string(res), "refund-of-") {
				t.Fatalf("unknown %v: Do with fingerprint %v = %q, %v; want the step's result", unknown, fp, res, err)
			}
		}
		f.want(1, 1)
	}
}

func TestRefusedIsStoredAndNotCalledAgain(t *testing.T) {
	f := newFixture(t)
	f.step.Call = func(context.Context, effect.Call) ([]byte, error) {
		f.bank.mu.Lock()
		f.bank.calls++
		f.bank.mu.Unlock()
		return nil, effect.Refused(errors.New("422 refund exceeds the payment"), []byte(`{"code":"REFUND_AMT_EXCEED"}`))
	}
	for i := range 3 {
		_, err := f.do()
		var r *effect.RefusedError
		if !errors.Is(err, effect.ErrRefused) || !errors.As(err, &r) || string(r.Result) != `{"code":"REFUND_AMT_EXCEED"}` ||
			!consumer.IsPermanent(err) || !strings.Contains(err.Error(), "refund exceeds") {
			t.Fatalf("run %d: Do = %v; want a permanent ErrRefused with the answer", i, err)
		}
	}
	f.want(1, 0)
	if s := f.state(); s.State != dedup.StepFailed {
		t.Fatalf("state %v, want failed", s.State)
	}
}

// TestUnknownThenReadBackExecuted: the provider committed and the answer
// was lost; the next run reads back and records the execution, and never
// calls again.
func TestUnknownThenReadBackExecuted(t *testing.T) {
	f := newFixture(t)
	f.bank.fault = func(n int) error { return errTimeout }
	f.step.ReadBack = f.bank.read
	_, err := f.do()
	if !errors.Is(err, effect.ErrUnknownOutcome) || !consumer.IsRetryable(err) || !errors.Is(err, errTimeout) {
		t.Fatalf("Do = %v; want a retryable ErrUnknownOutcome", err)
	}
	if s := f.state(); s.State != dedup.StepUnknown || !strings.Contains(s.Error, "i/o timeout") {
		t.Fatalf("step %v %q, want unknown with the timeout", s.State, s.Error)
	}
	res, err := f.do()
	if err != nil || !strings.HasPrefix(string(res), "refund-of-") {
		t.Fatalf("Do after read-back = %q, %v", res, err)
	}
	f.want(1, 1)
	if s := f.state(); s.State != dedup.StepSucceeded || s.Attempts != 1 {
		t.Fatalf("step %v after %d attempts, want succeeded after 1", s.State, s.Attempts)
	}
}

func TestReadBackDeclined(t *testing.T) {
	f := newFixture(t)
	f.bank.fault = func(int) error { return errTimeout }
	f.bank.before = true
	f.step.ReadBack = func(context.Context, effect.Call) (effect.ReadBack, error) {
		return effect.ReadBack{Status: effect.Declined, Result: []byte("closed")}, nil
	}
	f.do()
	_, err := f.do()
	if !errors.Is(err, effect.ErrRefused) || !consumer.IsPermanent(err) {
		t.Fatalf("Do = %v, want ErrRefused", err)
	}
	f.want(1, 0)
}

// TestTrustedNotFoundRepeatsWithTheSameKey: a read-back that finds nothing
// once the lag has passed is trusted, even past the key's TTL: the request
// is repeated with the same provider key and a larger token.
func TestTrustedNotFoundRepeatsWithTheSameKey(t *testing.T) {
	f := newFixture(t)
	f.bank.fault = func(n int) error {
		if n == 1 {
			return errTimeout
		}
		return nil
	}
	f.bank.before = true // the request never reached the ledger
	f.step.ReadBack = f.bank.read
	f.step.ReadBackLag = time.Minute
	f.step.KeyTTL = 0 // no keys: only a trusted read-back allows a repeat
	f.do()
	f.clk.Add(time.Minute)
	if _, err := f.do(); err != nil {
		t.Fatalf("Do = %v", err)
	}
	f.want(2, 1)
	if f.bank.keys[0] != f.bank.keys[1] {
		t.Fatalf("the repeat carried key %s, the first %s", f.bank.keys[1], f.bank.keys[0])
	}
	if s := f.state(); s.State != dedup.StepSucceeded || s.Attempts != 2 {
		t.Fatalf("step %v after %d attempts", s.State, s.Attempts)
	}
}

// TestUntrustedNotFoundWaitsPastTheTTL: a "not found" younger than the
// query's lag, past the key's TTL, neither repeats nor gives up: it waits.
func TestUntrustedNotFoundWaitsPastTheTTL(t *testing.T) {
	f := newFixture(t)
	f.bank.fault = func(n int) error { return errTimeout }
	lagging := true
	f.bank.readBack = func(_ int, done bool) (effect.ReadBack, error) {
		if done && !lagging {
			return effect.ReadBack{Status: effect.Executed, Result: []byte("late")}, nil
		}
		return effect.ReadBack{Status: effect.NotFound}, nil
	}
	f.step.ReadBack = f.bank.read
	f.step.KeyTTL = time.Minute
	f.step.ReadBackLag = 10 * time.Minute
	f.do()
	f.clk.Add(2 * time.Minute)
	_, err := f.do()
	if !errors.Is(err, effect.ErrUnknownOutcome) || !strings.Contains(err.Error(), "may lag") {
		t.Fatalf("Do = %v; want unknown, waiting for the query", err)
	}
	f.want(1, 1)
	lagging = false
	res, err := f.do()
	if err != nil || string(res) != "late" {
		t.Fatalf("Do = %q, %v", res, err)
	}
	f.want(1, 1)
}

// TestUntrustedNotFoundRepeatsWithinTheTTL: while the provider keeps the
// key, a repeat is safe whatever the query says: the provider answers it
// from the key.
func TestUntrustedNotFoundRepeatsWithinTheTTL(t *testing.T) {
	f := newFixture(t)
	f.bank.fault = func(n int) error {
		if n == 1 {
			return errTimeout
		}
		return nil
	}
	f.bank.readBack = func(int, bool) (effect.ReadBack, error) { return effect.ReadBack{Status: effect.NotFound}, nil }
	f.step.ReadBack = f.bank.read
	f.step.ReadBackLag = time.Hour
	f.do()
	if _, err := f.do(); err != nil {
		t.Fatalf("Do = %v", err)
	}
	f.want(2, 1)
}

func TestReadBackErrorRepeatsOnlyWithinTheTTL(t *testing.T) {
	f := newFixture(t)
	f.bank.fault = func(n int) error { return errTimeout }
	f.bank.readBack = func(int, bool) (effect.ReadBack, error) { return effect.ReadBack{}, errors.New("query: 503") }
	f.step.ReadBack = f.bank.read
	f.step.KeyTTL = time.Minute
	f.do()
	f.do() // within the TTL: repeated, with the same key
	f.want(2, 1)
	f.clk.Add(time.Minute)
	_, err := f.do()
	if !errors.Is(err, effect.ErrUnknownOutcome) || !strings.Contains(err.Error(), "query: 503") {
		t.Fatalf("Do = %v; want unknown with the read-back's error", err)
	}
	f.want(2, 1)
	if s := f.state(); s.State != dedup.StepUnknown || strings.Count(s.Error, "then") != 1 {
		t.Fatalf("step %v %q", s.State, s.Error)
	}
}

// TestNoReadBackRepeatsWhileTheKeyIsKept and then gives up: past KeyTTL -
// Lease the step is in doubt, dead-lettered, never called again.
func TestNoReadBackInDoubtPastTheTTL(t *testing.T) {
	f := newFixture(t)
	f.bank.fault = func(int) error { return errTimeout }
	f.step.KeyTTL = 10 * time.Minute
	f.do()
	f.clk.Add(9 * time.Minute) // 9m + the 30s lease < 10m: the key is kept
	f.do()
	f.want(2, 1)
	f.clk.Add(31 * time.Second)
	for i := range 2 {
		_, err := f.do()
		var d *effect.InDoubtError
		if !errors.Is(err, effect.ErrInDoubt) || !consumer.IsInDoubt(err) || !errors.As(err, &d) {
			t.Fatalf("run %d: Do = %v; want in doubt", i, err)
		}
		if d.Attempts != 2 || d.ProviderKey != f.bank.keys[0] || d.SinceFirstAttempt < 9*time.Minute || !strings.Contains(d.LastError, "i/o timeout") {
			t.Fatalf("in doubt facts: %+v", d)
		}
	}
	f.want(2, 1)
	if s := f.state(); s.State != dedup.StepInDoubt {
		t.Fatalf("state %v", s.State)
	}
}

func TestNoKeysNoReadBackIsInDoubtAtOnce(t *testing.T) {
	f := newFixture(t)
	f.bank.fault = func(int) error { return errTimeout }
	f.step.KeyTTL = 0
	f.do()
	if _, err := f.do(); !errors.Is(err, effect.ErrInDoubt) {
		t.Fatalf("Do = %v, want in doubt", err)
	}
	f.want(1, 1)
}

// TestZombieIsFencedOut: a holder stalls past its lease; the next one
// resolves the step and repeats with a larger token; the zombie's late
// request is refused by the provider, and its outcome by the journal.
func TestZombieIsFencedOut(t *testing.T) {
	f := newFixture(t)
	stalled, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	call := f.bank.call
	f.step.Call = func(ctx context.Context, c effect.Call) ([]byte, error) {
		if c.Attempt == 1 {
			once.Do(func() { close(stalled) })
			<-release // the request is stuck in the network
		}
		return call(ctx, c)
	}
	zombie := make(chan error, 1)
	go func() { _, err := f.do(); zombie <- err }()
	<-stalled
	if _, err := f.do(); !errors.Is(err, effect.ErrBusy) || !consumer.IsRetryable(err) {
		t.Fatalf("Do while the lease runs = %v, want ErrBusy", err)
	}
	f.clk.Add(31 * time.Second)
	if _, err := f.do(); err != nil {
		t.Fatalf("Do after the lease ran out = %v", err)
	}
	close(release)
	err := <-zombie
	if !errors.Is(err, dedup.ErrLeaseLost) || !consumer.IsRetryable(err) || !strings.Contains(err.Error(), "dropped") {
		t.Fatalf("zombie's Do = %v, want its outcome dropped", err)
	}
	f.want(2, 1) // the zombie's call reached the provider, which refused its token
	if s := f.state(); s.State != dedup.StepSucceeded || s.Attempts != 2 {
		t.Fatalf("step %v after %d attempts", s.State, s.Attempts)
	}
}

func TestStepIsChecked(t *testing.T) {
	f := newFixture(t)
	for _, s := range []effect.Step{{Call: f.bank.call}, {Name: "x"}, {Name: "x", Call: f.bank.call, KeyTTL: -1}} {
		if _, err := effect.DoKey(context.Background(), f.store, f.key, f.fp, s); err == nil || !strings.Contains(err.Error(), "Step.") {
			t.Errorf("DoKey(%+v) = %v, want an error naming the field", s, err)
		}
	}
	f.want(0, 0)
}

func TestDefaultProviderKey(t *testing.T) {
	k := effect.DefaultProviderKey(dedup.Key{Scope: "a", ID: "b"}, "refund")
	if len(k) != 32 || k != effect.DefaultProviderKey(dedup.Key{Scope: "a", ID: "b"}, "refund") ||
		k == effect.DefaultProviderKey(dedup.Key{Scope: "a", ID: "b"}, "refund2") ||
		effect.DefaultProviderKey(dedup.Key{Scope: "ab", ID: ""}, "x") == effect.DefaultProviderKey(dedup.Key{Scope: "a", ID: "b"}, "x") {
		t.Fatalf("DefaultProviderKey = %q: want 32 stable characters, distinct per key and step", k)
	}
}
