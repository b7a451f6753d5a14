package seams_test

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/effect"
)

// The step dimension (issue 39): the Kafka mode's handler calls a payment
// provider through effect.Do before it applies a payment. The provider is
// a fake in the test with a ledger of its own — what it executed, under
// which provider key — whose answers the seed draws per call: the request
// succeeds, is refused, times out after the provider executed it, or
// times out before it got there. Its checks (stepChecks) hold the journal
// to what a provider sees: no provider key executed twice, no step called
// again once settled, no payment applied without its step, no letter in
// doubt that a read-back could have settled or sent while the provider
// still kept the key.

// stepConfig is the step dimension of a configuration.
type stepConfig struct {
	on bool
	// readBack: the step has a ReadBack (the provider's query, truthful).
	readBack bool
	// keyTTL is Step.KeyTTL, and how long the fake keeps a key from its
	// first request: stepKeyLong, stepKeyShort (a repeat may leave only
	// within 5ms of the first attempt: shorter than the run's retries, but
	// for the quickest Blocking ones) or 0 (it keeps none).
	keyTTL time.Duration
}

const (
	// stepLease is the step's Lease: the fake answers at once, and a
	// holder killed mid-call blocks the step no longer than this.
	stepLease    = time.Second
	stepKeyLong  = time.Hour
	stepKeyShort = stepLease + 5*time.Millisecond
	stepName     = "charge"
)

// drawStep draws the step dimension, from a stream of its own: the rest of
// a seed's configuration is what it was before the dimension was added.
func drawStep(rng *rand.Rand) stepConfig {
	if rng.IntN(3) == 0 {
		return stepConfig{}
	}
	return stepConfig{on: true, readBack: rng.IntN(2) == 0,
		keyTTL: []time.Duration{stepKeyLong, stepKeyShort, 0}[rng.IntN(3)]}
}

func (s stepConfig) String() string {
	if !s.on {
		return ""
	}
	rb := "no-readback"
	if s.readBack {
		rb = "readback"
	}
	ttl := "keeps-no-keys"
	switch s.keyTTL {
	case stepKeyLong:
		ttl = "keyttl=long"
	case stepKeyShort:
		ttl = "keyttl=short"
	}
	return fmt.Sprintf(" step=%s,%s", rb, ttl)
}

// answer is what the fake provider does with one request.
type answer uint8

const (
	answerSucceed       answer = iota
	answerRefuse               // a definite refusal: nothing happened
	answerTimeoutAfter         // executed, and the answer lost
	answerTimeoutBefore        // lost on the way: nothing happened
)

func (a answer) String() string {
	return [...]string{"succeed", "refuse", "timeout-after-executing", "timeout-before-executing"}[a]
}

// stepScript is the answers the fake gives a payment's requests, one per
// request in order (every later one succeeds): drawn from the seed and the
// payment, so that a replay draws them again whatever the timing.
func stepScript(seed uint64, pay string) []answer {
	h := fnv.New64a()
	h.Write([]byte(pay))
	rng := rand.New(rand.NewPCG(seed, h.Sum64()^0x57e939))
	out := make([]answer, 1+rng.IntN(3))
	for i := range out {
		switch x := rng.IntN(10); {
		case x < 4:
			out[i] = answerSucceed
		case x < 5:
			out[i] = answerRefuse
		case x < 8:
			out[i] = answerTimeoutAfter
		default:
			out[i] = answerTimeoutBefore
		}
	}
	return out
}

// The step checks.
const (
	// checkStepExecutedOnce: the provider executed each provider key at
	// most once, and each payment under one provider key at most.
	checkStepExecutedOnce = "step-executed-once"
	// checkStepSettled: a step is never called nor read back again once
	// the provider's answer settled it (succeeded or refused) or an
	// operator resolved it.
	checkStepSettled = "step-settled"
	// checkStepApplied: a payment is applied only when the provider
	// executed its step, and a payment whose step succeeded and that was
	// not dead-lettered is applied in the end.
	checkStepApplied = "step-applied"
	// checkStepInDoubt: a letter in doubt only for a step that has no
	// read-back, past the provider's key TTL, or for a stale event whose
	// key has steps (an earlier attempt called the provider).
	checkStepInDoubt = "step-in-doubt"
)

var errProviderTimeout = errors.New("provider: i/o timeout")

// pkey is the fake provider's ledger of one provider key.
type pkey struct {
	key        string
	pay        string
	calls      int
	reads      int
	executions int
	refused    bool
	first      time.Time // its first request: the provider keeps the key from then
	settled    string    // "succeeded", "refused", "resolved …": no request may follow
	log        []string
}

// provider is the fake payment provider.
type provider struct {
	cfg   stepConfig
	seed  uint64
	rep   *reporter
	count func(what string) // the run's summary

	mu   sync.Mutex
	keys map[string]*pkey
	// retried: payments that must go to retry (kopCrashAfterCopy).
	retried map[string]bool
}

func newProvider(cfg stepConfig, seed uint64, rep *reporter, count func(string)) *provider {
	return &provider{cfg: cfg, seed: seed, rep: rep, count: count, keys: map[string]*pkey{}, retried: map[string]bool{}}
}

// step is the effect.Step the handler runs for payment pay.
func (pv *provider) step(pay string) effect.Step {
	s := effect.Step{Name: stepName, KeyTTL: pv.cfg.keyTTL, Lease: stepLease,
		Call: func(_ context.Context, c effect.Call) ([]byte, error) { return pv.call(pay, c) }}
	if pv.cfg.readBack {
		s.ReadBack = func(_ context.Context, c effect.Call) (effect.ReadBack, error) { return pv.readBack(pay, c), nil }
	}
	return s
}

func (pv *provider) key(pay, providerKey string) *pkey {
	k := pv.keys[providerKey]
	if k == nil {
		k = &pkey{key: providerKey, pay: pay}
		pv.keys[providerKey] = k
	}
	return k
}

func (pv *provider) call(pay string, c effect.Call) ([]byte, error) {
	pv.mu.Lock()
	k := pv.key(pay, c.ProviderKey)
	settled := k.settled
	k.calls++
	now := time.Now()
	if k.first.IsZero() {
		k.first = now
	}
	a := answerSucceed
	if s := pv.script(pay); k.calls <= len(s) {
		a = s[k.calls-1]
	}
	kept := pv.cfg.keyTTL > 0 && now.Sub(k.first) < pv.cfg.keyTTL
	var res []byte
	var err error
	switch {
	case a == answerTimeoutBefore:
		err = errProviderTimeout
	case kept && k.executions > 0: // an idempotent repeat: the stored answer
		res = []byte("charged " + pay)
	case kept && k.refused:
		err = effect.Refused(errors.New("provider: card declined"), []byte("declined "+pay))
	case a == answerRefuse:
		k.refused = true
		err = effect.Refused(errors.New("provider: card declined"), []byte("declined "+pay))
	default: // executes
		k.executions++
		res = []byte("charged " + pay)
	}
	if a == answerTimeoutAfter {
		res, err = nil, errProviderTimeout
	}
	switch {
	case err == nil:
		k.settled = "succeeded"
	case errors.Is(err, effect.ErrRefused):
		k.settled = "refused"
	}
	k.log = append(k.log, fmt.Sprintf("call %d (attempt %d, token %d): %v → executions %d", k.calls, c.Attempt, c.Token, a, k.executions))
	executions := k.executions
	others := pv.executedKeys(pay)
	pv.mu.Unlock()
	pv.count("provider calls " + a.String())
	if settled != "" {
		pv.rep.violation(checkStepSettled, pay, "payment %s: provider key %s called again (attempt %d) after it was %s", pay, c.ProviderKey, c.Attempt, settled)
	}
	if executions > 1 {
		pv.rep.violation(checkStepExecutedOnce, pay, "payment %s: the provider executed key %s %d times (key TTL %v, read-back %v): %s",
			pay, c.ProviderKey, executions, pv.cfg.keyTTL, pv.cfg.readBack, pv.describe(pay))
	}
	if len(others) > 1 {
		pv.rep.violation(checkStepExecutedOnce, pay, "payment %s: the provider executed it under %d provider keys: %s", pay, len(others), pv.describe(pay))
	}
	return res, err
}

func (pv *provider) readBack(pay string, c effect.Call) effect.ReadBack {
	pv.mu.Lock()
	k := pv.key(pay, c.ProviderKey)
	settled := k.settled
	k.reads++
	var rb effect.ReadBack
	switch {
	case k.executions > 0:
		rb = effect.ReadBack{Status: effect.Executed, Result: []byte("charged " + pay)}
		k.settled = "succeeded"
	case k.refused:
		rb = effect.ReadBack{Status: effect.Declined, Result: []byte("declined " + pay)}
		k.settled = "refused"
	}
	k.log = append(k.log, fmt.Sprintf("read-back %d (after attempt %d): %v", k.reads, c.Attempt, rb.Status))
	pv.mu.Unlock()
	pv.count("provider read-backs " + rb.Status.String())
	if settled != "" {
		pv.rep.violation(checkStepSettled, pay, "payment %s: provider key %s read back (after attempt %d) after it was %s", pay, c.ProviderKey, c.Attempt, settled)
	}
	return rb
}

// script is stepScript, or for a payment that must go to retry none: its
// requests succeed (a refusal would dead-letter it at once, an unknown
// outcome may leave it in doubt); pv.mu is held.
func (pv *provider) script(pay string) []answer {
	if pv.retried[pay] {
		return nil
	}
	return stepScript(pv.seed, pay)
}

// mustRetry says that pay must go to retry: its requests succeed.
func (pv *provider) mustRetry(pay string) {
	pv.mu.Lock()
	defer pv.mu.Unlock()
	pv.retried[pay] = true
}

// executedKeys returns the provider keys the provider executed for pay;
// pv.mu is held.
func (pv *provider) executedKeys(pay string) []string {
	var out []string
	for _, k := range pv.keys {
		if k.pay == pay && k.executions > 0 {
			out = append(out, k.key)
		}
	}
	sort.Strings(out)
	return out
}

// executed reports whether the provider executed pay's step.
func (pv *provider) executed(pay string) bool {
	pv.mu.Lock()
	defer pv.mu.Unlock()
	return len(pv.executedKeys(pay)) > 0
}

// succeeded reports whether a step of pay was settled as succeeded (by
// the provider's answer or its read-back).
func (pv *provider) succeeded(pay string) bool {
	pv.mu.Lock()
	defer pv.mu.Unlock()
	for _, k := range pv.keys {
		if k.pay == pay && k.settled == "succeeded" {
			return true
		}
	}
	return false
}

// describe says what the provider saw of pay.
func (pv *provider) describe(pay string) string {
	pv.mu.Lock()
	defer pv.mu.Unlock()
	var parts []string
	for _, k := range pv.keys {
		if k.pay == pay {
			parts = append(parts, fmt.Sprintf("provider key %s: %s", k.key, strings.Join(k.log, ", ")))
		}
	}
	sort.Strings(parts)
	return fmt.Sprintf("script %v; %s", pv.script(pay), strings.Join(parts, "; "))
}

// checkLetter checks a dead letter: one in doubt only when the step has no
// read-back and the provider no longer keeps its key.
func (pv *provider) checkLetter(pay string, l consumer.Letter) {
	if l.Cause != consumer.CauseInDoubt {
		return
	}
	pv.count("letters in doubt")
	var e *effect.InDoubtError
	switch {
	case !pv.cfg.on:
		pv.rep.violation(checkStepInDoubt, pay, "payment %s dead-lettered in doubt without a step: %v", pay, l.Reason)
	case errors.Is(l.Reason, consumer.ErrStale):
		pv.count("letters in doubt, stale with steps")
		if l.Entity.Name == "" || !strings.Contains(l.Reason.Error(), "provider step") {
			pv.rep.violation(checkStepInDoubt, pay, "payment %s dead-lettered in doubt as stale, its letter naming no entity or no step: %v", pay, l.Reason)
		}
	case !errors.As(l.Reason, &e):
		pv.rep.violation(checkStepInDoubt, pay, "payment %s dead-lettered in doubt, its reason not an *effect.InDoubtError: %v", pay, l.Reason)
	case pv.cfg.readBack:
		pv.rep.violation(checkStepInDoubt, pay, "payment %s dead-lettered in doubt though its step has a read-back: %v; %s", pay, l.Reason, pv.describe(pay))
	case e.SinceFirstAttempt+stepLease < pv.cfg.keyTTL:
		pv.rep.violation(checkStepInDoubt, pay, "payment %s dead-lettered in doubt %v after its first attempt, while the provider keeps keys %v: %v; %s",
			pay, e.SinceFirstAttempt, pv.cfg.keyTTL, l.Reason, pv.describe(pay))
	}
}

// resolveInDoubt is an operator resolving pay's steps in doubt, before a
// redrive, with what the provider says happened; it returns how many.
func (pv *provider) resolveInDoubt(ctx context.Context, j dedup.Journal, pay string) (int, error) {
	recs, err := j.Steps(ctx, dedup.StepFilter{States: []dedup.StepState{dedup.StepInDoubt}, Limit: 1000})
	if err != nil {
		return 0, err
	}
	n := 0
	for _, rec := range recs {
		pv.mu.Lock()
		k := pv.keys[rec.ProviderKey]
		mine := k != nil && k.pay == pay
		out := dedup.StepOutcome{State: dedup.StepFailed, Result: []byte("declined " + pay), Error: "seams operator: the provider has no record"}
		if mine && k.executions > 0 {
			out = dedup.StepOutcome{State: dedup.StepSucceeded, Result: []byte("charged " + pay), Error: "seams operator: the provider executed it"}
		}
		pv.mu.Unlock()
		if !mine {
			continue
		}
		ok, err := j.ResolveStep(ctx, rec.Ref, rec.Token, out)
		if err != nil {
			return n, err
		}
		if ok {
			pv.mu.Lock()
			k.settled = "resolved " + out.State.String()
			pv.mu.Unlock()
			n++
		}
	}
	return n, nil
}
