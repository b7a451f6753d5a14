package consumertest_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/dedup/memstore"
)

// TestCrashAfterCommitEveryCountsMessages runs the script of
// docs/development.md (100 payments on four partitions, every 5th ack
// lost) at the default batch size, where one Ack covers many messages: the
// crashes the script asks for must happen, and every payment must still be
// applied once.
func TestCrashAfterCommitEveryCountsMessages(t *testing.T) {
	var mu sync.Mutex // four partitions: four lanes commit concurrently
	applied := map[string]int{}
	var msgs []*consumer.Message
	for i := range 100 {
		msgs = append(msgs, consumertest.Message("payments", int32(i%4), int64(i/4), "", fmt.Sprintf(`{"txn_id":"T%03d"}`, i)))
	}
	res := consumertest.Run(t, consumer.Config[*memstore.Tx]{
		Name:  "ledger",
		Store: memstore.New(memstore.Config{}),
		Handler: consumer.HandlerFunc[*memstore.Tx](func(ctx context.Context, tx *memstore.Tx, m *consumer.Message) error {
			txn, err := consumer.ByJSONField("txn_id")(m)
			if err != nil {
				return consumer.Permanent(err)
			}
			tx.OnCommit(func() {
				mu.Lock()
				defer mu.Unlock()
				applied[txn]++
			})
			return nil
		}),
		Key:    consumer.ByJSONField("txn_id"),
		Logger: slog.New(slog.DiscardHandler),
	}, consumertest.Script{MinDeliveries: 1, MaxDeliveries: 3, ReorderWindow: 8, CrashAfterCommitEvery: 5}, msgs...)

	if res.Source.Crashes == 0 {
		t.Errorf("no ack lost in %d acks of %d deliveries, with every 5th message's ack to lose (%v)", res.Source.AckCalls, res.Source.Deliveries, res)
	}
	if len(applied) != len(msgs) {
		t.Errorf("%d of %d payments applied (%v)", len(applied), len(msgs), res)
	}
	for txn, n := range applied {
		if n != 1 {
			t.Errorf("%s applied %d times", txn, n)
		}
	}
}

// TestCrashAfterCommitEveryLosesWholeBatch acks ten messages in one call
// with every 5th message's ack to lose: that Ack is lost whole, its
// messages come again, and their second ack, which counts them no more,
// goes through.
func TestCrashAfterCommitEveryLosesWholeBatch(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	src := consumertest.NewSource(consumertest.Script{CrashAfterCommitEvery: 5})
	var msgs []*consumer.Message
	for i := range 10 {
		msgs = append(msgs, consumertest.Message("payments", 0, int64(i), "", "{}"))
	}
	src.Push(msgs...)
	batches := make(chan []*consumer.Message)
	go func() {
		var batch []*consumer.Message
		_ = src.Run(ctx, func(ctx context.Context, m *consumer.Message) error {
			batch = append(batch, m)
			if len(batch) == len(msgs) {
				select {
				case batches <- batch:
				case <-ctx.Done():
				}
				batch = nil
			}
			return nil
		})
	}()

	if err := src.Ack(ctx, <-batches); err != nil {
		t.Fatal(err)
	}
	if s := src.Stats(); s.Crashes != 1 || s.Acked != 0 {
		t.Fatalf("after one Ack of 10 messages, every 5th to lose: %d crashes, %d acked; want 1 and 0", s.Crashes, s.Acked)
	}
	if err := src.Ack(ctx, <-batches); err != nil {
		t.Fatal(err)
	}
	if s := src.Stats(); s.Crashes != 1 || s.Acked != len(msgs) {
		t.Fatalf("after the lost batch came again and was acked: %d crashes, %d acked; want 1 and %d", s.Crashes, s.Acked, len(msgs))
	}
	waitCtx, stop := context.WithTimeout(ctx, 10*time.Second)
	defer stop()
	if err := src.WaitIdle(waitCtx); err != nil {
		t.Fatal(err)
	}
}
