package channels

import (
	"crypto/hmac"
	"encoding/base64"
	"fmt"
	"net/url"
	"sort"
	"strings"
)

// Alipay reads Alipay's asynchronous notifications: a form-urlencoded POST
// body (notify_time, notify_id, sign_type, sign, trade_no, out_trade_no,
// trade_status, total_amount, refund_fee, …), carried as the record's value
// unchanged. A re-send has a new notify_time and so a new sign; the trade's
// later statuses are new notifications under the same trade_no, and so is
// each partial refund: TRADE_SUCCESS again, with refund_fee (the refunded
// total), gmt_refund and the refund's out_biz_no.
type Alipay struct{ Secret []byte }

// alipaySignType names the test stand-in for RSA2 (see Keys).
const alipaySignType = "HMAC-SHA256-TEST"

// Name is "alipay".
func (Alipay) Name() string { return "alipay" }

// alipayContent is the string Alipay signs: every parameter but sign and
// sign_type, empty ones left out, sorted by name, as name=value joined by &.
func alipayContent(v url.Values) string {
	names := make([]string, 0, len(v))
	for name := range v {
		if name != "sign" && name != "sign_type" && v.Get(name) != "" {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	var b strings.Builder
	for i, name := range names {
		if i > 0 {
			b.WriteByte('&')
		}
		b.WriteString(name + "=" + v.Get(name))
	}
	return b.String()
}

// sign sets sign_type and sign.
func (a Alipay) sign(v url.Values) {
	v.Set("sign_type", alipaySignType)
	v.Set("sign", base64.StdEncoding.EncodeToString(hmacSHA256(a.Secret, alipayContent(v))))
}

// Verify checks the notification's sign.
func (a Alipay) Verify(payload []byte) error {
	v, err := url.ParseQuery(string(payload))
	if err != nil {
		return fmt.Errorf("%w: alipay: not a form: %v", ErrBadCallback, err)
	}
	if st := v.Get("sign_type"); st != alipaySignType {
		return fmt.Errorf("%w: alipay: sign_type %q, want %q", ErrBadSignature, st, alipaySignType)
	}
	got, err := base64.StdEncoding.DecodeString(v.Get("sign"))
	if err != nil || !hmac.Equal(got, hmacSHA256(a.Secret, alipayContent(v))) {
		return fmt.Errorf("%w: alipay: notification %s of trade %s", ErrBadSignature, v.Get("notify_id"), v.Get("trade_no"))
	}
	return nil
}

// Decode reads a verified notification.
func (a Alipay) Decode(payload []byte) (Event, error) {
	v, err := url.ParseQuery(string(payload))
	if err != nil {
		return Event{}, fmt.Errorf("%w: alipay: not a form: %v", ErrBadCallback, err)
	}
	ev := Event{Channel: a.Name(), Trade: v.Get("trade_no"), Order: v.Get("out_trade_no"), Status: v.Get("trade_status"), Currency: "CNY"}
	if ev.Trade == "" || ev.Order == "" {
		return ev, fmt.Errorf("%w: alipay: trade_no or out_trade_no missing", ErrBadCallback)
	}
	switch ev.Status {
	case "TRADE_SUCCESS", "TRADE_FINISHED":
		ev.Kind = Pay
		if ev.Status == "TRADE_FINISHED" {
			ev.Kind = Finish
		}
		if ev.Amount, err = yuan(v.Get("total_amount")); err != nil {
			return ev, err
		}
		// A partial refund is another TRADE_SUCCESS notice of the trade,
		// with the refunded total, the refund's time and its request number.
		if fee := v.Get("refund_fee"); fee != "" && ev.Status == "TRADE_SUCCESS" {
			if ev.Refunded, err = yuan(fee); err != nil || ev.Refunded == 0 {
				return ev, err
			}
			if ev.Kind, ev.Refund = PartialRefund, v.Get("out_biz_no"); ev.Refund == "" {
				return ev, fmt.Errorf("%w: alipay: a refund of trade %s without out_biz_no", ErrBadCallback, ev.Trade)
			}
		}
	case "TRADE_CLOSED":
		// Closed: an unpaid trade timed out, or a paid one was refunded in
		// full (refund_fee).
		ev.Kind = Info
		if fee := v.Get("refund_fee"); fee != "" {
			var refund int64
			if refund, err = yuan(fee); err == nil && refund > 0 {
				ev.Kind, ev.Amount = Refund, refund
			}
		}
	case "WAIT_BUYER_PAY":
		ev.Kind = Info
	default:
		return ev, fmt.Errorf("%w: alipay: trade_status %q", ErrBadCallback, ev.Status)
	}
	return ev, err
}
