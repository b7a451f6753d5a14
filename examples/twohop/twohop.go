package twohop

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/examples/payments"
	"github.com/idemkit/idem/outbox"
)

// Consumer names: the scopes of their dedup keys.
const (
	PaymentsName = "payments"
	ShippingName = "shipping"
)

// OrderPaid is the event a booked payment sends.
type OrderPaid struct {
	Type    string `json:"type"` // "order.paid"
	OrderID string `json:"order_id"`
	TxnID   string `json:"txn_id"`
	SKU     string `json:"sku"`
	Amount  int64  `json:"amount"`
}

// PaymentsHandler books a callback as payments.Handler does and, in the
// same transaction, enqueues an OrderPaid event to topic, keyed by order
// (one order's events stay in order). The event's identity derives from the
// callback's dedup key: a callback re-sent, redelivered or retried books
// nothing twice and produces no second event.
func PaymentsHandler(ob *outbox.Outbox, topic string) consumer.Handler[pgx.Tx] {
	return consumer.HandlerFunc[pgx.Tx](func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		cb, err := payments.Decode(m.Value)
		if err != nil {
			return consumer.Permanent(err)
		}
		if err := payments.Apply(ctx, payments.Pgx(tx), cb); err != nil {
			return err
		}
		ev := OrderPaid{Type: "order.paid", OrderID: cb.OrderID, TxnID: cb.TxnID, Amount: cb.Amount}
		if err := tx.QueryRow(ctx, `SELECT sku FROM orders WHERE id = $1`, cb.OrderID).Scan(&ev.SKU); err != nil {
			return err
		}
		v, err := json.Marshal(ev)
		if err != nil {
			return err
		}
		return ob.Enqueue(ctx, tx, m, outbox.Message{Topic: topic, Key: []byte(cb.OrderID), Value: v})
	})
}

// ShippingHandler ships a paid order: a shipment row (append-only, no
// unique constraint, so that a double effect shows) and the SKU's
// warehouse count. Its consumer keys by consumer.ByHeader(outbox.HeaderID).
func ShippingHandler() consumer.Handler[pgx.Tx] {
	return consumer.HandlerFunc[pgx.Tx](func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		var ev OrderPaid
		if err := json.Unmarshal(m.Value, &ev); err != nil || ev.Type != "order.paid" || ev.OrderID == "" || ev.SKU == "" {
			return consumer.Permanent(fmt.Errorf("twohop: not an order.paid event: %q (%v)", m.Value, err))
		}
		id, _ := m.Header(outbox.HeaderID)
		if _, err := tx.Exec(ctx, `INSERT INTO shipments (order_id, txn_id, event_id, sku) VALUES ($1, $2, $3, $4)`,
			ev.OrderID, ev.TxnID, string(id), ev.SKU); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO warehouse (sku, shipped) VALUES ($1, 1)
ON CONFLICT (sku) DO UPDATE SET shipped = warehouse.shipped + 1`, ev.SKU)
		return err
	})
}

var schema = []string{
	`CREATE TABLE IF NOT EXISTS shipments (
    id       bigserial PRIMARY KEY,
    order_id text NOT NULL,
    txn_id   text NOT NULL,
    event_id text NOT NULL,
    sku      text NOT NULL
)`,
	`CREATE TABLE IF NOT EXISTS warehouse (
    sku     text PRIMARY KEY,
    shipped bigint NOT NULL DEFAULT 0
)`,
}

// Setup creates the payments tables (payments.Setup) and the shipping
// tables when missing, in db's search_path.
func Setup(ctx context.Context, db payments.DB) error {
	return payments.Extend(ctx, db, "twohop", schema)
}
