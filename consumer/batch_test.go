package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/dedup/memstore"
)

func batchConfig(h consumer.BatchHandlerFunc[*memstore.Tx]) consumer.Config[*memstore.Tx] {
	cfg := baseConfig(nil)
	cfg.Handler = nil
	cfg.BatchHandler = h
	cfg.BatchSize = 32
	return cfg
}

func TestBatchHandlerAppliesOnce(t *testing.T) {
	eff := newEffects()
	var calls, biggest atomic.Int64
	cfg := batchConfig(func(ctx context.Context, tx *memstore.Tx, msgs []*consumer.Message) error {
		calls.Add(1)
		if n := int64(len(msgs)); n > biggest.Load() {
			biggest.Store(n)
		}
		eff.applyEach(tx, msgs)
		return nil
	})
	var msgs []*consumer.Message
	for i := range 500 {
		msgs = append(msgs, consumertest.Message("pay", int32(i%2), int64(i), "", payment(i)))
	}
	res := consumertest.Run(t, cfg, consumertest.Script{MinDeliveries: 2, MaxDeliveries: 3, ReorderWindow: 10, CrashAfterCommitEvery: 3}, msgs...)
	eff.check(t, txnIDs(500))
	if biggest.Load() < 2 || calls.Load() >= int64(res.Source.Deliveries) {
		t.Fatalf("the handler was not called with batches: %d calls, biggest %d", calls.Load(), biggest.Load())
	}
}

func TestBatchHandlerMessageErrorIsolatesOne(t *testing.T) {
	eff := newEffects()
	cfg := batchConfig(func(ctx context.Context, tx *memstore.Tx, msgs []*consumer.Message) error {
		for i, m := range msgs {
			id, _ := consumer.ByJSONField("txn_id")(m)
			if id == "T00005" {
				return &consumer.MessageError{Index: i, Err: consumer.Permanent(errors.New("closed account"))}
			}
			eff.add(tx, id)
		}
		return nil
	})
	res := consumertest.Run(t, cfg, consumertest.Script{}, payments(10)...)
	eff.check(t, txnIDs(10, 5))
	if len(res.DeadLetters) != 1 || res.DeadLetters[0].Key.ID != "T00005" || !strings.Contains(res.DeadLetters[0].Reason.Error(), "closed account") {
		t.Fatalf("dead letters %+v", res.DeadLetters)
	}
}

func TestBatchHandlerUnnamedFailureIsHalvedDown(t *testing.T) {
	eff := newEffects()
	var panicked atomic.Bool
	cfg := batchConfig(func(ctx context.Context, tx *memstore.Tx, msgs []*consumer.Message) error {
		for _, m := range msgs {
			id, _ := consumer.ByJSONField("txn_id")(m)
			switch id {
			case "T00013":
				return consumer.Permanent(errors.New("bad row somewhere"))
			case "T00021":
				if panicked.CompareAndSwap(false, true) {
					panic("once")
				}
			}
			eff.add(tx, id)
		}
		return nil
	})
	res := consumertest.Run(t, cfg, consumertest.Script{}, payments(32)...)
	eff.check(t, txnIDs(32, 13))
	if len(res.DeadLetters) != 1 || res.DeadLetters[0].Key.ID != "T00013" {
		t.Fatalf("dead letters %+v, want T00013 alone", res.DeadLetters)
	}
}

func TestBatchHandlerConfig(t *testing.T) {
	cfg := batchConfig(func(context.Context, *memstore.Tx, []*consumer.Message) error { return nil })
	cfg.Handler = consumer.HandlerFunc[*memstore.Tx](func(context.Context, *memstore.Tx, *consumer.Message) error { return nil })
	cfg.Source, cfg.DeadLetter = consumertest.NewSource(consumertest.Script{}), &consumertest.DeadLetters{}
	if _, err := consumer.New(cfg); err == nil || !strings.Contains(err.Error(), "both set") {
		t.Fatalf("Handler and BatchHandler together: %v", err)
	}
}

// TestRepeatedConflictsShrinkTheBatch: a transaction of more than four
// messages always deadlocks (two lanes locking the same accounts in
// different orders, say). Retrying the same batch whole would never end;
// halving it after the second conflict in a row gets everything through in
// smaller transactions, none dead-lettered.
func TestRepeatedConflictsShrinkTheBatch(t *testing.T) {
	eff := newEffects()
	var deadlocks, biggest atomic.Int64
	const valve = 5000 // after this many the handler stops failing, so that a broken engine ends the test
	cfg := batchConfig(func(ctx context.Context, tx *memstore.Tx, msgs []*consumer.Message) error {
		if len(msgs) > 4 && deadlocks.Add(1) < valve {
			return fmt.Errorf("update accounts: %w", errDeadlock)
		}
		if n := int64(len(msgs)); n > biggest.Load() {
			biggest.Store(n)
		}
		eff.applyEach(tx, msgs)
		return nil
	})
	cfg.Store = conflictStore{memstore.New(memstore.Config{})}
	res := consumertest.Run(t, cfg, consumertest.Script{}, payments(200)...)
	eff.check(t, txnIDs(200))
	if len(res.DeadLetters) != 0 {
		t.Fatalf("%d dead letters: %+v", len(res.DeadLetters), res.DeadLetters[0])
	}
	if d := deadlocks.Load(); d >= 1000 || biggest.Load() > 4 {
		t.Fatalf("%d deadlocks, biggest committed batch %d: the batch was not made smaller", d, biggest.Load())
	}
	t.Logf("%d deadlocks, %d commits", deadlocks.Load(), res.Stats.Commits)
}
