package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/consumer/wire"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/memstore"
)

// A message's identity is decided at its first delivery and travels with
// its copies: these tests key copies under a tenant taken from the topic,
// which a copy on a retry topic would otherwise change.

// tenantRun runs payments 0..4 of topic pay with the tenant taken from the
// topic; payment 2's first COMMIT is reported failed after it committed,
// so it goes to retry and its copy comes back on pay.retry. edit rewrites
// the copy's headers (nil: as written). It returns the effects, the
// consumer's stats and every topic the Tenant function saw.
func tenantRun(t *testing.T, edit func([]consumer.Header) []consumer.Header) (*effects, consumer.Stats, []string) {
	t.Helper()
	eff := newEffects()
	store := &lyingStore{Store: memstore.New(memstore.Config{})}
	cfg := baseConfig(func(ctx context.Context, tx *memstore.Tx, m *consumer.Message) error {
		if m.Offset == 2 && m.Topic == "pay" {
			store.target.Store(true)
		}
		return eff.apply(ctx, tx, m)
	})
	var mu sync.Mutex
	var seen []string
	cfg.Tenant = func(m *consumer.Message) (string, error) {
		mu.Lock()
		seen = append(seen, m.Topic)
		mu.Unlock()
		return m.Topic, nil
	}
	base := consumertest.NewSource(consumertest.Script{})
	src := &retrySource{Source: base, lineage: true}
	sink := &retrySink{src: src, edit: edit}
	cfg.Store, cfg.Source, cfg.DeadLetter, cfg.Clock = store, src, &consumertest.DeadLetters{}, consumertest.NewClock()
	cfg.BatchSize = 1
	cfg.Retries = consumer.NonBlocking{Attempts: 1, Delays: []time.Duration{time.Second}, Sink: sink}
	c, err := consumer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	base.Push(payments(5)...)
	drive(t, c, base)
	if trips := sink.trips(); len(trips) != 1 || trips[0].Key != (dedup.Key{Scope: "payments/pay", ID: "T00002"}) {
		t.Fatalf("trips %+v, want one, of payments/pay T00002", trips)
	}
	mu.Lock()
	defer mu.Unlock()
	return eff, c.Stats(), slices.Compact(slices.Sorted(slices.Values(seen)))
}

// withHeader returns hs with header k set to v (removed when v is "").
func withHeader(hs []consumer.Header, k, v string) []consumer.Header {
	out := slices.DeleteFunc(slices.Clone(hs), func(h consumer.Header) bool { return h.Key == k })
	if v != "" {
		out = append(out, consumer.Header{Key: k, Value: []byte(v)})
	}
	return out
}

// TestRetryCopyKeyedByItsCarriedIdentity: the copy carries its
// original's scope (payments/pay) and key, and is keyed by them, not by
// its own topic: skipped, the payment applied once.
func TestRetryCopyKeyedByItsCarriedIdentity(t *testing.T) {
	eff, st, _ := tenantRun(t, nil)
	eff.check(t, txnIDs(5))
	if st.Duplicates != 1 {
		t.Errorf("%d duplicates, want 1 (the copy)", st.Duplicates)
	}
}

// TestRetryCopyWithoutIdentityKeyedFromItsOriginal: a copy written before
// copies carried their identity is keyed from its original's view: the
// Tenant function sees the original's topic, never the retry topic.
func TestRetryCopyWithoutIdentityKeyedFromItsOriginal(t *testing.T) {
	eff, st, seen := tenantRun(t, func(hs []consumer.Header) []consumer.Header {
		for _, k := range []string{wire.MetaKeyScope, wire.MetaKey, wire.MetaFingerprint} {
			hs = withHeader(hs, k, "")
		}
		return hs
	})
	eff.check(t, txnIDs(5))
	if st.Duplicates != 1 {
		t.Errorf("%d duplicates, want 1 (the copy)", st.Duplicates)
	}
	if !slices.Equal(seen, []string{"pay"}) {
		t.Errorf("the Tenant function saw topics %q, want only the original's, pay", seen)
	}
}

// TestRetryCopyOfAnotherScopeRefused: a copy carrying a scope that is not
// this consumer's (another consumer's name) is not keyed by it: it is
// keyed from its original's view, and skipped.
func TestRetryCopyOfAnotherScopeRefused(t *testing.T) {
	for _, scope := range []string{"ledger/pay", "payments", "payments/"} {
		t.Run(scope, func(t *testing.T) {
			eff, st, _ := tenantRun(t, func(hs []consumer.Header) []consumer.Header {
				hs = withHeader(hs, wire.MetaKeyScope, scope)
				return withHeader(hs, wire.MetaKey, "forged")
			})
			eff.check(t, txnIDs(5))
			if st.Duplicates != 1 {
				t.Errorf("%d duplicates, want 1 (the copy)", st.Duplicates)
			}
		})
	}
}

// TestRedrivenCopyCannotChangeItsTenant: a redriven copy lies on its
// original's topic, which any producer there can write. A copy naming
// another tenant's scope is keyed by the tenant its topic gives: a
// duplicate of its original, never a claim in the other tenant's scope.
func TestRedrivenCopyCannotChangeItsTenant(t *testing.T) {
	orig := consumertest.Message("pay", 0, 0, "", payment(0))
	copy := redriven(orig, 1, 1)
	copy.Headers = withHeader(copy.Headers, wire.MetaKeyScope, "payments/other")
	copy.Headers = withHeader(copy.Headers, wire.MetaKey, "T00000")
	eff := newEffects()
	cfg := baseConfig(eff.apply)
	cfg.Tenant = func(m *consumer.Message) (string, error) { return m.Topic, nil }
	res := consumertest.Run(t, cfg, consumertest.Script{}, orig, copy)
	eff.check(t, []string{"T00000"})
	if res.Stats.Duplicates != 1 {
		t.Errorf("%d duplicates, want 1 (the copy)", res.Stats.Duplicates)
	}
}

// TestNonBlockingRefusesAShorterRetention: a copy that comes back after its
// applied original's key was purged would be applied again, so New refuses
// a store that keeps a scope's keys for less than the retries' horizon
// (the sum of the delays plus RetryMargin), naming both.
func TestNonBlockingRefusesAShorterRetention(t *testing.T) {
	delays := []time.Duration{time.Minute, 5 * time.Minute} // horizon: 6m + 15m = 21m
	for _, c := range []struct {
		name     string
		tenant   bool
		def      time.Duration
		perScope map[string]time.Duration
		want     string // "" : accepted
	}{
		{name: "forever", def: 0},
		{name: "a day", def: 24 * time.Hour},
		{name: "ten minutes", def: 10 * time.Minute, want: `a horizon of 21m0s (their sum plus 15m0s), but the store keeps the keys of scope "payments" for 10m0s`},
		{name: "own scope shorter", def: 0, perScope: map[string]time.Duration{"payments": 20 * time.Minute, "other": time.Minute},
			want: `keeps the keys of scope "payments" for 20m0s`},
		{name: "another scope shorter", def: 0, perScope: map[string]time.Duration{"other": time.Minute}},
		{name: "tenant default", tenant: true, def: time.Hour, perScope: map[string]time.Duration{"payments/acme": time.Minute},
			want: `keeps the keys of scope "payments/acme" for 1m0s`},
		{name: "tenant forever", tenant: true, def: 0, perScope: map[string]time.Duration{"payments": time.Minute}},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := baseConfig(newEffects().apply)
			cfg.Store = memstore.New(memstore.Config{Retention: c.def, ScopeRetention: c.perScope})
			src := &retrySource{Source: consumertest.NewSource(consumertest.Script{}), lineage: true}
			cfg.Source, cfg.DeadLetter = src, &consumertest.DeadLetters{}
			cfg.Retries = consumer.NonBlocking{Delays: delays, Sink: &retrySink{src: src}}
			if c.tenant {
				cfg.Tenant = func(m *consumer.Message) (string, error) { return m.Topic, nil }
			}
			_, err := consumer.New(cfg)
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("New: %v, want it accepted", err)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
				t.Fatalf("New: %v, want %q", err, c.want)
			}
		})
	}
}

// tooLargeSink refuses every copy for its size, as a broker would refuse
// one past its limit.
type tooLargeSink struct{ calls atomic.Int32 }

func (s *tooLargeSink) Retry(context.Context, consumer.RetryLetter) error {
	s.calls.Add(1)
	return fmt.Errorf("broker: %w", consumer.ErrRetryTooLarge)
}

// TestRetryCopyTooLargeIsDeadLettered: a copy the broker refuses for its
// size cannot be written however often the write is retried: the message
// is dead-lettered (exhausted, the reason saying why), once, and the lane
// goes on.
func TestRetryCopyTooLargeIsDeadLettered(t *testing.T) {
	eff := newEffects()
	cfg := baseConfig(eff.failOn("T00001", consumer.Retryable(errors.New("the bank is down"))))
	base := consumertest.NewSource(consumertest.Script{})
	sink := &tooLargeSink{}
	dl := &consumertest.DeadLetters{}
	cfg.Source, cfg.DeadLetter, cfg.Clock = &retrySource{Source: base, lineage: true}, dl, consumertest.NewClock()
	cfg.Retries = consumer.NonBlocking{Attempts: 1, Delays: []time.Duration{time.Second}, Sink: sink}
	c, err := consumer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	base.Push(payments(3)...)
	drive(t, c, base)
	eff.check(t, txnIDs(3, 1))
	letters := dl.Letters()
	if len(letters) != 1 || letters[0].Cause != consumer.CauseExhausted || !errors.Is(letters[0].Reason, consumer.ErrRetryTooLarge) {
		t.Fatalf("letters %+v, want one, exhausted, for a copy too large", letters)
	}
	if n := sink.calls.Load(); n != 1 {
		t.Errorf("the sink was called %d times, want 1", n)
	}
}

// TestForgedCarriedKeyNeverSkipsAGenuineMessage: a redriven copy lies on
// its original's topic, which any producer there can write. Its lineage
// passes (it names an earlier offset of its own partition), but the key it
// carries (idem-key) names a later message that has not been seen yet.
// Honouring that key claims the later message's key first: the genuine
// message at offset 2 is then a duplicate and never applied. The carried
// key of a copy on the original topic must be the key its lineage gives
// (here ByMessageID: the original's position), never any other.
func TestForgedCarriedKeyNeverSkipsAGenuineMessage(t *testing.T) {
	for _, c := range []struct {
		name   string
		tenant bool
		scope  string
	}{
		{name: "no tenant", scope: "payments"},
		{name: "tenant from the topic", tenant: true, scope: "payments/pay"},
	} {
		t.Run(c.name, func(t *testing.T) {
			genuine := consumertest.Message("pay", 0, 2, "", payment(2))
			forged := redriven(consumertest.Message("pay", 0, 0, "", payment(0)), 1, 1)
			forged.Value = []byte(payment(2)) // the attacker knows, or guesses, the payload
			forged.Headers = withHeader(forged.Headers, wire.MetaKeyScope, c.scope)
			forged.Headers = withHeader(forged.Headers, wire.MetaKey, genuine.ID)
			forged.Headers = withHeader(forged.Headers, wire.MetaFingerprint, "")
			var mu sync.Mutex
			applied := map[int64]int{}
			cfg := consumer.Config[*memstore.Tx]{
				Name: "payments", Store: memstore.New(memstore.Config{}), Key: consumer.ByMessageID(), Logger: quiet,
				DeadLetter: &consumertest.DeadLetters{},
				Handler: consumer.HandlerFunc[*memstore.Tx](func(_ context.Context, tx *memstore.Tx, m *consumer.Message) error {
					tx.OnCommit(func() { mu.Lock(); applied[m.Offset]++; mu.Unlock() })
					return nil
				}),
			}
			if c.tenant {
				cfg.Tenant = func(m *consumer.Message) (string, error) { return m.Topic, nil }
			}
			orig := consumertest.Message("pay", 0, 0, "", payment(0))
			res := consumertest.Run(t, cfg, consumertest.Script{}, orig, forged, genuine)
			mu.Lock()
			defer mu.Unlock()
			if applied[2] != 1 {
				t.Errorf("the genuine message pay/0/2 applied %d times, want 1: a forged redriven copy at pay/0/1 "+
					"carrying idem-key %q made it a duplicate before it was seen (stats %+v)", applied[2], genuine.ID, res.Stats)
			}
		})
	}
}

// TestRetryCopyPastItsHorizonAfterThePurge: New checks that a store keeps
// keys longer than the retries' horizon (RetryHorizon), which holds only
// while copies come back within it. They need not: retry topics start at
// their first record (a group whose offsets expired, a renamed group, a
// consumer stopped for a day). A payment is applied at t0 (its COMMIT's
// outcome unknown, so a copy went to retry); the store keeps keys 1h and
// purges; the copy arrives 2h after its first failure, carrying its
// original's identity and its first-failure time. Its key is gone, and it
// is applied a second time: a copy past its horizon must not be applied
// blind (dead-lettered, say), since its original may have been applied.
func TestRetryCopyPastItsHorizonAfterThePurge(t *testing.T) {
	var mu sync.Mutex
	t0 := time.Now()
	now := t0
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	store := memstore.New(memstore.Config{Retention: time.Hour, Now: clock})
	eff := newEffects()
	var dl *consumertest.DeadLetters
	newConsumer := func() (*consumer.Consumer[*memstore.Tx], *consumertest.Source) {
		cfg := baseConfig(eff.apply)
		base := consumertest.NewSource(consumertest.Script{})
		src := &retrySource{Source: base, lineage: true}
		dl = &consumertest.DeadLetters{}
		cfg.Store, cfg.Source, cfg.DeadLetter, cfg.Clock = store, src, dl, nowClock(clock) // one clock: the consumer's and the store's
		cfg.Retries = consumer.NonBlocking{Attempts: 1, Delays: []time.Duration{time.Second}, Sink: &retrySink{src: src}}
		c, err := consumer.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return c, base
	}
	orig := consumertest.Message("pay", 0, 0, "", payment(0))
	c, base := newConsumer()
	base.Push(orig)
	drive(t, c, base)
	eff.check(t, []string{"T00000"})

	// The copy its unknown COMMIT sent to retry, as the sink wrote it at t0.
	k, fp := dedup.Key{Scope: "payments", ID: "T00000"}, dedup.FingerprintOf([]byte(payment(0)))
	headers, value := wire.Letter{Message: orig, Key: k, Fingerprint: fp, Cause: consumer.CauseExhausted, Reason: fmt.Errorf("commit: outcome unknown"), Attempts: 1}.
		RetryRecord(wire.Retry{Attempt: 1, Delay: time.Second, Due: t0.Add(time.Second), FirstFailure: t0})
	copy := consumertest.Message("pay.retry", 0, 0, "", string(value))
	copy.Headers = headers

	mu.Lock()
	now = t0.Add(2 * time.Hour)
	mu.Unlock()
	if n, err := store.Purge(context.Background(), 100); err != nil || n != 1 {
		t.Fatalf("purge: %d rows, %v; want the payment's key purged", n, err)
	}
	c, base = newConsumer()
	base.Push(copy)
	drive(t, c, base)
	if n := eff.count("T00000"); n != 1 {
		t.Errorf("payment T00000 applied %d times, want 1: its retry copy came back 2h after its first failure, "+
			"past the horizon %v and the store's 1h retention, and was applied again (stats %+v)",
			n, consumer.RetryHorizon([]time.Duration{time.Second}), c.Stats())
	}
	if l := dl.Letters(); len(l) != 1 || l[0].Cause != consumer.CauseExhausted || !errors.Is(l[0].Reason, consumer.ErrRetryExpired) {
		t.Errorf("dead letters %+v, want the copy's, cause exhausted, its reason wrapping ErrRetryExpired", l)
	}
}

// nowClock is a Clock that tells the time now gives and waits for real.
type nowClock func() time.Time

func (c nowClock) Now() time.Time { return c() }

func (nowClock) Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// TestKeyOrderedRedrivenCopyComesBackFromRetry: KeyOrdered, messages on
// lanes that name their broker (RocketMQ: topic/broker/queueId). A
// redriven copy of a payment fails once and goes to retry; its copy must
// come back and be applied. Its key was held under the lane-less id of
// its original (a redriven copy's origin has no lane), while the retry
// copy carries the lane the redriven copy was delivered on: the copy is
// not the key's head, follows its own hold into retry, untried, trip after
// trip, and is applied only once the hold expires (2 × delay + 1 minute).
func TestKeyOrderedRedrivenCopyComesBackFromRetry(t *testing.T) {
	orig := consumertest.Message("pay", 0, 5, "k", payment(5))
	red := redriven(orig, 12, 1)
	red.Lane = "pay/broker-b/0"
	var failed atomic.Bool
	eff := newEffects()
	cfg := baseConfig(func(ctx context.Context, tx *memstore.Tx, m *consumer.Message) error {
		if m.Topic == "pay" && !failed.Swap(true) {
			return consumer.Retryable(errors.New("the account service is down"))
		}
		return eff.apply(ctx, tx, m)
	})
	base := consumertest.NewSource(consumertest.Script{})
	src := &retrySource{Source: base, lineage: true}
	sink := &keyedRetrySink{retrySink{src: src}}
	cfg.Source, cfg.DeadLetter = src, &consumertest.DeadLetters{}
	cfg.Key = consumer.ByMessageID()
	cfg.BatchSize = 1
	cfg.Retry = consumer.RetryPolicy{MaxAttempts: 1}
	cfg.Retries = consumer.NonBlocking{Attempts: 1, Delays: []time.Duration{10 * time.Millisecond, 10 * time.Millisecond}, Sink: sink, KeyOrdered: true}
	c, err := consumer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	base.Push(red)
	runUntil(t, c, func() bool { return eff.count("T00005") > 0 })
	if applied, trips := eff.count("T00005"), len(sink.trips()); applied != 1 || trips != 1 {
		t.Errorf("the redriven copy's payment applied %d times after %d trips to retry, want once after 1: "+
			"its retry copy followed its own hold (stats %+v)", applied, trips, c.Stats())
	}
}

// keyedRetrySink is retrySink keeping the record key on the copy, as the
// brokers' sinks do (KeyOrdered orders by it).
type keyedRetrySink struct{ retrySink }

func (s *keyedRetrySink) Retry(_ context.Context, r consumer.RetryLetter) error {
	headers, value := wire.Letter(r.Letter).RetryRecord(r.Retry)
	s.mu.Lock()
	s.letters = append(s.letters, r)
	m := consumertest.Message("pay.retry", 0, s.offset, string(r.Message.Key), string(value))
	s.offset++
	s.mu.Unlock()
	m.Headers = headers
	s.src.Push(m)
	return nil
}
