package consumer_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/consumer/wire"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/memstore"
)

// TestHandlersSeeTheDedupKey: a Handler and a BatchHandler see on each
// message the key its effects commit under — the consumer's Name plus the
// tenant as scope, the key function's ID — and the fingerprint it was
// claimed with; a message nobody keyed has neither.
func TestHandlersSeeTheDedupKey(t *testing.T) {
	if _, ok := consumertest.Message("payments", 0, 0, "", `{}`).DedupKey(); ok {
		t.Fatal("a message built by hand has a dedup key")
	}
	if _, ok := consumertest.Message("payments", 0, 0, "", `{}`).DedupFingerprint(); ok {
		t.Fatal("a message built by hand has a fingerprint")
	}
	var mu sync.Mutex
	seen := map[dedup.Key]int{}
	record := func(m *consumer.Message) {
		k, ok := m.DedupKey()
		if !ok {
			t.Errorf("%s: no dedup key in the handler", m.Coordinates())
		}
		if fp, ok := m.DedupFingerprint(); !ok || fp != dedup.FingerprintOf(m.Value) {
			t.Errorf("%s: fingerprint %v (%v) in the handler, want the payload's %v", m.Coordinates(), fp, ok, dedup.FingerprintOf(m.Value))
		}
		mu.Lock()
		seen[k]++
		mu.Unlock()
	}
	msgs := func() []*consumer.Message {
		var out []*consumer.Message
		for i, tenant := range []string{"acme", "acme", "globex"} {
			m := consumertest.Message("payments", 0, int64(i), "", payment(i))
			m.Headers = []consumer.Header{{Key: "tenant", Value: []byte(tenant)}}
			out = append(out, m)
		}
		return out
	}
	want := map[dedup.Key]int{
		{Scope: "payments/acme", ID: "T00000"}: 1, {Scope: "payments/acme", ID: "T00001"}: 1, {Scope: "payments/globex", ID: "T00002"}: 1,
	}
	check := func(t *testing.T) {
		t.Helper()
		mu.Lock()
		defer mu.Unlock()
		if len(seen) != len(want) {
			t.Fatalf("handlers saw keys %v, want %v", seen, want)
		}
		for k, n := range want {
			if seen[k] != n {
				t.Fatalf("handlers saw keys %v, want %v", seen, want)
			}
		}
		clear(seen)
	}

	t.Run("Handler", func(t *testing.T) {
		cfg := baseConfig(func(_ context.Context, _ *memstore.Tx, m *consumer.Message) error {
			record(m)
			return nil
		})
		cfg.Tenant = consumer.ByHeader("tenant")
		consumertest.Run(t, cfg, consumertest.Script{}, msgs()...)
		check(t)
	})
	t.Run("BatchHandler", func(t *testing.T) {
		cfg := baseConfig(nil)
		cfg.Handler = nil
		cfg.BatchHandler = consumer.BatchHandlerFunc[*memstore.Tx](func(_ context.Context, _ *memstore.Tx, ms []*consumer.Message) error {
			for _, m := range ms {
				record(m)
			}
			return nil
		})
		cfg.Tenant = consumer.ByHeader("tenant")
		consumertest.Run(t, cfg, consumertest.Script{}, msgs()...)
		check(t)
	})
}

// TestRetryCopyGivesHandlersItsCarriedFingerprint: the identity a retry
// copy carries includes its fingerprint, and the handler sees that one on
// the copy — the one its original was claimed with — not one derived again
// from the copy. (The copy's carried fingerprint is rewritten here so that
// the two can be told apart.)
func TestRetryCopyGivesHandlersItsCarriedFingerprint(t *testing.T) {
	carried := dedup.FingerprintOf([]byte("the original's"))
	var mu sync.Mutex
	var seen []dedup.Fingerprint
	failed := false
	cfg := baseConfig(func(_ context.Context, _ *memstore.Tx, m *consumer.Message) error {
		if k, _ := m.DedupKey(); k.ID != "T00002" {
			return nil
		}
		fp, _ := m.DedupFingerprint()
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, fp)
		if !failed {
			failed = true
			return consumer.Retryable(errors.New("provider down"))
		}
		return nil
	})
	base := consumertest.NewSource(consumertest.Script{})
	src := &retrySource{Source: base, lineage: true}
	sink := &retrySink{src: src, edit: func(hs []consumer.Header) []consumer.Header {
		return withHeader(hs, wire.MetaFingerprint, carried.String())
	}}
	cfg.Source, cfg.DeadLetter, cfg.Clock = src, &consumertest.DeadLetters{}, consumertest.NewClock()
	cfg.BatchSize = 1
	cfg.Retries = consumer.NonBlocking{Attempts: 1, Delays: []time.Duration{time.Second}, Sink: sink}
	c, err := consumer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	base.Push(payments(5)...)
	drive(t, c, base)
	mu.Lock()
	defer mu.Unlock()
	want := []dedup.Fingerprint{dedup.FingerprintOf([]byte(payment(2))), carried}
	if !slices.Equal(seen, want) {
		t.Fatalf("the handler saw fingerprints %v for payment 2 and its copy, want %v", seen, want)
	}
}
