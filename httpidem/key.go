package httpidem

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/idemkit/idem/dedup"
)

type idKey struct{}

// KeyFrom returns the request's key as the middleware decoded it — the
// header's value as it stands, or the inside of its quoted form ("abc" and
// abc are one key, abc) — in the handler of either mode; ok is false for a
// request without one (a keyless request of an Optional route). Compare
// and store this, never the raw header. A leased handler's Lease has it
// too, with its scope.
func KeyFrom(ctx context.Context) (key string, ok bool) {
	key, ok = ctx.Value(idKey{}).(string)
	return key, ok
}

// errNoKey: the request carries no key.
var errNoKey = errors.New("no key")

// keyOf reads the key from r's header field: the value as it stands or,
// quoted, a Structured Fields string (RFC 9651), which the IETF draft
// specifies. It is validated as every dedup key is — 1 to 256 bytes, UTF-8,
// no control characters — and never truncated.
func keyOf(r *http.Request, header string) (string, error) {
	vs := r.Header[header]
	switch {
	case len(vs) == 0:
		return "", errNoKey
	case len(vs) > 1:
		return "", fmt.Errorf("%d %s header fields: send one", len(vs), header)
	}
	id := vs[0]
	if len(id) >= 2 && id[0] == '"' && id[len(id)-1] == '"' {
		var err error
		if id, err = sfString(id[1 : len(id)-1]); err != nil {
			return "", fmt.Errorf("%s is not a valid quoted string: %v", header, err)
		}
	}
	if err := (dedup.Key{Scope: "-", ID: id}).Validate(); err != nil {
		detail := strings.TrimPrefix(err.Error(), dedup.ErrInvalidKey.Error()+": id ")
		return "", fmt.Errorf("%s %s", header, detail)
	}
	return id, nil
}

// keyFrom takes the key from the request with Route.Key, and checks it as
// keyOf checks a header's.
func (rt *route) keyFrom(r *http.Request, body []byte) (string, error) {
	id, err := rt.Key(r, body)
	switch {
	case err != nil:
		return "", fmt.Errorf("the request names no key: %v", err)
	case id == "":
		return "", errors.New("the request names no key: Route.Key found none")
	}
	if err := (dedup.Key{Scope: "-", ID: id}).Validate(); err != nil {
		return "", fmt.Errorf("the request's key %s", strings.TrimPrefix(err.Error(), dedup.ErrInvalidKey.Error()+": id "))
	}
	return id, nil
}

// sfString decodes the inside of a Structured Fields string: printable
// ASCII, with \" and \\ the only escapes.
func sfString(s string) (string, error) {
	if !strings.ContainsAny(s, `"\`) {
		for i := 0; i < len(s); i++ {
			if s[i] < 0x20 || s[i] > 0x7e {
				return "", fmt.Errorf("byte %#x at %d is not printable ASCII", s[i], i)
			}
		}
		return s, nil
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '\\':
			if i+1 == len(s) || (s[i+1] != '"' && s[i+1] != '\\') {
				return "", fmt.Errorf("bad escape at %d", i)
			}
			i++
			b.WriteByte(s[i])
		case c == '"':
			return "", fmt.Errorf("unescaped quote at %d", i)
		case c < 0x20 || c > 0x7e:
			return "", fmt.Errorf("byte %#x at %d is not printable ASCII", c, i)
		default:
			b.WriteByte(c)
		}
	}
	return b.String(), nil
}
