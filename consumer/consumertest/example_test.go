package consumertest_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/dedup/memstore"
)

// Drive runs a handler over a misbehaving broker: every message delivered one
// to three times, deliveries reordered within a window of five, and an ack
// lost, as if the process died between COMMIT and ack, each time three more
// messages were acknowledged. Then count the effects: each payment applied
// once.
func ExampleDrive() {
	var mu sync.Mutex // four partitions: four lanes commit concurrently
	balances := map[string]int{}
	handler := consumer.HandlerFunc[*memstore.Tx](func(ctx context.Context, tx *memstore.Tx, m *consumer.Message) error {
		acct, err := consumer.ByJSONField("account")(m)
		if err != nil {
			return consumer.Permanent(err)
		}
		tx.OnCommit(func() {
			mu.Lock()
			defer mu.Unlock()
			balances[acct] += 10
		})
		return nil
	})
	var msgs []*consumer.Message
	for i := range 20 {
		payload := fmt.Sprintf(`{"txn_id":"T%02d","account":"acct-%d"}`, i, i%2)
		msgs = append(msgs, consumertest.Message("payments", int32(i%4), int64(i/4), "", payload))
	}
	res, err := consumertest.Drive(context.Background(), consumer.Config[*memstore.Tx]{
		Name:    "payments",
		Store:   memstore.New(memstore.Config{}),
		Handler: handler,
		Key:     consumer.ByJSONField("txn_id"),
		Logger:  slog.New(slog.DiscardHandler),
	}, consumertest.Script{Seed: 7, MinDeliveries: 1, MaxDeliveries: 3, ReorderWindow: 5, CrashAfterCommitEvery: 3}, msgs...)
	if err != nil {
		fmt.Println(err)
		return
	}
	s := res.Stats
	fmt.Println("more deliveries than messages:", res.Source.Deliveries > len(msgs))
	fmt.Println("applied:", s.Applied, "the rest skipped:", s.Duplicates == s.Delivered-s.Applied)
	fmt.Println("balances:", balances)
	// Output:
	// more deliveries than messages: true
	// applied: 20 the rest skipped: true
	// balances: map[acct-0:100 acct-1:100]
}

// Run is Drive inside a test: it fails the test when the consumer does not
// settle within a minute or stops with an error. (The test below is written
// as a function value here; in your package it is func TestLedger.)
func ExampleRun() {
	testLedger := func(t *testing.T) {
		rows := map[string]int{}
		cfg := consumer.Config[*memstore.Tx]{
			Name:  "ledger",
			Store: memstore.New(memstore.Config{}),
			Handler: consumer.HandlerFunc[*memstore.Tx](func(ctx context.Context, tx *memstore.Tx, m *consumer.Message) error {
				txn, err := consumer.ByJSONField("txn_id")(m)
				if err != nil {
					return consumer.Permanent(err)
				}
				tx.OnCommit(func() { rows[txn]++ })
				return nil
			}),
			Key:    consumer.ByJSONField("txn_id"),
			Logger: slog.New(slog.DiscardHandler),
		}
		res := consumertest.Run(t, cfg, consumertest.Script{MinDeliveries: 2, MaxDeliveries: 4, CrashAfterCommitEvery: 2},
			consumertest.Message("payments", 0, 0, "", `{"txn_id":"T1"}`),
			consumertest.Message("payments", 0, 1, "", `{"txn_id":"T2"}`))
		if len(rows) != 2 || rows["T1"] != 1 || rows["T2"] != 1 {
			t.Fatalf("ledger rows %v after %v", rows, res)
		}
	}
	_ = testLedger
}
