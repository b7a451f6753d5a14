package consumer_test

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/dedup/memstore"
)

// A payment-callback handler keyed by the channel's transaction number: the
// channel re-sends the same callback three times, the broker redelivers after
// a lost ack, and the account is credited once.
func Example() {
	balance := map[string]int{}
	handler := consumer.HandlerFunc[*memstore.Tx](func(ctx context.Context, tx *memstore.Tx, m *consumer.Message) error {
		acct, err := consumer.ByJSONField("account")(m)
		if err != nil {
			return consumer.Permanent(err)
		}
		tx.OnCommit(func() { balance[acct] += 100 }) // with pgstore: tx.Exec(ctx, "UPDATE accounts ...")
		return nil
	})
	cfg := consumer.Config[*memstore.Tx]{
		Name:    "payments",
		Store:   memstore.New(memstore.Config{}),
		Handler: handler,
		Key:     consumer.ByJSONField("txn_id"),
		Logger:  slog.New(slog.DiscardHandler), // the example prints what matters
	}
	callback := `{"txn_id":"W-1001","account":"alice","amount":100}`
	res, err := consumertest.Drive(context.Background(), cfg,
		consumertest.Script{MinDeliveries: 2, MaxDeliveries: 2}, // every message redelivered once
		consumertest.Message("payments", 0, 0, "", callback),
		consumertest.Message("payments", 0, 1, "", callback), // the channel re-sends
		consumertest.Message("payments", 0, 2, "", callback))
	if err != nil {
		panic(err)
	}
	fmt.Println("deliveries:", res.Source.Deliveries)
	fmt.Println("applied:", res.Stats.Applied, "duplicates:", res.Stats.Duplicates)
	fmt.Println("alice:", balance["alice"])
	// Output:
	// deliveries: 6
	// applied: 1 duplicates: 5
	// alice: 100
}
