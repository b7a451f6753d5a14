package channels

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
)

// spec says which fields of a channel's callback are its identity (the dedup
// key: the trade and its status, one event of the trade) and which define
// "the same request" (the fingerprint: order, trade, status, amount,
// currency — never the notification time, nonce or signature, which change
// on every re-send).
type spec struct {
	form bool     // form fields; else dotted JSON paths into the record
	key  []string // joined, the dedup key
	// optional parts of the key after key, left out where absent
	// (consumer.KeyFunc.Optional): an Alipay refund's out_biz_no
	optional []string
	// typeField, when set, picks the fingerprint's fields by its value: a
	// payment and a refund are defined by different fields. fields[""] is
	// for every other value, or for all when typeField is empty.
	typeField string
	fields    map[string][]string
}

func (Alipay) spec() spec {
	return spec{
		form:     true,
		key:      []string{"trade_no", "trade_status"},
		optional: []string{"out_biz_no"}, // a partial refund is TRADE_SUCCESS again
		fields:   map[string][]string{"": {"out_trade_no", "trade_no", "trade_status", "total_amount", "refund_fee"}},
	}
}

func (WeChatPay) spec() spec {
	const r = "body.resource."
	return spec{
		key:       []string{r + "transaction_id", "body.event_type"},
		typeField: "body.event_type",
		fields: map[string][]string{
			"TRANSACTION.SUCCESS": {"body.event_type", r + "transaction_id", r + "out_trade_no", r + "trade_state", r + "amount.total", r + "amount.currency"},
			"REFUND.SUCCESS":      {"body.event_type", r + "transaction_id", r + "out_trade_no", r + "refund_id", r + "refund_status", r + "amount.total", r + "amount.refund"},
			"":                    {"body.event_type", r + "transaction_id", r + "out_trade_no"},
		},
	}
}

func (Stripe) spec() spec {
	const o = "body.data.object."
	return spec{
		key:       []string{o + "id", "body.type"},
		typeField: "body.type",
		fields: map[string][]string{
			"payment_intent.succeeded": {"body.type", o + "id", o + "amount_received", o + "currency", o + "metadata.order_id"},
			"charge.refunded":          {"body.type", o + "id", o + "payment_intent", o + "amount_refunded", o + "currency", o + "metadata.order_id"},
			"":                         {"body.type", o + "id"},
		},
	}
}

// lookup reads the fields of payload, for the generator's expectations;
// the consumer reads them with consumer.FormFields and consumer.JSONFields.
func (s spec) lookup(payload []byte, names []string) ([]string, error) {
	out := make([]string, len(names))
	if s.form {
		v, err := url.ParseQuery(string(payload))
		if err != nil {
			return nil, err
		}
		for i, n := range names {
			out[i] = v.Get(n)
		}
		return out, nil
	}
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.UseNumber()
	var doc any
	if err := dec.Decode(&doc); err != nil {
		return nil, err
	}
	for i, n := range names {
		v := doc
		for _, seg := range strings.Split(n, ".") {
			m, ok := v.(map[string]any)
			if !ok {
				return nil, fmt.Errorf("%s: not an object at %q", n, seg)
			}
			v = m[seg]
		}
		if v != nil {
			out[i] = fmt.Sprint(v)
		}
	}
	return out, nil
}

// keyOf is the event a payload delivers, "trade:status" (and
// ":out_biz_no" for a refund), as consumer.Composite spells it: absent
// optional parts at the end left out.
func (s spec) keyOf(payload []byte) (string, error) {
	parts, err := s.lookup(payload, append(append([]string(nil), s.key...), s.optional...))
	for len(parts) > len(s.key) && parts[len(parts)-1] == "" {
		parts = parts[:len(parts)-1]
	}
	for i, p := range parts {
		parts[i] = strings.NewReplacer(`\`, `\\`, ":", `\:`).Replace(p)
	}
	return strings.Join(parts, ":"), err
}

// fingerprintOf is the values the fingerprint covers, joined.
func (s spec) fingerprintOf(payload []byte) (string, error) {
	fields := s.fields[""]
	if s.typeField != "" {
		t, err := s.lookup(payload, []string{s.typeField})
		if err != nil {
			return "", err
		}
		if f, ok := s.fields[t[0]]; ok {
			fields = f
		}
	}
	vals, err := s.lookup(payload, fields)
	return strings.Join(fields, ",") + "=" + strings.Join(vals, "\x1f"), err
}
