package outbox_test

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/outbox"
)

// An event's identity derives from the dedup key of the work that produced
// it and its position there: the same callback, however often it is
// delivered and its handler re-run, produces the same IDs.
func ExampleMessageID() {
	callback := dedup.Key{Scope: "payments", ID: "4200000001"}
	fmt.Println(outbox.MessageID(callback, 0)) // order.paid
	fmt.Println(outbox.MessageID(callback, 1)) // a second message of the same handler
	// Output:
	// dd612ff453e2d1f72a31f0fccfdd3290
	// 3a3914b8f9e9e4cf1e6dd1be65781bd4
}

// A handler enqueues its event in the transaction the consumer gave it; a
// downstream consumer keys by the event's identity.
func ExampleOutbox_Enqueue() {
	var ob *outbox.Outbox // outbox.New(pool, outbox.Config{}), then Migrate
	_ = consumer.HandlerFunc[pgx.Tx](func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if _, err := tx.Exec(ctx, `UPDATE orders SET status = 'PAID' WHERE id = $1`, string(m.Key)); err != nil {
			return err
		}
		return ob.Enqueue(ctx, tx, m, outbox.Message{Topic: "order.paid", Key: m.Key, Value: m.Value})
	})
	downstream := consumer.Config[pgx.Tx]{Name: "shipping", Key: consumer.ByHeader(outbox.HeaderID)}
	fmt.Println(downstream.Name, "keys by", outbox.HeaderID)
	// Output: shipping keys by idem-outbox-id
}
