package channels

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Kind is what an event means for the order, whatever the channel calls it.
type Kind string

const (
	// Pay: the buyer paid (Alipay TRADE_SUCCESS, WeChat Pay
	// TRANSACTION.SUCCESS, Stripe payment_intent.succeeded).
	Pay Kind = "pay"
	// Finish: the trade is final and can no longer be refunded (Alipay
	// TRADE_FINISHED). A trade that was never refundable goes straight to it,
	// so it also means paid.
	Finish Kind = "finish"
	// Refund: the payment was refunded in full (Alipay TRADE_CLOSED with a
	// refund_fee, WeChat Pay REFUND.SUCCESS, Stripe charge.refunded). It also
	// means the trade had been paid.
	Refund Kind = "refund"
	// PartialRefund: part of the payment was refunded; the trade stays paid
	// (Alipay TRADE_SUCCESS with a refund_fee and the refund's out_biz_no).
	// Each refund of a trade is an event of its own.
	PartialRefund Kind = "partial_refund"
	// Info: nothing to do for the order (Alipay WAIT_BUYER_PAY, an unpaid
	// trade closed on timeout). Recorded, so that it is not applied twice.
	Info Kind = "info"
)

// Event is one channel callback, decoded and verified: what Apply needs.
type Event struct {
	Channel  string
	Trade    string // the channel's trade number: Alipay trade_no, WeChat Pay transaction_id, Stripe PaymentIntent
	Order    string // our order number: out_trade_no, metadata.order_id
	Status   string // the channel's own name of the event (TRADE_SUCCESS, REFUND.SUCCESS, charge.refunded)
	Kind     Kind
	Amount   int64  // minor units (fen, cents): paid, or refunded for Refund; the trade's total for PartialRefund
	Currency string // ISO 4217, upper case
	// PartialRefund: the refund request (Alipay out_biz_no) and the trade's
	// refunded total with it (refund_fee: Alipay reports the sum of the
	// trade's refunds so far, not this refund's amount).
	Refund   string
	Refunded int64
}

var (
	// ErrBadSignature: the callback's signature does not verify: not sent by
	// the channel, or altered on the way.
	ErrBadSignature = errors.New("channels: bad signature")
	// ErrBadCallback: the callback cannot be read.
	ErrBadCallback = errors.New("channels: bad callback")
	// ErrWrongAmount: the callback's amount is not the order's.
	ErrWrongAmount = errors.New("channels: amount differs from the order")
	// ErrWrongCurrency: the callback's currency is not the order's.
	ErrWrongCurrency = errors.New("channels: currency differs from the order")
	// ErrUnknownOrder: no such order.
	ErrUnknownOrder = errors.New("channels: unknown order")
	// ErrConflict: the event contradicts the order's state (paid by another
	// trade, refunded after it was finished).
	ErrConflict = errors.New("channels: event conflicts with the order")
)

// yuan parses a decimal amount with at most two decimals ("88.00", "0.5")
// into minor units, exactly.
func yuan(s string) (int64, error) {
	whole, frac, dot := strings.Cut(s, ".")
	if whole == "" || len(frac) > 2 || (dot && frac == "") {
		return 0, fmt.Errorf("%w: amount %q", ErrBadCallback, s)
	}
	for len(frac) < 2 {
		frac += "0"
	}
	for _, c := range whole + frac {
		if c < '0' || c > '9' {
			return 0, fmt.Errorf("%w: amount %q", ErrBadCallback, s)
		}
	}
	n, err := strconv.ParseInt(whole+frac, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%w: amount %q: %v", ErrBadCallback, s, err)
	}
	return n, nil
}

// formatYuan spells minor units as Alipay does: "88.00".
func formatYuan(n int64) string { return fmt.Sprintf("%d.%02d", n/100, n%100) }
