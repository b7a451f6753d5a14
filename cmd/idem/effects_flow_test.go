package main

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
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

// refundProvider is a provider with its own ledger of what it executed,
// by provider key; it executes the refunds of lose and then times out.
type refundProvider struct {
	mu       sync.Mutex
	executed map[string]int
	lose     map[string]bool
}

func (b *refundProvider) call(_ context.Context, c effect.Call) ([]byte, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.executed[c.ProviderKey]++
	if b.lose[c.Ref.Key.ID] {
		return nil, errors.New("read tcp 127.0.0.1:4242: i/o timeout")
	}
	return []byte("ref-" + c.ProviderKey[:8]), nil
}

func (b *refundProvider) executions(pk string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.executed[pk]
}

// TestEffectsOperatorFlow is what an operator does with a call in doubt,
// on real Kafka and Postgres: a refund consumer calls a provider that
// keeps no keys and has no query; one refund executes and times out, is
// retried, found in doubt (no blind repeat) and dead-lettered in_doubt.
// idem effects lists it with its provider key; idem effects resolve
// records it as succeeded with the provider's reference; idem redrive
// sends the letter back, and the handler books the refund with that
// reference, without calling again. Checked on the provider's ledger
// (each refund executed once) and on the ledger table (each booked once).
func TestEffectsOperatorFlow(t *testing.T) {
	p := newPayments(t)
	ctx := testenv.Context(t, 3*time.Minute)
	if _, err := p.pool.Exec(ctx, `ALTER TABLE ledger ADD COLUMN reference text`); err != nil {
		t.Fatal(err)
	}
	store := pgtest.Store(t, p.pool, p.schema)
	bank := &refundProvider{executed: map[string]int{}, lose: map[string]bool{"LOST": true}}
	step := effect.Step{Name: "refund", Call: bank.call} // KeyTTL 0, no ReadBack: an unknown outcome is in doubt
	src, err := kafka.New(kafka.Config{Brokers: p.brokers, Topics: []string{p.topic}, Group: p.topic, DeadLetterTopic: p.dlq, Logger: testenv.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	c, err := consumer.New(consumer.Config[pgx.Tx]{Name: "pay", Source: src, DeadLetter: src, Store: store, Logger: testenv.Logger(t),
		Key:   consumer.ByJSONField("txn_id"),
		Retry: consumer.RetryPolicy{Initial: time.Millisecond, Max: 10 * time.Millisecond},
		Handler: consumer.HandlerFunc[pgx.Tx](func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			var cb struct {
				TxnID  string `json:"txn_id"`
				Amount int64  `json:"amount"`
			}
			if err := json.Unmarshal(m.Value, &cb); err != nil {
				return consumer.Permanent(err)
			}
			ref, err := effect.Do(ctx, store, m, step)
			if err != nil {
				return err
			}
			_, err = tx.Exec(ctx, `INSERT INTO ledger VALUES ($1, $2, $3)`, cb.TxnID, cb.Amount, string(ref))
			return err
		}),
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	defer func() {
		stopCtx, cancelStop := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancelStop()
		if err := c.Stop(stopCtx); err != nil {
			t.Error(err)
		}
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	p.consumer = c

	p.produce("OK1", "LOST")
	p.waitFor("OK1 applied, LOST dead-lettered", func(s consumer.Stats) bool { return s.Applied == 1 && s.DeadLettered == 1 })
	lost := dedup.Key{Scope: "pay", ID: "LOST"}
	pk := effect.DefaultProviderKey(lost, "refund")
	if n := bank.executions(pk); n != 1 {
		t.Fatalf("the provider executed LOST's refund %d times before the operator, want 1", n)
	}

	code, out, _ := idem(t, "", p.envs, "effects", "--json")
	steps := decode[[]stepJSON](t, out)
	if code != exitOK || len(steps) != 1 || steps[0].Key != "LOST" || steps[0].State != "in_doubt" || steps[0].ProviderKey != pk || steps[0].Attempts != 1 {
		t.Fatalf("idem effects: exit %d, %+v; want LOST in doubt with provider key %s", code, steps, pk)
	}
	// The operator asks the provider about pk: executed, reference R-LOST.
	bank.mu.Lock()
	bank.lose["LOST"] = false // a repeat now would execute again: none may come
	bank.mu.Unlock()
	if code, _, _ := idem(t, "", p.envs, "effects", "resolve", "--scope", "pay", "--key", "LOST", "--step", "refund", "--as", "succeeded", "--reference", "R-LOST", "--yes"); code != exitOK {
		t.Fatalf("resolve: exit %d", code)
	}
	rd := p.redrive(exitOK)
	if got := actions(rd); len(got) != 1 || got[0] != "LOST sent" {
		t.Fatalf("redrive: %v", got)
	}
	p.waitFor("LOST applied after the redrive", func(s consumer.Stats) bool { return s.Applied == 2 })

	var booked []string
	rows, err := p.pool.Query(ctx, `SELECT txn_id || '=' || reference FROM ledger ORDER BY txn_id`)
	if err != nil {
		t.Fatal(err)
	}
	if booked, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		t.Fatal(err)
	}
	want := "LOST=R-LOST OK1=ref-" + effect.DefaultProviderKey(dedup.Key{Scope: "pay", ID: "OK1"}, "refund")[:8]
	if strings.Join(booked, " ") != want {
		t.Errorf("ledger: %v, want %s: each refund booked once, LOST with the operator's reference", booked, want)
	}
	if n := bank.executions(pk); n != 1 {
		t.Errorf("the provider executed LOST's refund %d times, want 1: the resolution must stop every repeat", n)
	}
	if code, out, _ := idem(t, "", p.envs, "effects"); code != exitOK || !strings.Contains(out, "no unresolved steps") {
		t.Errorf("idem effects after: exit %d\n%s", code, out)
	}
}
