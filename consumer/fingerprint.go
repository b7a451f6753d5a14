package consumer

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/internal/jsonx"
)

// FingerprintFunc says what "the same request" is. Two deliveries under one
// key with equal fingerprints are duplicates (skipped); with different
// fingerprints they are a mismatch — one key, two requests — which applies
// nothing and is dead-lettered with dedup.ErrFingerprintMismatch. An error
// is bad input: the message is dead-lettered with it.
//
// Choose the fields that define the request — amount, currency, order,
// status — and never the ones a sender changes on every re-send: a
// timestamp, a nonce, a signature, a notification ID. A payment channel
// re-sending its callback with a fresh notify_time and sign is a duplicate;
// fingerprinted over the whole payload it would be a mismatch, dead-lettered.
// Fingerprint too little, and a second request under a reused key (another
// amount) is skipped as a duplicate instead of refused.
type FingerprintFunc func(m *Message) (dedup.Fingerprint, error)

// WholePayload (the default) fingerprints the whole payload: a JSON payload
// in canonical form (keys sorted, whitespace dropped, numbers spelled one
// way), anything else as raw bytes. Right when the producer re-sends the
// payload unchanged; wrong for senders that stamp every delivery.
func WholePayload() FingerprintFunc {
	return func(m *Message) (dedup.Fingerprint, error) { return dedup.FingerprintOf(m.Value), nil }
}

// NoFingerprint treats every message under a key as the same request: all
// but the first are duplicates, whatever they carry. For keys that by
// themselves identify one immutable event (a broker message ID, an event ID
// the sender never reuses).
func NoFingerprint() FingerprintFunc {
	return func(*Message) (dedup.Fingerprint, error) { return dedup.Fingerprint{}, nil }
}

// JSONFields fingerprints the values of a JSON payload's fields, named by
// dotted paths, in canonical form (a number by its value: 100 and 100.0 are
// equal). A missing field counts as absent, which differs from any value,
// null included. A payload that is not a JSON object is bad input.
func JSONFields(paths ...string) FingerprintFunc {
	segs := make([][]string, len(paths))
	for i, p := range paths {
		segs[i] = strings.Split(p, ".")
	}
	return func(m *Message) (dedup.Fingerprint, error) {
		if err := jsonx.Valid(m.Value); err != nil {
			return dedup.Fingerprint{}, fmt.Errorf("%w: fingerprint: payload is not valid JSON: %v", ErrBadPayload, err)
		}
		h := sha256.New()
		var buf []byte
		for i, path := range paths {
			_, raw, err := jsonx.LookupRaw(m.Value, segs[i])
			var dup *jsonx.DuplicateKeyError
			var notObj *jsonx.NotObjectError
			switch {
			case errors.Is(err, jsonx.ErrNotFound), errors.As(err, &notObj) && notObj.Depth > 0:
				// Missing, or its parent is not an object ({"refund":null}):
				// absent, as ByJSONField finds no key there.
				writeAbsent(h, path)
				continue
			case errors.As(err, &dup):
				return dedup.Fingerprint{}, fmt.Errorf("%w: fingerprint field %q: %q appears twice in one object", ErrBadPayload, path, dup.Key)
			case err != nil:
				return dedup.Fingerprint{}, fmt.Errorf("%w: fingerprint field %q: %v", ErrBadPayload, path, err)
			}
			if buf, err = jsonx.Canonical(buf[:0], raw); err != nil {
				return dedup.Fingerprint{}, fmt.Errorf("%w: fingerprint field %q: %v", ErrBadPayload, path, err)
			}
			writeField(h, path, string(buf))
		}
		var f dedup.Fingerprint
		h.Sum(f[:0])
		return f, nil
	}
}

// FormFields fingerprints the values of an application/x-www-form-urlencoded
// payload's fields (the form Alipay-style notifications take), read as
// ByFormField reads them: URL-decoded ("a+b" and "a%20b" are one value),
// and a GBK, GB2312 or GB18030 body decoded to UTF-8 first, so that it
// fingerprints like its UTF-8 twin. A missing field counts as absent; a
// field given twice is bad input (readers disagree on which one counts).
func FormFields(names ...string) FingerprintFunc {
	return func(m *Message) (dedup.Fingerprint, error) {
		form, err := parseForm(m)
		if err != nil {
			return dedup.Fingerprint{}, err
		}
		h := sha256.New()
		for _, name := range names {
			vs, ok := form[name]
			switch {
			case !ok:
				writeAbsent(h, name)
			case len(vs) > 1:
				return dedup.Fingerprint{}, fmt.Errorf("%w: fingerprint field %q appears %d times in the form", ErrBadPayload, name, len(vs))
			default:
				writeField(h, name, vs[0])
			}
		}
		var f dedup.Fingerprint
		h.Sum(f[:0])
		return f, nil
	}
}

// writeField hashes one named value, length-prefixed and tagged so that no
// two lists of fields hash alike, and no value as an absent field.
func writeField(h io.Writer, name, value string) {
	fmt.Fprintf(h, "%d:%s=%d:%s", len(name), name, len(value), value)
}

// writeAbsent hashes a field that is not there.
func writeAbsent(h io.Writer, name string) {
	fmt.Fprintf(h, "%d:%s-", len(name), name)
}
