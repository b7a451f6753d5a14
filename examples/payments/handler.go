package payments

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/idemkit/idem/consumer"
)

// Callback is what the payment channel sends.
type Callback struct {
	TxnID   string `json:"txn_id"`   // the channel's transaction number: the dedup key
	OrderID string `json:"order_id"` // our order
	Amount  int64  `json:"amount"`   // minor units
	Channel string `json:"channel"`
	Status  string `json:"status"` // SUCCESS
}

// KeyField is the JSON field idem deduplicates on.
const KeyField = "txn_id"

// ErrBadCallback: the callback cannot be applied, whatever the retries.
var ErrBadCallback = errors.New("payments: bad callback")

// Decode parses and validates a callback.
func Decode(payload []byte) (Callback, error) {
	var cb Callback
	if err := json.Unmarshal(payload, &cb); err != nil {
		return cb, fmt.Errorf("%w: %v", ErrBadCallback, err)
	}
	switch {
	case cb.TxnID == "":
		return cb, fmt.Errorf("%w: txn_id is missing", ErrBadCallback)
	case cb.OrderID == "":
		return cb, fmt.Errorf("%w: order_id is missing", ErrBadCallback)
	case cb.Amount <= 0:
		return cb, fmt.Errorf("%w: amount %d is not positive", ErrBadCallback, cb.Amount)
	case cb.Status != "SUCCESS":
		return cb, fmt.Errorf("%w: status %q is not SUCCESS", ErrBadCallback, cb.Status)
	}
	return cb, nil
}

// Handler applies a callback in tx; db adapts the transaction (Pgx or SQL).
// It never commits: idem commits the four tables and the dedup row together.
func Handler[TTx any](db func(TTx) DB) consumer.Handler[TTx] {
	return consumer.HandlerFunc[TTx](func(ctx context.Context, tx TTx, m *consumer.Message) error {
		cb, err := Decode(m.Value)
		if err != nil {
			return consumer.Permanent(err)
		}
		return Apply(ctx, db(tx), cb)
	})
}

// Apply credits one payment: order UNPAID -> PAID (conditional), one ledger
// row, the account's balance, the SKU's sales.
func Apply(ctx context.Context, db DB, cb Callback) error {
	n, err := db.Exec(ctx, `UPDATE orders SET status = 'PAID', paid_txn = $1
WHERE id = $2 AND status = 'UNPAID' AND amount = $3`, cb.TxnID, cb.OrderID, cb.Amount)
	if err != nil {
		return err
	}
	if n == 0 {
		return consumer.Permanent(whyNotPaid(ctx, db, cb))
	}
	var account, sku string
	if err := db.QueryRow(ctx, `SELECT account_id, sku FROM orders WHERE id = $1`, cb.OrderID).Scan(&account, &sku); err != nil {
		return err
	}
	if _, err := db.Exec(ctx, `INSERT INTO ledger (txn_id, order_id, account_id, amount, channel) VALUES ($1, $2, $3, $4, $5)`,
		cb.TxnID, cb.OrderID, account, cb.Amount, cb.Channel); err != nil {
		return err
	}
	if _, err := db.Exec(ctx, `UPDATE accounts SET balance = balance + $1 WHERE id = $2`, cb.Amount, account); err != nil {
		return err
	}
	_, err = db.Exec(ctx, `UPDATE inventory SET sold = sold + 1 WHERE sku = $1`, sku)
	return err
}

// whyNotPaid explains a conditional update that matched no row.
func whyNotPaid(ctx context.Context, db DB, cb Callback) error {
	var status, paidTxn string
	var amount int64
	err := db.QueryRow(ctx, `SELECT status, coalesce(paid_txn, ''), amount FROM orders WHERE id = $1`, cb.OrderID).Scan(&status, &paidTxn, &amount)
	switch {
	case errors.Is(err, ErrNoRows):
		return fmt.Errorf("%w: order %s does not exist", ErrBadCallback, cb.OrderID)
	case err != nil:
		return err
	case status == "PAID":
		return fmt.Errorf("%w: order %s was already paid by %s (a second payment: refund it)", ErrBadCallback, cb.OrderID, paidTxn)
	case amount != cb.Amount:
		return fmt.Errorf("%w: order %s costs %d, the callback pays %d", ErrBadCallback, cb.OrderID, amount, cb.Amount)
	}
	return fmt.Errorf("%w: order %s is %s", ErrBadCallback, cb.OrderID, status)
}
