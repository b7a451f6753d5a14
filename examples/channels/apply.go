package channels

import (
	"context"
	"errors"
	"fmt"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/examples/payments"
)

// next is the order's state machine: where an event of kind moves an order
// in state from. Informational events do not move it. The consumer's entity
// order (Config, Channel.Entity) hands Apply only events newer than every
// event applied to the order, so a payment re-sent after its refund or
// finish never gets here; an event that still finds the order past it
// contradicts it.
func next(from string, kind Kind) (string, error) {
	switch {
	case kind == Info:
		return from, nil
	case kind == Pay && from == "UNPAID":
		return "PAID", nil
	case kind == Finish && (from == "UNPAID" || from == "PAID"):
		return "FINISHED", nil // a trade that was never refundable finishes unpaid-to-finished
	case kind == Refund && (from == "UNPAID" || from == "PAID"):
		return "REFUNDED", nil // refunded before its payment reached us: it was paid
	}
	return "", fmt.Errorf("%w: a %s event of an order that is %s", ErrConflict, kind, from)
}

// Apply applies one event in the consumer's transaction: the order's
// transition, its ledger rows and balance, the units sold, and the event's
// record. key is the event's dedup key and source where the delivery came
// from. It does not guard against older events itself: the consumer's
// entity order (Config) keeps them from it.
//
// An event that contradicts the order (unknown order, wrong amount or
// currency, paid by another trade) is refused with consumer.Reject: nothing
// is written, the delivery is dead-lettered, and its key stays free. The
// check needs the order, read FOR UPDATE in this transaction, so it cannot
// run in consumer.Config.Validate; and a refusal must not take the key,
// because a validly signed notice with a wrong amount may come ahead of the
// genuine notice of its trade and status: recorded as failed (Permanent),
// it would have the genuine one dead-lettered as a mismatch.
func Apply(ctx context.Context, db payments.DB, ev Event, key, source string) error {
	var status, currency, paidTxn, account, sku string
	var amount, refunded int64
	err := db.QueryRow(ctx, `SELECT status, amount, currency, coalesce(paid_txn, ''), account_id, sku, refunded
FROM orders WHERE id = $1 FOR UPDATE`, ev.Order).Scan(&status, &amount, &currency, &paidTxn, &account, &sku, &refunded)
	switch {
	case errors.Is(err, payments.ErrNoRows):
		return consumer.Reject(fmt.Errorf("%w: %s (%s %s)", ErrUnknownOrder, ev.Order, ev.Channel, ev.Trade))
	case err != nil:
		return err
	}
	if ev.Kind != Info {
		switch {
		case ev.Currency != currency:
			return consumer.Reject(fmt.Errorf("%w: order %s is in %s, %s %s %s pays in %s",
				ErrWrongCurrency, ev.Order, currency, ev.Channel, ev.Trade, ev.Status, ev.Currency))
		case ev.Amount != amount:
			return consumer.Reject(fmt.Errorf("%w: order %s costs %d, %s %s %s says %d",
				ErrWrongAmount, ev.Order, amount, ev.Channel, ev.Trade, ev.Status, ev.Amount))
		case paidTxn != "" && paidTxn != ev.Trade:
			return consumer.Reject(fmt.Errorf("%w: order %s was paid by %s, not %s (a second payment: refund it)",
				ErrConflict, ev.Order, paidTxn, ev.Trade))
		}
	}
	if ev.Kind == PartialRefund {
		return applyPartialRefund(ctx, db, ev, key, source, status, account, amount, refunded)
	}
	to, err := next(status, ev.Kind)
	if err != nil {
		return consumer.Reject(fmt.Errorf("order %s, %s %s %s: %w", ev.Order, ev.Channel, ev.Trade, ev.Status, err))
	}
	effect := "recorded"
	if to != status {
		effect = "applied"
		if _, err := db.Exec(ctx, `UPDATE orders SET status = $1, paid_txn = $2 WHERE id = $3`, to, ev.Trade, ev.Order); err != nil {
			return err
		}
		if err := book(ctx, db, ev, account, sku, amount, status, to); err != nil {
			return err
		}
	}
	return recordEvent(ctx, db, ev, key, source, status, to, effect)
}

// recordEvent writes the event's row.
func recordEvent(ctx context.Context, db payments.DB, ev Event, key, source, from, to, effect string) error {
	_, err := db.Exec(ctx, `INSERT INTO channel_events
    (channel, event_key, order_id, trade, status, kind, from_status, to_status, effect, source)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)`,
		ev.Channel, key, ev.Order, ev.Trade, ev.Status, string(ev.Kind), from, to, effect, source)
	return err
}

// applyPartialRefund books a partial refund of a paid order: the refunded
// total grows to ev.Refunded, and the difference is one ledger row,
// "<trade>/refund/<out_biz_no>". The order stays PAID. A refund of an
// unpaid or finished order, of more than was paid, or of no more than was
// refunded already, is refused (a later refund's notice is newer: the
// consumer's entity order keeps an older one from here).
func applyPartialRefund(ctx context.Context, db payments.DB, ev Event, key, source, status, account string, amount, refunded int64) error {
	switch {
	case status != "PAID":
		return consumer.Reject(fmt.Errorf("%w: order %s is %s, %s %s refunds part of it (%s)", ErrConflict, ev.Order, status, ev.Channel, ev.Trade, ev.Refund))
	case ev.Refunded > amount:
		return consumer.Reject(fmt.Errorf("%w: order %s costs %d, %s %s refunds %d in all (%s)", ErrWrongAmount, ev.Order, amount, ev.Channel, ev.Trade, ev.Refunded, ev.Refund))
	case ev.Refunded <= refunded:
		return consumer.Reject(fmt.Errorf("%w: order %s has %d refunded, %s %s refunds %d in all (%s)", ErrConflict, ev.Order, refunded, ev.Channel, ev.Trade, ev.Refunded, ev.Refund))
	}
	if _, err := db.Exec(ctx, `UPDATE orders SET refunded = $1 WHERE id = $2`, ev.Refunded, ev.Order); err != nil {
		return err
	}
	back := refunded - ev.Refunded
	if _, err := db.Exec(ctx, `INSERT INTO ledger (txn_id, order_id, account_id, amount, channel) VALUES ($1, $2, $3, $4, $5)`,
		ev.Trade+"/refund/"+ev.Refund, ev.Order, account, back, ev.Channel); err != nil {
		return err
	}
	if _, err := db.Exec(ctx, `UPDATE accounts SET balance = balance + $1 WHERE id = $2`, back, account); err != nil {
		return err
	}
	return recordEvent(ctx, db, ev, key, source, status, status, "applied")
}

// book writes the money of a transition: the payment when the order leaves
// UNPAID (one ledger row per trade), the refund when it becomes REFUNDED
// (one more, "<trade>/refund"), balances and units sold to match.
func book(ctx context.Context, db payments.DB, ev Event, account, sku string, amount int64, from, to string) error {
	type row struct {
		txn    string
		amount int64
	}
	var rows []row
	sold := 0
	if from == "UNPAID" {
		rows = append(rows, row{ev.Trade, amount})
		sold++
	}
	if to == "REFUNDED" {
		rows = append(rows, row{ev.Trade + "/refund", -amount})
		sold--
	}
	for _, r := range rows {
		if _, err := db.Exec(ctx, `INSERT INTO ledger (txn_id, order_id, account_id, amount, channel) VALUES ($1, $2, $3, $4, $5)`,
			r.txn, ev.Order, account, r.amount, ev.Channel); err != nil {
			return err
		}
		if _, err := db.Exec(ctx, `UPDATE accounts SET balance = balance + $1 WHERE id = $2`, r.amount, account); err != nil {
			return err
		}
	}
	if sold != 0 {
		if _, err := db.Exec(ctx, `UPDATE inventory SET sold = sold + $1 WHERE sku = $2`, sold, sku); err != nil {
			return err
		}
	}
	return nil
}
