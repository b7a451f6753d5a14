package channels

import (
	"encoding/json"
	"fmt"
)

// record is what the webhook gateway publishes for one HTTP delivery of a
// JSON webhook: the headers the signature needs and the body, byte for byte
// (the signature covers the exact bytes; decoding into json.RawMessage keeps
// them). The channels that sign in headers (WeChat Pay, Stripe) need both,
// so both travel in the record's value — and so the value differs on every
// delivery, while the body of a re-send is the same.
type record struct {
	Headers map[string]string `json:"headers"`
	Body    json.RawMessage   `json:"body"`
}

// newRecord builds a record's value around body without re-encoding it.
func newRecord(headers map[string]string, body []byte) []byte {
	h, _ := json.Marshal(headers) // map keys sorted: deterministic
	out := make([]byte, 0, len(h)+len(body)+24)
	out = append(out, `{"headers":`...)
	out = append(out, h...)
	out = append(out, `,"body":`...)
	out = append(out, body...)
	return append(out, '}')
}

func readRecord(channel string, payload []byte) (record, error) {
	var r record
	if err := json.Unmarshal(payload, &r); err != nil {
		return r, fmt.Errorf("%w: %s: %v", ErrBadCallback, channel, err)
	}
	if len(r.Body) == 0 {
		return r, fmt.Errorf("%w: %s: no body", ErrBadCallback, channel)
	}
	return r, nil
}
