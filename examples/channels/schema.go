package channels

import (
	"context"
	"fmt"

	"github.com/idemkit/idem/examples/payments"
)

// The payments tables, extended: an order has a currency, two more states
// and the sum of its partial refunds, and every event applied is recorded,
// with the transition it made.
var schema = []string{
	`ALTER TABLE orders ADD COLUMN IF NOT EXISTS currency TEXT NOT NULL DEFAULT 'CNY'`,
	`ALTER TABLE orders ADD COLUMN IF NOT EXISTS refunded BIGINT NOT NULL DEFAULT 0`, // partial refunds, minor units
	`ALTER TABLE orders DROP CONSTRAINT IF EXISTS orders_status_check`,
	`ALTER TABLE orders ADD CONSTRAINT orders_status_check CHECK (status IN ('UNPAID', 'PAID', 'FINISHED', 'REFUNDED'))`,
	`CREATE TABLE IF NOT EXISTS channel_events (
    channel     TEXT NOT NULL,
    event_key   TEXT NOT NULL, -- the dedup key: trade and status
    order_id    TEXT NOT NULL REFERENCES orders (id),
    trade       TEXT NOT NULL,
    status      TEXT NOT NULL, -- the channel's name of the event
    kind        TEXT NOT NULL CHECK (kind IN ('pay', 'finish', 'refund', 'partial_refund', 'info')),
    from_status TEXT NOT NULL,
    to_status   TEXT NOT NULL,
    effect      TEXT NOT NULL CHECK (effect IN ('applied', 'recorded')),
    source      TEXT NOT NULL, -- topic/partition/offset of the delivery applied
    seq         BIGSERIAL,
    PRIMARY KEY (channel, event_key)
)`,
}

// Setup creates the payments tables (payments.Setup) and extends them. It
// is for Postgres: point the connection's search_path at the schema.
func Setup(ctx context.Context, db payments.DB) error {
	return payments.Extend(ctx, db, "channels", schema)
}

// CreateOrders inserts unpaid orders with their accounts and SKUs.
func CreateOrders(ctx context.Context, db payments.DB, orders []Order) error {
	for _, o := range orders {
		if err := payments.CreateOrders(ctx, db, []payments.Order{{ID: o.ID, Account: o.Account, SKU: o.SKU, Amount: o.Amount}}); err != nil {
			return err
		}
		if _, err := db.Exec(ctx, `UPDATE orders SET currency = $1 WHERE id = $2`, o.Currency, o.ID); err != nil {
			return fmt.Errorf("channels: order %s: %w", o.ID, err)
		}
	}
	return nil
}
