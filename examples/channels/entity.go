package channels

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/dedup"
)

// A channel's events of one order are the order's entity events
// (consumer.Config.Entity): the entity is our order number, and the version
// the time of the event, its ties broken by the rank of the channel's
// status (dedup.StatusRank). An event at or below the order's watermark — a
// payment re-sent after the refund that closed its trade, a TRADE_SUCCESS
// after TRADE_FINISHED — is stale: the consumer acknowledges it and never
// hands it to Apply. The time is the event's, never the delivery's: a
// re-send carries a new notify_time, Wechatpay-Timestamp or
// Stripe-Signature t, and the same event time.

// The channels' status machines, in their forward order.
var (
	// Alipay's trade_status: TRADE_FINISHED and TRADE_CLOSED end a trade
	// in different ways (a trade that can no longer be refunded, or a
	// closed one: refunded in full, or never paid).
	alipayStatuses = dedup.StatusRank("WAIT_BUYER_PAY", "TRADE_SUCCESS", "TRADE_FINISHED", "TRADE_CLOSED")
	// WeChat Pay's event_type: a transaction, then its refund's outcome.
	wechatStatuses = dedup.StatusRank("TRANSACTION.SUCCESS", "REFUND.ABNORMAL", "REFUND.CLOSED", "REFUND.SUCCESS")
	// Stripe's event types this example reads.
	stripeStatuses = dedup.StatusRank("payment_intent.succeeded", "charge.refunded")
)

// Entity is the order a notification is about, and its version: the time
// of the event (gmt_close, gmt_refund, gmt_payment, gmt_create: the first
// present, in Unix seconds, Beijing time), then trade_status's rank. A
// partial refund is TRADE_SUCCESS again with a later gmt_refund: newer
// than the payment. An unknown trade_status is an error
// (dedup.ErrUnknownStatus): dead-lettered as bad input.
func (a Alipay) Entity(m *consumer.Message) (consumer.Entity, error) {
	// Read as the key is (consumer.ByFormField): in the notification's
	// charset, GBK included.
	form := func(name string) (string, error) {
		v, err := consumer.ByFormField(name)(m)
		if errors.Is(err, consumer.ErrNoKey) {
			return "", nil
		}
		return v, err
	}
	var at, order, status string
	for _, f := range []string{"gmt_close", "gmt_refund", "gmt_payment", "gmt_create"} {
		v, err := form(f)
		if err != nil {
			return consumer.Entity{}, fmt.Errorf("%w: alipay: %v", ErrBadCallback, err)
		}
		if at = v; at != "" {
			break
		}
	}
	t, err := time.ParseInLocation(alipayTime, at, cst)
	if err != nil {
		return consumer.Entity{}, fmt.Errorf("%w: alipay: no time of the event (gmt_close, gmt_refund, gmt_payment, gmt_create): %v", ErrBadCallback, err)
	}
	if order, err = form("out_trade_no"); err == nil {
		status, err = form("trade_status")
	}
	if err != nil {
		return consumer.Entity{}, fmt.Errorf("%w: alipay: %v", ErrBadCallback, err)
	}
	ver, err := alipayStatuses.At(t.Unix(), status)
	return consumer.Entity{Name: order, Version: ver}, err
}

// Entity is the order a notification is about (resource.out_trade_no),
// and its version: the event's time (resource.success_time, else the
// notification's create_time; both the same on every re-send), then
// event_type's rank.
func (w WeChatPay) Entity(m *consumer.Message) (consumer.Entity, error) {
	r, err := readRecord(w.Name(), m.Value)
	if err != nil {
		return consumer.Entity{}, err
	}
	var n wechatNotification
	if err := json.Unmarshal(r.Body, &n); err != nil {
		return consumer.Entity{}, fmt.Errorf("%w: wechatpay: %v", ErrBadCallback, err)
	}
	at, err := time.Parse(time.RFC3339, cmp.Or(n.Resource.SuccessTime, n.CreateTime))
	if err != nil {
		return consumer.Entity{}, fmt.Errorf("%w: wechatpay: notification %s: %v", ErrBadCallback, n.ID, err)
	}
	ver, err := wechatStatuses.At(at.Unix(), n.EventType)
	return consumer.Entity{Name: n.Resource.OutTradeNo, Version: ver}, err
}

// Entity is the order an event is about (data.object.metadata.order_id),
// and its version: the event's created, then its type's rank.
func (s Stripe) Entity(m *consumer.Message) (consumer.Entity, error) {
	r, err := readRecord(s.Name(), m.Value)
	if err != nil {
		return consumer.Entity{}, err
	}
	var e stripeEvent
	if err := json.Unmarshal(r.Body, &e); err != nil {
		return consumer.Entity{}, fmt.Errorf("%w: stripe: %v", ErrBadCallback, err)
	}
	ver, err := stripeStatuses.At(e.Created, e.Type)
	return consumer.Entity{Name: e.Data.Object.Metadata["order_id"], Version: ver}, err
}
