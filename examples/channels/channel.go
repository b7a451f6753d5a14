package channels

import (
	"context"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/examples/payments"
)

// Channel is one payment channel: how its callbacks are verified, read,
// keyed and fingerprinted. Alipay, WeChatPay and Stripe implement it.
type Channel interface {
	Name() string
	// Verify checks the callback's signature (ErrBadSignature).
	Verify(payload []byte) error
	// Decode reads a verified callback.
	Decode(payload []byte) (Event, error)
	// Key is the event's dedup key: the trade and its status
	// (consumer.Composite), so that a trade's payment and its refund are two
	// events and a re-send of either is a duplicate.
	Key() consumer.KeyFunc
	// Fingerprint covers the fields that define the event — order, trade,
	// status, amount, currency — and none that a re-send changes.
	Fingerprint() consumer.FingerprintFunc
	// Entity is the order the callback is about, and the event's version:
	// its time, then its status's rank (consumer.Config.Entity). An older
	// event of the order than one applied is stale, never applied.
	Entity(m *consumer.Message) (consumer.Entity, error)
}

// Key reads trade_no and trade_status, and a refund's out_biz_no: each
// partial refund is a TRADE_SUCCESS notice of its own.
func (a Alipay) Key() consumer.KeyFunc { return a.spec().keyFunc() }

// Fingerprint covers out_trade_no, trade_no, trade_status, total_amount and
// refund_fee; not notify_time, notify_id, sign.
func (a Alipay) Fingerprint() consumer.FingerprintFunc { return a.spec().fingerprintFunc() }

// Key reads the resource's transaction_id and the event_type.
func (w WeChatPay) Key() consumer.KeyFunc { return w.spec().keyFunc() }

// Fingerprint covers, per event_type, the order, transaction, state and
// amounts of the resource; not the headers, id or create_time.
func (w WeChatPay) Fingerprint() consumer.FingerprintFunc { return w.spec().fingerprintFunc() }

// Key reads the event's object ID (the PaymentIntent, the Charge) and type.
func (s Stripe) Key() consumer.KeyFunc { return s.spec().keyFunc() }

// Fingerprint covers, per type, the object, its amount, currency and
// metadata.order_id; not Stripe-Signature, nor the event's id or created
// (Stripe may describe one change in two Event objects).
func (s Stripe) Fingerprint() consumer.FingerprintFunc { return s.spec().fingerprintFunc() }

func (s spec) keyFunc() consumer.KeyFunc {
	var parts []consumer.KeyFunc
	for i, f := range append(append([]string(nil), s.key...), s.optional...) {
		part := consumer.ByJSONField(f)
		if s.form {
			part = consumer.ByFormField(f)
		}
		if i >= len(s.key) {
			part = part.Optional()
		}
		parts = append(parts, part)
	}
	return consumer.Composite(parts...)
}

func (s spec) fingerprintFunc() consumer.FingerprintFunc {
	byType := make(map[string]consumer.FingerprintFunc, len(s.fields))
	for t, fields := range s.fields {
		if s.form {
			byType[t] = consumer.FormFields(fields...)
		} else {
			byType[t] = consumer.JSONFields(fields...)
		}
	}
	if s.typeField == "" {
		return byType[""]
	}
	typeOf := consumer.ByJSONField(s.typeField)
	return func(m *consumer.Message) (fp dedup.Fingerprint, err error) {
		t, err := typeOf(m)
		if err != nil {
			return fp, err
		}
		f, ok := byType[t]
		if !ok {
			f = byType[""]
		}
		return f(m)
	}
}

// Handler applies a channel's callbacks in tx; db adapts the transaction
// (payments.Pgx). It verifies the signature again — it does not rely on
// being configured with Config's Validate — reads the callback and applies it.
// It never commits. Apply refuses an event that contradicts its order with
// consumer.Reject; a callback that fails here to verify or to read is
// Permanent, its key recorded as failed: with Validate configured that
// cannot happen, and without it a forgery ahead of the genuine callback
// takes its key (TestForgeryAheadTakesTheKeyWhenOnlyTheHandlerVerifies).
func Handler[TTx any](ch Channel, db func(TTx) payments.DB) consumer.Handler[TTx] {
	key := ch.Key()
	return consumer.HandlerFunc[TTx](func(ctx context.Context, tx TTx, m *consumer.Message) error {
		if err := ch.Verify(m.Value); err != nil {
			return consumer.Permanent(err)
		}
		ev, err := ch.Decode(m.Value)
		if err != nil {
			return consumer.Permanent(err)
		}
		k, err := key(m) // recorded with the event: the same key the dedup row has
		if err != nil {
			return consumer.Permanent(err)
		}
		source := m.ID
		if source == "" {
			source = m.Coordinates()
		}
		return Apply(ctx, db(tx), ev, k, source)
	})
}

// MaxPayload bounds a callback; the channels' are a few KiB.
const MaxPayload = 64 << 10

// Config is a channel's consumer configuration, but for Source, Store and
// DeadLetter: named after the channel (the dedup scope), the signature
// checked by consumer.Config.Validate before the key is claimed (a forgery
// arriving first would otherwise claim the genuine callback's key and have it
// recorded as failed: a payment lost to a forged request), keyed by trade and
// status, fingerprinted by the channel's fields, and ordered per order by
// the channel's Entity: an event older than one applied is stale, never
// handed to Apply. The Store must keep entity watermarks (pgstore does).
func Config[TTx any](ch Channel, db func(TTx) payments.DB) consumer.Config[TTx] {
	return consumer.Config[TTx]{
		Name:            ch.Name() + "-callbacks",
		Handler:         Handler(ch, db),
		Validate:        func(_ context.Context, m *consumer.Message) error { return ch.Verify(m.Value) },
		Key:             ch.Key(),
		Fingerprint:     ch.Fingerprint(),
		Entity:          ch.Entity,
		MaxPayloadBytes: MaxPayload,
	}
}
