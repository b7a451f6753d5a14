package channels

import (
	"crypto/hmac"
	"encoding/base64"
	"encoding/json"
	"fmt"
)

// WeChatPay reads WeChat Pay API v3 notifications, as the gateway records
// them: the headers Wechatpay-Timestamp, -Nonce, -Signature and -Serial, new
// on every delivery, and the JSON body: id, create_time, event_type
// (TRANSACTION.SUCCESS, REFUND.SUCCESS), resource_type, summary, resource.
//
// The real resource is AEAD_AES_256_GCM ciphertext under the merchant's
// APIv3 key; here it travels decrypted (see testdata/channels/SOURCES.md).
type WeChatPay struct {
	Secret []byte
	Serial string
}

// Name is "wechatpay".
func (WeChatPay) Name() string { return "wechatpay" }

type wechatNotification struct {
	ID           string         `json:"id"`
	CreateTime   string         `json:"create_time"`
	ResourceType string         `json:"resource_type"`
	EventType    string         `json:"event_type"`
	Summary      string         `json:"summary"`
	Resource     wechatResource `json:"resource"`
}

// wechatResource is a decrypted transaction or refund.
type wechatResource struct {
	Mchid         string       `json:"mchid"`
	Appid         string       `json:"appid,omitempty"`
	TransactionID string       `json:"transaction_id"`
	OutTradeNo    string       `json:"out_trade_no"`
	TradeState    string       `json:"trade_state,omitempty"`   // transaction
	RefundID      string       `json:"refund_id,omitempty"`     // refund
	OutRefundNo   string       `json:"out_refund_no,omitempty"` // refund
	RefundStatus  string       `json:"refund_status,omitempty"` // refund
	SuccessTime   string       `json:"success_time"`
	Amount        wechatAmount `json:"amount"`
}

type wechatAmount struct {
	Total         int64  `json:"total"`
	PayerTotal    int64  `json:"payer_total"`
	Currency      string `json:"currency,omitempty"`       // transaction
	PayerCurrency string `json:"payer_currency,omitempty"` // transaction
	Refund        int64  `json:"refund,omitempty"`         // refund
	PayerRefund   int64  `json:"payer_refund,omitempty"`   // refund
}

// wechatMessage is what WeChat Pay signs.
func wechatMessage(timestamp, nonce string, body []byte) string {
	return timestamp + "\n" + nonce + "\n" + string(body) + "\n"
}

// record returns a delivery's record value: body signed at timestamp with
// nonce.
func (w WeChatPay) record(timestamp, nonce string, body []byte) []byte {
	return newRecord(map[string]string{
		"Wechatpay-Timestamp": timestamp,
		"Wechatpay-Nonce":     nonce,
		"Wechatpay-Serial":    w.Serial,
		"Wechatpay-Signature": base64.StdEncoding.EncodeToString(hmacSHA256(w.Secret, wechatMessage(timestamp, nonce, body))),
	}, body)
}

// Verify checks the Wechatpay-Signature header over the body.
func (w WeChatPay) Verify(payload []byte) error {
	r, err := readRecord(w.Name(), payload)
	if err != nil {
		return err
	}
	if s := r.Headers["Wechatpay-Serial"]; s != w.Serial {
		return fmt.Errorf("%w: wechatpay: unknown platform serial %q", ErrBadSignature, s)
	}
	got, err := base64.StdEncoding.DecodeString(r.Headers["Wechatpay-Signature"])
	want := hmacSHA256(w.Secret, wechatMessage(r.Headers["Wechatpay-Timestamp"], r.Headers["Wechatpay-Nonce"], r.Body))
	if err != nil || !hmac.Equal(got, want) {
		return fmt.Errorf("%w: wechatpay: delivery at %s", ErrBadSignature, r.Headers["Wechatpay-Timestamp"])
	}
	return nil
}

// Decode reads a verified notification.
func (w WeChatPay) Decode(payload []byte) (Event, error) {
	r, err := readRecord(w.Name(), payload)
	if err != nil {
		return Event{}, err
	}
	var n wechatNotification
	if err := json.Unmarshal(r.Body, &n); err != nil {
		return Event{}, fmt.Errorf("%w: wechatpay: %v", ErrBadCallback, err)
	}
	res := n.Resource
	ev := Event{Channel: w.Name(), Trade: res.TransactionID, Order: res.OutTradeNo, Status: n.EventType, Currency: "CNY"}
	if ev.Trade == "" || ev.Order == "" {
		return ev, fmt.Errorf("%w: wechatpay: transaction_id or out_trade_no missing", ErrBadCallback)
	}
	switch {
	case n.EventType == "TRANSACTION.SUCCESS" && res.TradeState == "SUCCESS":
		ev.Kind, ev.Amount, ev.Currency = Pay, res.Amount.Total, res.Amount.Currency
	case n.EventType == "REFUND.SUCCESS" && res.RefundStatus == "SUCCESS":
		ev.Kind, ev.Amount = Refund, res.Amount.Refund // a refund carries no currency: the transaction's
	case n.EventType == "REFUND.ABNORMAL" || n.EventType == "REFUND.CLOSED":
		ev.Kind = Info
	default:
		return ev, fmt.Errorf("%w: wechatpay: event_type %q with trade_state %q, refund_status %q",
			ErrBadCallback, n.EventType, res.TradeState, res.RefundStatus)
	}
	return ev, nil
}
