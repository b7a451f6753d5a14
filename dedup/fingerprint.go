package dedup

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"slices"
	"strings"
	"unicode/utf8"
)

// Fingerprint is the SHA-256 of a payload's canonical form. Two deliveries of
// the same key with different fingerprints are different requests under one
// key: a mismatch, not a duplicate.
type Fingerprint [32]byte

func (f Fingerprint) String() string { return hex.EncodeToString(f[:]) }

// FingerprintOf returns the fingerprint of payload. A payload that is valid
// JSON is hashed in canonical form: object keys sorted, insignificant
// whitespace dropped, strings re-escaped one way and numbers spelled one way
// (1.50, 1.5 and 15e-1 are the same number). Anything else is hashed as raw
// bytes.
func FingerprintOf(payload []byte) Fingerprint {
	if c, err := CanonicalJSON(payload); err == nil {
		return sha256.Sum256(c)
	}
	return sha256.Sum256(payload)
}

// CanonicalJSON returns the canonical form of a JSON text, or an error when
// payload is not exactly one valid JSON value.
func CanonicalJSON(payload []byte) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.UseNumber()
	var out bytes.Buffer
	out.Grow(len(payload))
	if err := canonValue(dec, &out); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("dedup: trailing data after JSON value")
	}
	return out.Bytes(), nil
}

func canonValue(dec *json.Decoder, out *bytes.Buffer) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	return canonToken(dec, tok, out)
}

func canonToken(dec *json.Decoder, tok json.Token, out *bytes.Buffer) error {
	switch v := tok.(type) {
	case json.Delim:
		switch v {
		case '{':
			return canonObject(dec, out)
		case '[':
			out.WriteByte('[')
			for i := 0; dec.More(); i++ {
				if i > 0 {
					out.WriteByte(',')
				}
				if err := canonValue(dec, out); err != nil {
					return err
				}
			}
			_, err := dec.Token() // ']'
			out.WriteByte(']')
			return err
		}
		return errors.New("dedup: unexpected JSON delimiter")
	case string:
		writeJSONString(out, v)
	case json.Number:
		out.WriteString(canonNumber(string(v)))
	case bool:
		if v {
			out.WriteString("true")
		} else {
			out.WriteString("false")
		}
	case nil:
		out.WriteString("null")
	}
	return nil
}

func canonObject(dec *json.Decoder, out *bytes.Buffer) error {
	type member struct {
		key string
		val []byte
	}
	var members []member
	for dec.More() {
		kt, err := dec.Token()
		if err != nil {
			return err
		}
		key, _ := kt.(string)
		var val bytes.Buffer
		if err := canonValue(dec, &val); err != nil {
			return err
		}
		members = append(members, member{key, val.Bytes()})
	}
	if _, err := dec.Token(); err != nil { // '}'
		return err
	}
	slices.SortFunc(members, func(a, b member) int { return strings.Compare(a.key, b.key) })
	out.WriteByte('{')
	for i, m := range members {
		if i > 0 {
			out.WriteByte(',')
		}
		writeJSONString(out, m.key)
		out.WriteByte(':')
		out.Write(m.val)
	}
	out.WriteByte('}')
	return nil
}

const hexDigits = "0123456789abcdef"

func writeJSONString(out *bytes.Buffer, s string) {
	out.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"':
			out.WriteString(`\"`)
		case r == '\\':
			out.WriteString(`\\`)
		case r < 0x20:
			out.WriteString(`\u00`)
			out.WriteByte(hexDigits[r>>4])
			out.WriteByte(hexDigits[r&0xF])
		case r == utf8.RuneError:
			out.WriteString(`\ufffd`)
		default:
			out.WriteRune(r)
		}
	}
	out.WriteByte('"')
}

// canonNumber spells a valid JSON number as digits with no leading or
// trailing zeros and a decimal exponent: 150 -> 15e1, 1.50 -> 15e-1, 0.0 -> 0.
// It is exact: no float conversion.
func canonNumber(s string) string {
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	mant, exp := s, 0
	if i := strings.IndexAny(s, "eE"); i >= 0 {
		mant = s[:i]
		e := s[i+1:]
		eneg := strings.HasPrefix(e, "-")
		e = strings.TrimLeft(e, "+-")
		for _, c := range e {
			exp = exp*10 + int(c-'0')
			if exp > 1<<20 { // absurd exponents: keep them distinct but bounded
				exp = 1 << 20
			}
		}
		if eneg {
			exp = -exp
		}
	}
	intPart, frac := mant, ""
	if i := strings.IndexByte(mant, '.'); i >= 0 {
		intPart, frac = mant[:i], mant[i+1:]
	}
	digits := intPart + frac
	exp -= len(frac)
	digits = strings.TrimLeft(digits, "0")
	if digits == "" {
		return "0"
	}
	trimmed := strings.TrimRight(digits, "0")
	exp += len(digits) - len(trimmed)
	var b strings.Builder
	if neg {
		b.WriteByte('-')
	}
	b.WriteString(trimmed)
	if exp != 0 {
		b.WriteByte('e')
		if exp < 0 {
			b.WriteByte('-')
			exp = -exp
		}
		var buf [12]byte
		i := len(buf)
		for exp > 0 {
			i--
			buf[i] = byte('0' + exp%10)
			exp /= 10
		}
		b.Write(buf[i:])
	}
	return b.String()
}
