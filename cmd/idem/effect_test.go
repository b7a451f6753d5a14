package main

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/adapters/kafka"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/effect"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/internal/testenv/pgtest"
)

// TestRedriveInDoubtAfterResolveStep (issue 39, seam 39.2): the tenant is
// taken from the topic. A refund executes and its answer is lost; the
// provider keeps no keys and has no query, so the step goes in doubt and
// the message is dead-lettered in_doubt. An operator learns from the
// provider that it executed and resolves the step (ResolveStep, with the
// token the letter names); idem redrive brings the letter back. The
// redriven copy, on the original's topic, finds the resolved step under
// the same scope and key: the payment is booked with the resolution's
// reference, and the provider is never called again.
func TestRedriveInDoubtAfterResolveStep(t *testing.T) {
	p := newPayments(t)
	store := pgtest.Store(t, p.pool, p.schema)
	var mu sync.Mutex
	calls := map[string]int{}
	step := effect.Step{Name: "refund", Call: func(_ context.Context, c effect.Call) ([]byte, error) {
		mu.Lock()
		defer mu.Unlock()
		calls[c.ProviderKey]++
		return nil, errors.New("read tcp: i/o timeout") // executed, the answer lost
	}}

	src, err := kafka.New(kafka.Config{Brokers: p.brokers, Topics: []string{p.topic}, Group: p.topic, DeadLetterTopic: p.dlq, Logger: testenv.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	cfg := consumer.Config[pgx.Tx]{Name: "pay", Source: src, DeadLetter: src, Store: store, Logger: testenv.Logger(t),
		Key:    consumer.ByJSONField("txn_id"),
		Tenant: func(m *consumer.Message) (string, error) { return m.Topic, nil },
		Retry:  consumer.RetryPolicy{Initial: 10 * time.Millisecond, Max: 20 * time.Millisecond, MaxAttempts: 5},
		Handler: consumer.HandlerFunc[pgx.Tx](func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			var cb struct {
				TxnID string `json:"txn_id"`
			}
			if err := json.Unmarshal(m.Value, &cb); err != nil {
				return consumer.Permanent(err)
			}
			ref, err := effect.Do(ctx, store, m, step)
			if err != nil {
				return err
			}
			_, err = tx.Exec(ctx, `INSERT INTO ledger VALUES ($1, length($2::text))`, cb.TxnID, string(ref))
			return err
		})}
	c, err := consumer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	p.consumer = c

	p.produce("R1")
	p.waitFor("the refund dead-lettered", func(s consumer.Stats) bool { return s.DeadLettered == 1 })
	k := dedup.Key{Scope: "pay/" + p.topic, ID: "R1"}
	ref := dedup.StepRef{Key: k, Step: "refund"}
	rec, ok, err := store.Step(context.Background(), ref)
	if err != nil || !ok || rec.State != dedup.StepInDoubt {
		t.Fatalf("step %+v (%v, %v): want in doubt in the original's scope", rec, ok, err)
	}
	// The operator asked the provider: it executed, reference "ref-0001".
	resolved, err := store.ResolveStep(context.Background(), ref, rec.Token, dedup.StepOutcome{State: dedup.StepSucceeded, Result: []byte("ref-0001"), Error: "operator"})
	if err != nil || !resolved {
		t.Fatalf("ResolveStep: %v, %v", resolved, err)
	}

	code, out, errOut := idem(t, "", p.envs, "redrive", "--topic", p.dlq, "--json")
	rd := decode[redriveJSON](t, out)
	if code != exitOK || rd.Counts["sent"] != 1 {
		t.Fatalf("redrive: exit %d, %+v, %s", code, rd, errOut)
	}
	p.waitFor("the redriven copy applied", func(s consumer.Stats) bool { return s.Applied == 1 })
	if got := p.ledger(); got["R1"] != 1 || len(got) != 1 {
		t.Fatalf("ledger %v, want R1 once", got)
	}
	var amount int64
	if err := p.pool.QueryRow(context.Background(), `SELECT amount FROM ledger WHERE txn_id = 'R1'`).Scan(&amount); err != nil || amount != int64(len("ref-0001")) {
		t.Fatalf("booked %d (%v), want the resolution's reference", amount, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(calls) != 1 || calls[effect.DefaultProviderKey(k, "refund")] != 1 {
		t.Fatalf("provider calls %v, want one, under the original's provider key", calls)
	}
}
