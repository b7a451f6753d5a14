package rocketmq_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/adapters/rocketmq"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/effect"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/internal/testenv/rmqtest"
)

// TestRetriedMessageFindsItsStep (issue 39, seam 39.7): the tenant is
// taken from the topic. T00001's refund executes and its answer is lost;
// its retries run out and the lane is stopped, so the client gives it back
// and it comes back through %RETRY%<group>. The copy must find the step
// its first delivery began — same scope, key and provider key — read it
// back, and not call the provider again.
func TestRetriedMessageFindsItsStep(t *testing.T) {
	t.Parallel()
	topic := oneQueue(t, 1, 2)
	group := name(t, "g")
	rmqtest.Shared(t).CreateTopic(t, "%RETRY%"+group, 1)
	d := newDB(t)
	src := source(t, rocketmq.Config{Group: group, Topics: []string{topic}, RetryDelayLevel: 1})

	var mu sync.Mutex
	calls := map[string]int{}     // requests per provider key
	executed := map[string]bool{} // the provider's ledger
	lost := true                  // T00001's first answer is lost
	insert := insertEffect(d, 1)
	step := func(txn string) effect.Step {
		return effect.Step{Name: "refund", KeyTTL: time.Hour, Lease: 5 * time.Second,
			Call: func(_ context.Context, c effect.Call) ([]byte, error) {
				mu.Lock()
				defer mu.Unlock()
				calls[c.ProviderKey]++
				executed[c.ProviderKey] = true
				if txn == "T00001" && lost {
					lost = false
					return nil, errors.New("read tcp: i/o timeout")
				}
				return []byte("ok"), nil
			},
			ReadBack: func(_ context.Context, c effect.Call) (effect.ReadBack, error) {
				mu.Lock()
				defer mu.Unlock()
				if executed[c.ProviderKey] {
					return effect.ReadBack{Status: effect.Executed, Result: []byte("ok")}, nil
				}
				return effect.ReadBack{Status: effect.NotFound}, nil
			}}
	}
	r := start(t, consumer.Config[pgx.Tx]{
		Name: "ledger", Source: src, DeadLetter: src, Store: d.store, Key: consumer.ByJSONField("txn_id"),
		Tenant: func(m *consumer.Message) (string, error) { return m.Topic, nil },
		Handler: consumer.HandlerFunc[pgx.Tx](func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			txn, err := consumer.ByJSONField("txn_id")(m)
			if err != nil {
				return consumer.Permanent(err)
			}
			if _, err := effect.Do(ctx, d.store, m, step(txn)); err != nil {
				return err
			}
			return insert(ctx, tx, m)
		}),
		Retry: consumer.RetryPolicy{MaxAttempts: 1}, OnExhausted: consumer.StopLaneOnExhausted,
		Clock: consumertest.NewClock(), Logger: testLogger(t),
	})
	testenv.WaitUntil(t, time.Minute, "2 effects", func() bool { return d.count(t, "") >= 2 })
	r.Stop(t)
	if n := d.count(t, "key = 'T00001' AND starts_with(queue, $1)", "%RETRY%"+group+"/"); n != 1 {
		t.Fatalf("T00001 was not applied once from the retry topic (%d)", n)
	}
	for _, k := range []string{"T00001", "T00002"} {
		if n := effectsOf(t, d, k); n != 1 {
			t.Errorf("%s: %d effects, want 1", k, n)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(calls) != 2 {
		t.Fatalf("provider keys called %v, want 2", calls)
	}
	for k, n := range calls {
		if n != 1 {
			t.Fatalf("provider key %s called %d times, want once", k, n)
		}
	}
	rec, ok, err := d.store.Step(context.Background(), dedup.StepRef{Key: dedup.Key{Scope: "ledger/" + topic, ID: "T00001"}, Step: "refund"})
	if err != nil || !ok || rec.State != dedup.StepSucceeded || rec.Attempts != 1 {
		t.Fatalf("step of T00001 in the original's scope: %+v %v %v; want succeeded after 1 attempt", rec, ok, err)
	}
}
