package consumer_test

import (
	"context"
	"sync"
	"testing"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/memstore"
)

// TestHandlersSeeTheDedupKey: a Handler and a BatchHandler see on each
// message the key its effects commit under — the consumer's Name plus the
// tenant as scope, the key function's ID — and a message nobody keyed has
// none.
func TestHandlersSeeTheDedupKey(t *testing.T) {
	if _, ok := consumertest.Message("payments", 0, 0, "", `{}`).DedupKey(); ok {
		t.Fatal("a message built by hand has a dedup key")
	}
	var mu sync.Mutex
	seen := map[dedup.Key]int{}
	record := func(m *consumer.Message) {
		k, ok := m.DedupKey()
		if !ok {
			t.Errorf("%s: no dedup key in the handler", m.Coordinates())
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
