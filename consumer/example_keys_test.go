package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/memstore"
)

// ByMessageID catches the broker delivering one message again (a crash, a
// rebalance, a lost ack), but not a producer's retry: Kafka stores the retry
// at a new offset, so it is a new message ID and applied a second time.
func ExampleByMessageID() {
	order := `{"order_id":"O-7","amount":100}`
	res, err := consumertest.Drive(context.Background(), consumer.Config[*memstore.Tx]{
		Name:    "orders",
		Store:   memstore.New(memstore.Config{}),
		Handler: consumer.HandlerFunc[*memstore.Tx](func(context.Context, *memstore.Tx, *consumer.Message) error { return nil }),
		Key:     consumer.ByMessageID(), // "orders/0/0", "orders/0/1"
		Logger:  slog.New(slog.DiscardHandler),
	}, consumertest.Script{MinDeliveries: 2, MaxDeliveries: 2}, // the broker delivers every offset twice
		consumertest.Message("orders", 0, 0, "", order),
		consumertest.Message("orders", 0, 1, "", order)) // the producer's retry: same event, new offset
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("applied:", res.Stats.Applied, "duplicates:", res.Stats.Duplicates)
	// Output:
	// applied: 2 duplicates: 2
}

// ByRecordKey catches producer retries and re-sends when the producer sets
// the record key per business event. Keyed by an entity instead (an order ID
// used for partitioning), the order's second event looks like the first one
// with another payload: a fingerprint mismatch, dead-lettered, not applied.
func ExampleByRecordKey() {
	drive := func(msgs ...*consumer.Message) {
		res, err := consumertest.Drive(context.Background(), consumer.Config[*memstore.Tx]{
			Name:    "orders",
			Store:   memstore.New(memstore.Config{}),
			Handler: consumer.HandlerFunc[*memstore.Tx](func(context.Context, *memstore.Tx, *consumer.Message) error { return nil }),
			Key:     consumer.ByRecordKey(),
			Logger:  slog.New(slog.DiscardHandler),
		}, consumertest.Script{}, msgs...)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println("applied:", res.Stats.Applied, "duplicates:", res.Stats.Duplicates)
		for _, l := range res.DeadLetters {
			fmt.Printf("dead-lettered offset %d, fingerprint mismatch: %t\n", l.Message.Offset, errors.Is(l.Reason, dedup.ErrFingerprintMismatch))
		}
	}

	fmt.Println("record key = event ID:")
	drive(
		consumertest.Message("orders", 0, 0, "evt-1", `{"order_id":"O-7","event":"paid"}`),
		consumertest.Message("orders", 0, 1, "evt-1", `{"order_id":"O-7","event":"paid"}`), // producer retry
		consumertest.Message("orders", 0, 2, "evt-2", `{"order_id":"O-7","event":"shipped"}`))

	fmt.Println("record key = order ID (wrong):")
	drive(
		consumertest.Message("orders", 0, 0, "O-7", `{"order_id":"O-7","event":"paid"}`),
		consumertest.Message("orders", 0, 1, "O-7", `{"order_id":"O-7","event":"paid"}`), // producer retry
		consumertest.Message("orders", 0, 2, "O-7", `{"order_id":"O-7","event":"shipped"}`))
	// Output:
	// record key = event ID:
	// applied: 2 duplicates: 1
	// record key = order ID (wrong):
	// applied: 1 duplicates: 1
	// dead-lettered offset 2, fingerprint mismatch: true
}

// ByHeader keys by a header the producer sets, such as an Idempotency-Key
// minted once per user action. It catches every re-send that reuses the key,
// and nothing a sender does with a new key per attempt.
func ExampleByHeader() {
	withKey := func(m *consumer.Message, key string) *consumer.Message {
		m.Headers = append(m.Headers, consumer.Header{Key: "Idempotency-Key", Value: []byte(key)})
		return m
	}
	transfer := `{"from":"alice","to":"bob","amount":500}`
	res, err := consumertest.Drive(context.Background(), consumer.Config[*memstore.Tx]{
		Name:    "transfers",
		Store:   memstore.New(memstore.Config{}),
		Handler: consumer.HandlerFunc[*memstore.Tx](func(context.Context, *memstore.Tx, *consumer.Message) error { return nil }),
		Key:     consumer.ByHeader("Idempotency-Key"),
		Logger:  slog.New(slog.DiscardHandler),
	}, consumertest.Script{},
		withKey(consumertest.Message("transfers", 0, 0, "", transfer), "a1f3"),
		withKey(consumertest.Message("transfers", 0, 1, "", transfer), "a1f3"), // double click, same key
		withKey(consumertest.Message("transfers", 0, 2, "", transfer), "c9d0"), // a client that mints a key per attempt
		consumertest.Message("transfers", 0, 3, "", transfer))                  // no header at all
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("applied:", res.Stats.Applied, "duplicates:", res.Stats.Duplicates)
	for _, l := range res.DeadLetters {
		fmt.Printf("dead-lettered offset %d, no key: %t\n", l.Message.Offset, errors.Is(l.Reason, consumer.ErrNoKey))
	}
	// Output:
	// applied: 2 duplicates: 1
	// dead-lettered offset 3, no key: true
}

// ByJSONField keys by the payload's own identity, here the payment channel's
// transaction number: it also catches the channel re-sending its callback from
// another server, spelled differently (key order, spacing, 1e3 for 1000). The
// same number with another amount is not a duplicate but a conflict.
func ExampleByJSONField() {
	res, err := consumertest.Drive(context.Background(), consumer.Config[*memstore.Tx]{
		Name:    "payments",
		Store:   memstore.New(memstore.Config{}),
		Handler: consumer.HandlerFunc[*memstore.Tx](func(context.Context, *memstore.Tx, *consumer.Message) error { return nil }),
		Key:     consumer.ByJSONField("txn_id"),
		Logger:  slog.New(slog.DiscardHandler),
	}, consumertest.Script{},
		consumertest.Message("payments", 0, 0, "", `{"txn_id":"4200001","amount":1000}`),
		consumertest.Message("payments", 0, 1, "", `{ "amount": 1e3, "txn_id": "4200001" }`), // the channel re-sends
		consumertest.Message("payments", 0, 2, "", `{"txn_id":"4200001","amount":1001}`),     // same number, another amount
		consumertest.Message("payments", 0, 3, "", `{"amount":1000}`))                        // no transaction number
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("applied:", res.Stats.Applied, "duplicates:", res.Stats.Duplicates)
	for _, l := range res.DeadLetters {
		fmt.Printf("dead-lettered offset %d: mismatch %t, no key %t\n", l.Message.Offset,
			errors.Is(l.Reason, dedup.ErrFingerprintMismatch), errors.Is(l.Reason, consumer.ErrNoKey))
	}
	// Output:
	// applied: 1 duplicates: 1
	// dead-lettered offset 2: mismatch true, no key false
	// dead-lettered offset 3: mismatch false, no key true
}
