package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/memstore"
)

// flakyStore fails its first transactions as if the database were down.
type flakyStore struct {
	*memstore.Store
	down atomic.Int64
}

var errDBDown = errors.New("connection refused")

func (f *flakyStore) InTx(ctx context.Context, fn func(context.Context, *memstore.Tx) error) error {
	if f.down.Add(-1) >= 0 {
		return errDBDown
	}
	return f.Store.InTx(ctx, fn)
}

func (f *flakyStore) ClassifyError(err error) dedup.ErrorClass {
	if errors.Is(err, errDBDown) {
		return dedup.ClassUnavailable
	}
	return dedup.ClassUnknown
}

func TestDatabaseOutageIsWaitedOutNotDeadLettered(t *testing.T) {
	eff := newEffects()
	cfg := baseConfig(func(ctx context.Context, tx *memstore.Tx, m *consumer.Message) error {
		id, _ := consumer.ByJSONField("txn_id")(m)
		eff.add(tx, id)
		return nil
	})
	st := &flakyStore{Store: memstore.New(memstore.Config{})}
	st.down.Store(50) // far more than Retry.MaxAttempts
	cfg.Store = st
	res := consumertest.Run(t, cfg, consumertest.Script{},
		consumertest.Message("pay", 0, 0, "", payment(0)),
		consumertest.Message("pay", 0, 1, "", payment(1)))
	eff.check(t, []string{"T00000", "T00001"})
	if len(res.DeadLetters) != 0 {
		t.Fatalf("dead letters during an outage: %+v", res.DeadLetters)
	}
	if res.Stats.Retries < 50 {
		t.Errorf("retries %d, want >= 50", res.Stats.Retries)
	}
}

// conflictStore classifies errDeadlock as the SQL stores classify 40P01.
type conflictStore struct{ *memstore.Store }

var errDeadlock = errors.New("deadlock detected")

func (c conflictStore) ClassifyError(err error) dedup.ErrorClass {
	if errors.Is(err, errDeadlock) {
		return dedup.ClassConflict
	}
	return dedup.ClassUnknown
}

// TestConflictsDoNotUseUpTheRetryBudget: a deadlock with another lane, met
// by the handler's own UPDATE, is not the message's fault; twenty in a row
// (MaxAttempts is 4) still end in the message applied, not dead-lettered.
func TestConflictsDoNotUseUpTheRetryBudget(t *testing.T) {
	eff := newEffects()
	var left atomic.Int64
	left.Store(20)
	cfg := baseConfig(func(ctx context.Context, tx *memstore.Tx, m *consumer.Message) error {
		if left.Add(-1) >= 0 {
			return fmt.Errorf("update accounts: %w", errDeadlock)
		}
		id, _ := consumer.ByJSONField("txn_id")(m)
		eff.add(tx, id)
		return nil
	})
	cfg.Store = conflictStore{memstore.New(memstore.Config{})}
	res := consumertest.Run(t, cfg, consumertest.Script{}, consumertest.Message("pay", 0, 0, "", payment(0)))
	eff.check(t, []string{"T00000"})
	if len(res.DeadLetters) != 0 || res.Stats.Retries < 20 {
		t.Fatalf("dead letters %+v, retries %d", res.DeadLetters, res.Stats.Retries)
	}
}

// readOnlyStore refuses claims as a demoted primary does (25006), which the
// engine must not charge to the messages: no handler ran.
type readOnlyStore struct {
	*memstore.Store
	down atomic.Int64
}

var errReadOnly = errors.New("cannot execute INSERT in a read-only transaction (SQLSTATE 25006)")

func (r *readOnlyStore) Claim(ctx context.Context, tx *memstore.Tx, c []dedup.Claim, res []dedup.Result) error {
	if r.down.Add(-1) >= 0 {
		return errReadOnly
	}
	return r.Store.Claim(ctx, tx, c, res)
}

// TestFailingClaimIsNotTheMessages: a claim that fails with an error the
// store does not call unavailable used to be split down to lone messages,
// which were charged and dead-lettered (found by review): a read-only or full
// database dead-lettered healthy messages. No handler ran; it is waited out.
func TestFailingClaimIsNotTheMessages(t *testing.T) {
	eff := newEffects()
	cfg := baseConfig(func(ctx context.Context, tx *memstore.Tx, m *consumer.Message) error {
		id, _ := consumer.ByJSONField("txn_id")(m)
		eff.add(tx, id)
		return nil
	})
	st := &readOnlyStore{Store: memstore.New(memstore.Config{})}
	st.down.Store(200) // far more than Retry.MaxAttempts
	cfg.Store = st
	res := consumertest.Run(t, cfg, consumertest.Script{},
		consumertest.Message("pay", 0, 0, "", payment(0)), consumertest.Message("pay", 0, 1, "", payment(1)))
	if len(res.DeadLetters) != 0 {
		t.Fatalf("dead-lettered while the claim failed: %d, %v", len(res.DeadLetters), res.DeadLetters[0].Reason)
	}
	eff.check(t, []string{"T00000", "T00001"})
}
