package effect_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/dedup/memstore"
	"github.com/idemkit/idem/effect"
)

// TestConsumerDeadLettersInDoubt: inside a consumer, Do takes the key the
// consumer derived; a duplicate delivery is not called again, an unknown
// outcome is retried, and one that can be neither found out nor repeated
// is dead-lettered with cause in_doubt and its facts, its key left free.
func TestConsumerDeadLettersInDoubt(t *testing.T) {
	store := memstore.New(memstore.Config{})
	b := newBank()
	b.fault = func(int) error { return nil }
	timeouts := map[string]bool{}
	step := effect.Step{Name: "refund", KeyTTL: 0, Call: func(ctx context.Context, c effect.Call) ([]byte, error) {
		res, err := b.call(ctx, c)
		if timeouts[c.ProviderKey] {
			return nil, errTimeout
		}
		return res, err
	}}
	h := func(ctx context.Context, tx *memstore.Tx, m *consumer.Message) error {
		k, _ := m.DedupKey()
		if k.ID == "lost" {
			timeouts[effect.DefaultProviderKey(k, "refund")] = true
		}
		_, err := effect.Do(ctx, store, m, step)
		return err
	}
	res := consumertest.Run(t, consumer.Config[*memstore.Tx]{Name: "refunds", Store: store, Handler: consumer.HandlerFunc[*memstore.Tx](h),
		Key: consumer.ByJSONField("id"), Retry: consumer.RetryPolicy{MaxAttempts: 5}},
		consumertest.Script{MinDeliveries: 3, MaxDeliveries: 3},
		consumertest.Message("refunds", 0, 0, "", `{"id":"ok"}`),
		consumertest.Message("refunds", 0, 1, "", `{"id":"lost"}`))
	if calls, executions := b.total(); calls != 2 || executions != 2 {
		t.Fatalf("provider saw %d calls, %d executions; want one of each refund", calls, executions)
	}
	if len(res.DeadLetters) != 3 {
		t.Fatalf("%d letters, want the 3 deliveries of the lost refund: %v", len(res.DeadLetters), res)
	}
	for _, l := range res.DeadLetters {
		if l.Cause != consumer.CauseInDoubt || l.Key.ID != "lost" || !errors.Is(l.Reason, effect.ErrInDoubt) ||
			!strings.Contains(l.Reason.Error(), "provider key "+effect.DefaultProviderKey(l.Key, "refund")) ||
			!strings.Contains(l.Reason.Error(), "i/o timeout") {
			t.Fatalf("letter %v: %v", l.Cause, l.Reason)
		}
	}
	if res.Stats.Applied != 1 {
		t.Fatalf("applied %d, want the refund that went through", res.Stats.Applied)
	}
}
