package consumer

import (
	"errors"
	"fmt"
	"strings"

	"github.com/idemkit/idem/internal/jsonx"
)

// KeyFunc derives the ID part of a message's dedup key. Which duplicates are
// caught depends on it:
//
//   - ByMessageID: the broker's ID. Kafka topic/partition/offset catches
//     redeliveries only (crash, rebalance); a producer retry gets a new offset.
//     RocketMQ's unique ID also survives the broker's retry topic. A copy
//     sent back by `idem redrive` is keyed by its original's ID (see Origin).
//   - ByRecordKey, ByHeader, ByJSONField: a business key (payment channel
//     transaction number, Idempotency-Key header). Also catches producer
//     retries, upstream re-sends and a user's double click.
//
// An error (no key, malformed payload) dead-letters the message: idem never
// falls back to another key silently.
type KeyFunc func(m *Message) (string, error)

// MissingKeyPolicy says what happens to a message whose key function finds
// no key (ErrNoKey).
type MissingKeyPolicy uint8

const (
	// DeadLetterMissingKey (the default) dead-letters the message: idem never
	// falls back to another key silently.
	DeadLetterMissingKey MissingKeyPolicy = iota
	// FallBackToMessageID keys the message by its broker message ID instead,
	// counted in Stats.KeyFallbacks and logged. For migrations, while old
	// producers do not set the business key yet: such messages are protected
	// against redelivery only, not against re-sends.
	FallBackToMessageID
)

// ByMessageID keys by the broker's message ID (Message.ID). A redriven copy
// whose lineage the consumer honours (Message.Origin) is keyed by its
// original's message ID instead, so that a letter redriven twice, or
// written twice, is applied once.
func ByMessageID() KeyFunc {
	return func(m *Message) (string, error) {
		id := identity(m)
		if id == "" {
			return "", fmt.Errorf("%w: the broker message ID is empty", ErrNoKey)
		}
		return id, nil
	}
}

// ByRecordKey keys by the record key (Kafka) or Keys (RocketMQ).
func ByRecordKey() KeyFunc {
	return func(m *Message) (string, error) {
		if len(m.Key) == 0 {
			return "", fmt.Errorf("%w: the record key is empty", ErrNoKey)
		}
		return string(m.Key), nil
	}
}

// ByHeader keys by a header (Kafka) or user property (RocketMQ), for example
// "Idempotency-Key".
func ByHeader(name string) KeyFunc {
	return func(m *Message) (string, error) {
		v, ok := m.Header(name)
		if !ok || len(v) == 0 {
			return "", fmt.Errorf("%w: header %q is missing or empty", ErrNoKey, name)
		}
		return string(v), nil
	}
}

// ByJSONField keys by a field of a JSON payload, named by a dotted path such as
// "payment.txn_id". The field must be a string or a number. A number is keyed
// by its value, not its spelling, as the fingerprint does: 1000, 1e3 and
// 1000.0 are the key "1000", 1.50 is "1.5" (exact decimal digits, no float
// rounding; a number needing more than 64 digits is refused). A number and
// the string of its digits are the same key: "1000" and 1000 are one
// payment.
func ByJSONField(path string) KeyFunc {
	segs := strings.Split(path, ".")
	return func(m *Message) (string, error) {
		return jsonLookup(m.Value, path, segs)
	}
}

// ByFormField keys by a field of an application/x-www-form-urlencoded
// payload, the form Alipay-style payment notifications take (trade_no, say).
// The value is compared after URL-decoding: "a+b", "a%20b" are one key. A
// body in GBK, GB2312 or GB18030 — as the charset parameter of the
// message's Content-Type header says or, without one, the body's own
// charset field, as Alipay sends it — is decoded to UTF-8 first, so that
// it keys like its UTF-8 twin; UTF-8, US-ASCII or no charset: the bytes
// are read as they are; any other charset is refused (ErrBadPayload). A
// field given twice is refused: readers disagree on which one counts.
func ByFormField(name string) KeyFunc {
	return func(m *Message) (string, error) {
		form, err := parseForm(m)
		if err != nil {
			return "", err
		}
		vs := form[name]
		switch {
		case len(vs) == 0 || vs[0] == "" && len(vs) == 1:
			return "", fmt.Errorf("%w: form field %q is missing or empty", ErrNoKey, name)
		case len(vs) > 1:
			return "", fmt.Errorf("%w: form field %q appears %d times", ErrBadPayload, name, len(vs))
		}
		return vs[0], nil
	}
}

// Optional makes f an optional part of a Composite key: where f finds no
// key (ErrNoKey), the part is absent instead of the whole key missing. Other
// errors (a malformed payload, a field given twice) stay errors. Outside
// Composite it changes nothing: a key must be found.
func (f KeyFunc) Optional() KeyFunc {
	return func(m *Message) (string, error) {
		v, err := f(m)
		if err != nil && errors.Is(err, ErrNoKey) {
			return "", &absentPart{err}
		}
		return v, err
	}
}

// absentPart is an Optional part's ErrNoKey.
type absentPart struct{ err error }

func (e *absentPart) Error() string { return e.err.Error() }
func (e *absentPart) Unwrap() error { return e.err }

// Composite keys by several parts joined with ':' — a trade number and its
// status, an event type and an ID — so that each status of one trade is an
// event of its own:
//
//	Key: consumer.Composite(consumer.ByJSONField("trade_no"), consumer.ByJSONField("trade_status"))
//
// A ':' or '\' inside a part is escaped with '\', so that no two lists of
// parts give one key. Every part must be found — a missing one is the
// message's missing key — except an Optional one. Absent optional parts at
// the end are left out, separator and all, so that adding optional parts
// to a key changes no key of the messages without them; an absent one
// followed by a present one is an empty part. An Alipay partial refund is
// a TRADE_SUCCESS notice of its trade, told apart by its refund request
// number:
//
//	Key: consumer.Composite(consumer.ByFormField("trade_no"), consumer.ByFormField("trade_status"),
//		consumer.ByFormField("out_biz_no").Optional())
func Composite(parts ...KeyFunc) KeyFunc {
	return func(m *Message) (string, error) {
		var b strings.Builder
		absent, pending := 0, 0 // absent parts; their separators, not written yet
		for i, part := range parts {
			v, err := part(m)
			var a *absentPart
			switch {
			case errors.As(err, &a):
				absent++
				if i > 0 {
					pending++
				}
				continue
			case err != nil:
				return "", fmt.Errorf("key part %d: %w", i+1, err)
			}
			for ; pending > 0; pending-- {
				b.WriteByte(':')
			}
			if i > 0 {
				b.WriteByte(':')
			}
			for i := 0; i < len(v); i++ { // byte by byte: invalid UTF-8 stays invalid, for Validate to refuse
				if v[i] == ':' || v[i] == '\\' {
					b.WriteByte('\\')
				}
				b.WriteByte(v[i])
			}
		}
		if absent == len(parts) {
			return "", fmt.Errorf("%w: every part of the key is absent", ErrNoKey)
		}
		return b.String(), nil
	}
}

// jsonLookup scans payload to the field at segs without decoding the rest.
// A truncated or otherwise malformed payload is refused even when the field
// itself is readable.
func jsonLookup(payload []byte, path string, segs []string) (string, error) {
	if err := jsonx.Valid(payload); err != nil {
		return "", fmt.Errorf("%w: key path %q: payload is not valid JSON: %v", ErrBadPayload, path, err)
	}
	kind, v, err := jsonx.Lookup(payload, segs)
	var notObj *jsonx.NotObjectError
	var dup *jsonx.DuplicateKeyError
	switch {
	case errors.As(err, &dup):
		return "", fmt.Errorf("%w: key path %q: %q appears twice in one object, so decoders disagree on its value", ErrBadPayload, path, dup.Key)
	case errors.As(err, &notObj) && notObj.Depth == 0:
		return "", fmt.Errorf("%w: key path %q: payload is a JSON %s, not an object", ErrBadPayload, path, notObj.Kind)
	case errors.As(err, &notObj):
		return "", fmt.Errorf("%w: key path %q: %q is not an object", ErrNoKey, path, strings.Join(segs[:notObj.Depth], "."))
	case errors.Is(err, jsonx.ErrNotFound):
		return "", fmt.Errorf("%w: key path %q not found in payload", ErrNoKey, path)
	case err != nil:
		return "", fmt.Errorf("%w: key path %q: payload is not valid JSON: %v", ErrBadPayload, path, err)
	}
	switch kind {
	case jsonx.String:
		if v == "" {
			return "", fmt.Errorf("%w: key path %q is an empty string", ErrNoKey, path)
		}
		return v, nil
	case jsonx.Number:
		// The fingerprint treats 1000, 1e3 and 1000.0 as one value; so
		// must the key, or one payment spelled three ways applies three
		// times.
		d, ok := jsonx.Decimal(v)
		if !ok {
			return "", fmt.Errorf("%w: key path %q: the number %s needs more than %d digits", ErrBadPayload, path, v, jsonx.MaxDecimalDigits)
		}
		return d, nil
	case jsonx.Null:
		return "", fmt.Errorf("%w: key path %q is null", ErrNoKey, path)
	default:
		return "", fmt.Errorf("%w: key path %q is %s, not a string or number", ErrNoKey, path, kind)
	}
}
