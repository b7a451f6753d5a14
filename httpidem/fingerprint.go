package httpidem

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/internal/jsonx"
)

// FingerprintFunc says what "the same request" is under one key, from the
// request and its whole body. Two requests under one key with equal
// fingerprints are one request sent twice (the second gets the first's
// response); with different ones they are two requests under one key
// (422). The middleware adds the method and the route to it. An error
// answers the request 400, before its key is taken.
//
// Choose what defines the operation — amount, currency, account — and leave
// out what a client changes on every attempt: a timestamp, a nonce, a
// signature.
type FingerprintFunc func(r *http.Request, body []byte) (dedup.Fingerprint, error)

// WholeBody (the default) fingerprints the whole body: JSON in canonical
// form (keys sorted, whitespace dropped, numbers spelled one way, as
// dedup.FingerprintOf), anything else as raw bytes.
func WholeBody() FingerprintFunc {
	return func(_ *http.Request, body []byte) (dedup.Fingerprint, error) { return dedup.FingerprintOf(body), nil }
}

// JSONFields fingerprints the values of a JSON body's fields, named by
// dotted paths, in canonical form. A missing field counts as absent, which
// differs from any value, null included. A body that is not JSON is a bad
// request.
func JSONFields(paths ...string) FingerprintFunc {
	segs := make([][]string, len(paths))
	for i, p := range paths {
		segs[i] = strings.Split(p, ".")
	}
	return func(_ *http.Request, body []byte) (dedup.Fingerprint, error) {
		if err := jsonx.Valid(body); err != nil {
			return dedup.Fingerprint{}, fmt.Errorf("the body is not valid JSON: %v", err)
		}
		h := sha256.New()
		var buf []byte
		for i, path := range paths {
			_, raw, err := jsonx.LookupRaw(body, segs[i])
			var dup *jsonx.DuplicateKeyError
			switch {
			case errors.Is(err, jsonx.ErrNotFound):
				writeField(h, path, "\x00absent")
				continue
			case errors.As(err, &dup):
				return dedup.Fingerprint{}, fmt.Errorf("field %q: %q appears twice in one object", path, dup.Key)
			case err != nil:
				return dedup.Fingerprint{}, fmt.Errorf("field %q: %v", path, err)
			}
			if buf, err = jsonx.Canonical(buf[:0], raw); err != nil {
				return dedup.Fingerprint{}, fmt.Errorf("field %q: %v", path, err)
			}
			writeField(h, path, string(buf))
		}
		var f dedup.Fingerprint
		h.Sum(f[:0])
		return f, nil
	}
}

// FormFields fingerprints the values of an application/x-www-form-urlencoded
// body's fields. A missing field counts as absent; a field given twice is a
// bad request (readers disagree on which one counts).
func FormFields(names ...string) FingerprintFunc {
	return func(_ *http.Request, body []byte) (dedup.Fingerprint, error) {
		form, err := url.ParseQuery(string(body))
		if err != nil {
			return dedup.Fingerprint{}, fmt.Errorf("the body is not a valid form: %v", err)
		}
		h := sha256.New()
		for _, name := range names {
			switch vs, ok := form[name]; {
			case !ok:
				writeField(h, name, "\x00absent")
			case len(vs) > 1:
				return dedup.Fingerprint{}, fmt.Errorf("field %q appears %d times in the form", name, len(vs))
			default:
				writeField(h, name, vs[0])
			}
		}
		var f dedup.Fingerprint
		h.Sum(f[:0])
		return f, nil
	}
}

// writeField hashes one named value, length-prefixed so that no two lists
// of fields hash alike.
func writeField(h interface{ Write([]byte) (int, error) }, name, value string) {
	fmt.Fprintf(h, "%d:%s%d:%s", len(name), name, len(value), value)
}

// pathValue is a wildcard of the matched pattern and its value.
type pathValue struct{ name, value string }

// pathValues returns the wildcards of the http.ServeMux pattern that
// matched r, in the pattern's order, with their values: {id} and {rest...}
// segments ({$} is no wildcard). None when no pattern matched.
func pathValues(r *http.Request) []pathValue {
	p := r.Pattern
	if i := strings.IndexAny(p, " \t"); i >= 0 {
		p = p[i:] // after the method
	}
	i := strings.IndexByte(p, '/')
	if i < 0 {
		return nil
	}
	var out []pathValue
	for seg := range strings.SplitSeq(p[i+1:], "/") {
		if len(seg) < 3 || seg[0] != '{' || seg[len(seg)-1] != '}' {
			continue
		}
		name := strings.TrimSuffix(seg[1:len(seg)-1], "...")
		if name == "$" {
			continue
		}
		out = append(out, pathValue{name, r.PathValue(name)})
	}
	return out
}

// requestFingerprint binds a body's fingerprint to the method, the route
// and the path values. Without path values it is what it was before they
// were added, so that keys stored then still match.
func requestFingerprint(method, route string, paths []pathValue, body dedup.Fingerprint) dedup.Fingerprint {
	h := sha256.New()
	writeField(h, "method", method)
	writeField(h, "route", route)
	for _, pv := range paths {
		writeField(h, "path "+pv.name, pv.value)
	}
	writeField(h, "body", string(body[:]))
	var f dedup.Fingerprint
	h.Sum(f[:0])
	return f
}
