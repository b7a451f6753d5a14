package channels

import (
	"crypto/hmac"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
)

// Stripe reads Stripe webhook events, as the gateway records them: the
// Stripe-Signature header (t=<unix time>,v1=<HMAC-SHA256 of "t.body">, new on
// every delivery) and the Event (id evt_…, type, created, data.object). The
// order number is the PaymentIntent's metadata.order_id.
type Stripe struct{ Secret []byte }

// Name is "stripe".
func (Stripe) Name() string { return "stripe" }

type stripeEvent struct {
	ID         string `json:"id"`
	Object     string `json:"object"`
	APIVersion string `json:"api_version"`
	Created    int64  `json:"created"`
	Livemode   bool   `json:"livemode"`
	Type       string `json:"type"`
	Data       struct {
		Object stripeObject `json:"object"`
	} `json:"data"`
}

// stripeObject is a PaymentIntent or a Charge, the fields this example uses.
type stripeObject struct {
	ID             string            `json:"id"`
	Object         string            `json:"object"`
	Amount         int64             `json:"amount"`
	AmountReceived int64             `json:"amount_received,omitempty"` // PaymentIntent
	AmountRefunded int64             `json:"amount_refunded,omitempty"` // Charge
	Currency       string            `json:"currency"`
	PaymentIntent  string            `json:"payment_intent,omitempty"` // Charge
	Refunded       bool              `json:"refunded,omitempty"`       // Charge
	Status         string            `json:"status"`
	Metadata       map[string]string `json:"metadata"`
}

func (s Stripe) signature(t string, body []byte) string {
	return hex.EncodeToString(hmacSHA256(s.Secret, t, ".", string(body)))
}

// record returns a delivery's record value: body signed at t.
func (s Stripe) record(t string, body []byte) []byte {
	return newRecord(map[string]string{"Stripe-Signature": "t=" + t + ",v1=" + s.signature(t, body)}, body)
}

// Verify checks the Stripe-Signature header: one of its v1 signatures must
// match (there are two while a secret is rolled). The timestamp tolerance
// is the HTTP receiver's business, not the consumer's: a record may wait in
// Kafka longer than five minutes.
func (s Stripe) Verify(payload []byte) error {
	r, err := readRecord(s.Name(), payload)
	if err != nil {
		return err
	}
	var t string
	var v1 [][]byte
	for _, part := range strings.Split(r.Headers["Stripe-Signature"], ",") {
		k, v, _ := strings.Cut(part, "=")
		switch k {
		case "t":
			t = v
		case "v1":
			if b, err := hex.DecodeString(v); err == nil {
				v1 = append(v1, b)
			}
		}
	}
	if t != "" {
		want, _ := hex.DecodeString(s.signature(t, r.Body))
		for _, got := range v1 {
			if hmac.Equal(got, want) {
				return nil
			}
		}
	}
	return fmt.Errorf("%w: stripe: delivery at t=%s", ErrBadSignature, t)
}

// Decode reads a verified event.
func (s Stripe) Decode(payload []byte) (Event, error) {
	r, err := readRecord(s.Name(), payload)
	if err != nil {
		return Event{}, err
	}
	var e stripeEvent
	if err := json.Unmarshal(r.Body, &e); err != nil {
		return Event{}, fmt.Errorf("%w: stripe: %v", ErrBadCallback, err)
	}
	o := e.Data.Object
	ev := Event{Channel: s.Name(), Order: o.Metadata["order_id"], Status: e.Type, Currency: strings.ToUpper(o.Currency)}
	switch e.Type {
	case "payment_intent.succeeded":
		ev.Kind, ev.Trade, ev.Amount = Pay, o.ID, o.AmountReceived
	case "charge.refunded":
		ev.Kind, ev.Trade, ev.Amount = Refund, o.PaymentIntent, o.AmountRefunded
	default:
		return ev, fmt.Errorf("%w: stripe: event type %q", ErrBadCallback, e.Type)
	}
	if ev.Trade == "" || ev.Order == "" {
		return ev, fmt.Errorf("%w: stripe: %s without a PaymentIntent or metadata.order_id", ErrBadCallback, e.ID)
	}
	return ev, nil
}
