// Package jsonx is the small, allocation-light JSON scanner behind key
// extraction and payload fingerprints: it finds a field by path without
// decoding the rest, and writes a canonical form (keys sorted, whitespace
// dropped, strings and numbers spelled one way). Both run once per message,
// so they avoid encoding/json's per-token allocations.
package jsonx

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// Kind is the type of a JSON value.
type Kind uint8

const (
	Invalid Kind = iota
	Object
	Array
	String
	Number
	True
	False
	Null
)

func (k Kind) String() string {
	return [...]string{"invalid", "object", "array", "string", "number", "true", "false", "null"}[k]
}

// SyntaxError is a malformed JSON text.
type SyntaxError struct {
	Offset int
	Msg    string
}

func (e *SyntaxError) Error() string { return fmt.Sprintf("%s at byte %d", e.Msg, e.Offset) }

// ErrNotFound: the path does not exist in the document.
var ErrNotFound = errors.New("jsonx: path not found")

// NotObjectError: a path segment's parent is not an object.
type NotObjectError struct {
	Depth int  // index of the segment whose parent is not an object
	Kind  Kind // what was found instead
}

func (e *NotObjectError) Error() string {
	return fmt.Sprintf("jsonx: value at depth %d is %s, not an object", e.Depth, e.Kind)
}

// DuplicateKeyError: an object on the path has the key twice.
type DuplicateKeyError struct {
	Depth int
	Key   string
}

func (e *DuplicateKeyError) Error() string {
	return fmt.Sprintf("jsonx: key %q appears twice in one object", e.Key)
}

type scanner struct {
	data []byte
	pos  int
}

func (s *scanner) errf(msg string) error { return &SyntaxError{Offset: s.pos, Msg: msg} }

func (s *scanner) ws() {
	for s.pos < len(s.data) {
		switch s.data[s.pos] {
		case ' ', '\t', '\n', '\r':
			s.pos++
		default:
			return
		}
	}
}

func (s *scanner) peek() Kind {
	s.ws()
	if s.pos >= len(s.data) {
		return Invalid
	}
	switch c := s.data[s.pos]; {
	case c == '{':
		return Object
	case c == '[':
		return Array
	case c == '"':
		return String
	case c == '-' || c >= '0' && c <= '9':
		return Number
	case c == 't':
		return True
	case c == 'f':
		return False
	case c == 'n':
		return Null
	}
	return Invalid
}

// str scans a string at pos (on the quote) and returns its raw contents
// (between the quotes) and whether it has escapes.
func (s *scanner) str() (raw []byte, escaped bool, err error) {
	s.pos++ // opening quote
	start := s.pos
	for s.pos < len(s.data) {
		c := s.data[s.pos]
		switch {
		case c == '"':
			raw = s.data[start:s.pos]
			s.pos++
			return raw, escaped, nil
		case c == '\\':
			escaped = true
			if s.pos+1 >= len(s.data) {
				return nil, false, s.errf("unterminated escape")
			}
			switch s.data[s.pos+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				s.pos += 2
			case 'u':
				if s.pos+6 > len(s.data) {
					return nil, false, s.errf("short \\u escape")
				}
				for _, h := range s.data[s.pos+2 : s.pos+6] {
					if !isHex(h) {
						return nil, false, s.errf("bad \\u escape")
					}
				}
				s.pos += 6
			default:
				return nil, false, s.errf("bad escape")
			}
		case c < 0x20:
			return nil, false, s.errf("control character in string")
		default:
			s.pos++
		}
	}
	return nil, false, s.errf("unterminated string")
}

func isHex(c byte) bool { return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F' }

// num scans a number and returns its text.
func (s *scanner) num() ([]byte, error) {
	start := s.pos
	d := s.data
	if s.pos < len(d) && d[s.pos] == '-' {
		s.pos++
	}
	switch {
	case s.pos < len(d) && d[s.pos] == '0':
		s.pos++
	case s.pos < len(d) && d[s.pos] >= '1' && d[s.pos] <= '9':
		for s.pos < len(d) && d[s.pos] >= '0' && d[s.pos] <= '9' {
			s.pos++
		}
	default:
		return nil, s.errf("bad number")
	}
	if s.pos < len(d) && d[s.pos] == '.' {
		s.pos++
		n := s.pos
		for s.pos < len(d) && d[s.pos] >= '0' && d[s.pos] <= '9' {
			s.pos++
		}
		if s.pos == n {
			return nil, s.errf("bad number fraction")
		}
	}
	if s.pos < len(d) && (d[s.pos] == 'e' || d[s.pos] == 'E') {
		s.pos++
		if s.pos < len(d) && (d[s.pos] == '+' || d[s.pos] == '-') {
			s.pos++
		}
		n := s.pos
		for s.pos < len(d) && d[s.pos] >= '0' && d[s.pos] <= '9' {
			s.pos++
		}
		if s.pos == n {
			return nil, s.errf("bad number exponent")
		}
	}
	return d[start:s.pos], nil
}

func (s *scanner) lit(word string) error {
	if !bytes.HasPrefix(s.data[s.pos:], []byte(word)) {
		return s.errf("bad literal")
	}
	s.pos += len(word)
	return nil
}

const maxDepth = 512

// skip scans one value.
func (s *scanner) skip(depth int) error {
	if depth > maxDepth {
		return s.errf("nesting too deep")
	}
	switch s.peek() {
	case Object:
		s.pos++
		s.ws()
		if s.pos < len(s.data) && s.data[s.pos] == '}' {
			s.pos++
			return nil
		}
		for {
			s.ws()
			if s.peek() != String {
				return s.errf("object key is not a string")
			}
			if _, _, err := s.str(); err != nil {
				return err
			}
			if err := s.colon(); err != nil {
				return err
			}
			if err := s.skip(depth + 1); err != nil {
				return err
			}
			if done, err := s.next('}'); err != nil || done {
				return err
			}
		}
	case Array:
		s.pos++
		s.ws()
		if s.pos < len(s.data) && s.data[s.pos] == ']' {
			s.pos++
			return nil
		}
		for {
			if err := s.skip(depth + 1); err != nil {
				return err
			}
			if done, err := s.next(']'); err != nil || done {
				return err
			}
		}
	case String:
		_, _, err := s.str()
		return err
	case Number:
		_, err := s.num()
		return err
	case True:
		return s.lit("true")
	case False:
		return s.lit("false")
	case Null:
		return s.lit("null")
	}
	if s.pos >= len(s.data) {
		return s.errf("unexpected end of input")
	}
	return s.errf("unexpected character")
}

func (s *scanner) colon() error {
	s.ws()
	if s.pos >= len(s.data) || s.data[s.pos] != ':' {
		return s.errf("expected ':'")
	}
	s.pos++
	return nil
}

// next consumes ',' (false) or the closing delimiter (true).
func (s *scanner) next(closing byte) (bool, error) {
	s.ws()
	if s.pos >= len(s.data) {
		return false, s.errf("unexpected end of input")
	}
	switch s.data[s.pos] {
	case ',':
		s.pos++
		return false, nil
	case closing:
		s.pos++
		return true, nil
	}
	return false, s.errf("expected ',' or '" + string(closing) + "'")
}

func (s *scanner) end() error {
	s.ws()
	if s.pos != len(s.data) {
		return s.errf("trailing data after JSON value")
	}
	return nil
}

// Valid reports whether data is exactly one JSON value.
func Valid(data []byte) error {
	s := scanner{data: data}
	if err := s.skip(0); err != nil {
		return err
	}
	return s.end()
}

// find moves s to the value at path.
func (s *scanner) find(path []string) (Kind, string, error) {
	for depth, seg := range path {
		k := s.peek()
		if k != Object {
			if k == Invalid {
				if s.pos >= len(s.data) {
					return Invalid, "", s.errf("unexpected end of input")
				}
				return Invalid, "", s.errf("unexpected character")
			}
			return Invalid, "", &NotObjectError{Depth: depth, Kind: k}
		}
		s.pos++
		s.ws()
		if s.pos < len(s.data) && s.data[s.pos] == '}' {
			return Invalid, "", ErrNotFound
		}
		// Scan the whole object: a key that appears twice is refused, since
		// decoders disagree on which one counts (encoding/json: the last).
		at := -1
		for {
			s.ws()
			if s.peek() != String {
				return Invalid, "", s.errf("object key is not a string")
			}
			raw, esc, err := s.str()
			if err != nil {
				return Invalid, "", err
			}
			if err := s.colon(); err != nil {
				return Invalid, "", err
			}
			var match bool
			if esc {
				match = unescape(nil, raw) == seg
			} else {
				match = string(raw) == seg
			}
			if match {
				if at >= 0 {
					return Invalid, "", &DuplicateKeyError{Depth: depth, Key: seg}
				}
				s.ws()
				at = s.pos
			}
			if err := s.skip(depth + 1); err != nil {
				return Invalid, "", err
			}
			done, err := s.next('}')
			if err != nil {
				return Invalid, "", err
			}
			if done {
				break
			}
		}
		if at < 0 {
			return Invalid, "", ErrNotFound
		}
		s.pos = at
	}
	return Invalid, "", nil
}

// Lookup finds the value at path (object keys, outermost first) and returns
// its kind and its text: a string's decoded contents, a number's literal. The
// rest of the document is not checked. A document that is not an object at
// the top gives a *NotObjectError with Depth 0.
func Lookup(data []byte, path []string) (Kind, string, error) {
	s := scanner{data: data}
	if k, v, err := s.find(path); err != nil {
		return k, v, err
	}
	k := s.peek()
	switch k {
	case String:
		raw, esc, err := s.str()
		if err != nil {
			return Invalid, "", err
		}
		if esc {
			return String, unescape(nil, raw), nil
		}
		return String, string(raw), nil
	case Number:
		n, err := s.num()
		if err != nil {
			return Invalid, "", err
		}
		return Number, string(n), nil
	case Invalid:
		if s.pos >= len(s.data) {
			return Invalid, "", s.errf("unexpected end of input")
		}
		return Invalid, "", s.errf("unexpected character")
	}
	if err := s.skip(len(path)); err != nil {
		return Invalid, "", err
	}
	return k, "", nil
}

// LookupRaw finds the value at path, as Lookup does, and returns its kind and
// its JSON text as it stands in data.
func LookupRaw(data []byte, path []string) (Kind, []byte, error) {
	s := scanner{data: data}
	if k, _, err := s.find(path); err != nil {
		return k, nil, err
	}
	k := s.peek()
	if k == Invalid {
		if s.pos >= len(s.data) {
			return Invalid, nil, s.errf("unexpected end of input")
		}
		return Invalid, nil, s.errf("unexpected character")
	}
	start := s.pos
	if err := s.skip(len(path)); err != nil {
		return Invalid, nil, err
	}
	return k, data[start:s.pos], nil
}

// unescape decodes a string's raw contents. Invalid surrogates become U+FFFD.
func unescape(dst []byte, raw []byte) string {
	if dst == nil {
		dst = make([]byte, 0, len(raw))
	}
	for i := 0; i < len(raw); {
		c := raw[i]
		if c != '\\' {
			dst = append(dst, c)
			i++
			continue
		}
		switch raw[i+1] {
		case 'b':
			dst = append(dst, '\b')
		case 'f':
			dst = append(dst, '\f')
		case 'n':
			dst = append(dst, '\n')
		case 'r':
			dst = append(dst, '\r')
		case 't':
			dst = append(dst, '\t')
		case 'u':
			r := rune(hex4(raw[i+2 : i+6]))
			i += 6
			if utf16.IsSurrogate(r) {
				if i+6 <= len(raw) && raw[i] == '\\' && raw[i+1] == 'u' {
					if r2 := utf16.DecodeRune(r, rune(hex4(raw[i+2:i+6]))); r2 != utf8.RuneError {
						dst = utf8.AppendRune(dst, r2)
						i += 6
						continue
					}
				}
				r = utf8.RuneError
			}
			dst = utf8.AppendRune(dst, r)
			continue
		default: // " \ /
			dst = append(dst, raw[i+1])
		}
		i += 2
	}
	return string(dst)
}

func hex4(b []byte) uint16 {
	v, _ := strconv.ParseUint(string(b), 16, 16)
	return uint16(v)
}

// Canonical appends the canonical form of the JSON text data to dst: object
// members sorted by key, no insignificant whitespace, strings re-escaped one
// way (only '"', '\\' and control characters escaped; invalid UTF-8 as
// U+FFFD), numbers as digits without leading or trailing zeros and a decimal
// exponent (1.50 -> 15e-1, 150 -> 15e1, -0.0 -> 0). Exact: no float
// conversion.
func Canonical(dst, data []byte) ([]byte, error) {
	c := canon{s: scanner{data: data}}
	out, err := c.value(dst, 0)
	if err != nil {
		return dst, err
	}
	if err := c.s.end(); err != nil {
		return dst, err
	}
	return out, nil
}

type canon struct {
	s       scanner
	scratch []byte
	members []member
}

type member struct{ key, start, end int } // offsets into dst: key encoding end at key, value end at end

func (c *canon) value(dst []byte, depth int) ([]byte, error) {
	s := &c.s
	if depth > maxDepth {
		return dst, s.errf("nesting too deep")
	}
	switch s.peek() {
	case Object:
		return c.object(dst, depth)
	case Array:
		s.pos++
		dst = append(dst, '[')
		s.ws()
		if s.pos < len(s.data) && s.data[s.pos] == ']' {
			s.pos++
			return append(dst, ']'), nil
		}
		for first := true; ; first = false {
			if !first {
				dst = append(dst, ',')
			}
			var err error
			if dst, err = c.value(dst, depth+1); err != nil {
				return dst, err
			}
			done, err := s.next(']')
			if err != nil {
				return dst, err
			}
			if done {
				return append(dst, ']'), nil
			}
		}
	case String:
		raw, esc, err := s.str()
		if err != nil {
			return dst, err
		}
		return appendString(dst, raw, esc), nil
	case Number:
		n, err := s.num()
		if err != nil {
			return dst, err
		}
		return appendNumber(dst, n), nil
	case True:
		return append(dst, "true"...), s.lit("true")
	case False:
		return append(dst, "false"...), s.lit("false")
	case Null:
		return append(dst, "null"...), s.lit("null")
	}
	if s.pos >= len(s.data) {
		return dst, s.errf("unexpected end of input")
	}
	return dst, s.errf("unexpected character")
}

func (c *canon) object(dst []byte, depth int) ([]byte, error) {
	s := &c.s
	s.pos++
	s.ws()
	if s.pos < len(s.data) && s.data[s.pos] == '}' {
		s.pos++
		return append(dst, '{', '}'), nil
	}
	base := len(dst)
	mark := len(c.members)
	for {
		s.ws()
		if s.peek() != String {
			return dst, s.errf("object key is not a string")
		}
		raw, esc, err := s.str()
		if err != nil {
			return dst, err
		}
		start := len(dst)
		dst = appendString(dst, raw, esc)
		key := len(dst)
		if err := s.colon(); err != nil {
			return dst, err
		}
		if dst, err = c.value(dst, depth+1); err != nil {
			return dst, err
		}
		c.members = append(c.members, member{key: key, start: start, end: len(dst)})
		done, err := s.next('}')
		if err != nil {
			return dst, err
		}
		if done {
			break
		}
	}
	ms := c.members[mark:]
	body := dst[base:]
	slices.SortStableFunc(ms, func(a, b member) int {
		return bytes.Compare(dst[a.start:a.key], dst[b.start:b.key])
	})
	// Rewrite the members in key order through the scratch buffer.
	c.scratch = append(c.scratch[:0], body...)
	out := append(dst[:base], '{')
	for i, m := range ms {
		if i > 0 {
			out = append(out, ',')
		}
		out = append(out, c.scratch[m.start-base:m.key-base]...)
		out = append(out, ':')
		out = append(out, c.scratch[m.key-base:m.end-base]...)
	}
	c.members = c.members[:mark]
	return append(out, '}'), nil
}

const hexDigits = "0123456789abcdef"

func appendString(dst, raw []byte, escaped bool) []byte {
	src := raw
	if escaped {
		src = []byte(unescape(nil, raw))
	}
	dst = append(dst, '"')
	for i := 0; i < len(src); {
		c := src[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"':
				dst = append(dst, '\\', '"')
			case c == '\\':
				dst = append(dst, '\\', '\\')
			case c < 0x20:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
			default:
				dst = append(dst, c)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRune(src[i:])
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, "\uFFFD"...)
		} else {
			dst = append(dst, src[i:i+size]...)
		}
		i += size
	}
	return append(dst, '"')
}

// splitNumber takes a valid JSON number apart into its sign, its significant
// digits (no leading or trailing zeros; empty for zero) and a decimal
// exponent: n == ±(int+frac digits) × 10^exp. The digits are int and frac
// side by side; either may be empty.
func splitNumber(n []byte) (neg bool, intPart, frac []byte, exp int) {
	neg = n[0] == '-'
	if neg {
		n = n[1:]
	}
	mant := n
	if i := bytes.IndexAny(n, "eE"); i >= 0 {
		mant = n[:i]
		e := n[i+1:]
		eneg := len(e) > 0 && e[0] == '-'
		if len(e) > 0 && (e[0] == '-' || e[0] == '+') {
			e = e[1:]
		}
		for _, c := range e {
			if exp < 1<<26 { // past any exponent that matters; no overflow of a 32-bit int
				exp = exp*10 + int(c-'0')
			}
		}
		if eneg {
			exp = -exp
		}
	}
	intPart = mant
	if i := bytes.IndexByte(mant, '.'); i >= 0 {
		intPart, frac = mant[:i], mant[i+1:]
	}
	exp -= len(frac)
	// digits = intPart+frac without leading zeros and trailing zeros.
	lead := 0
	for lead < len(intPart) && intPart[lead] == '0' {
		lead++
	}
	intPart = intPart[lead:]
	if len(intPart) == 0 {
		lead = 0
		for lead < len(frac) && frac[lead] == '0' {
			lead++
		}
		frac = frac[lead:]
	}
	if len(intPart) == 0 && len(frac) == 0 {
		return false, nil, nil, 0
	}
	// Trailing zeros: from frac first, then intPart when frac is empty.
	for len(frac) > 0 && frac[len(frac)-1] == '0' {
		frac = frac[:len(frac)-1]
		exp++
	}
	if len(frac) == 0 {
		for len(intPart) > 0 && intPart[len(intPart)-1] == '0' {
			intPart = intPart[:len(intPart)-1]
			exp++
		}
	}
	return neg, intPart, frac, exp
}

// appendNumber writes a valid JSON number in canonical form.
func appendNumber(dst, n []byte) []byte {
	neg, intPart, frac, exp := splitNumber(n)
	if len(intPart) == 0 && len(frac) == 0 {
		return append(dst, '0')
	}
	if neg {
		dst = append(dst, '-')
	}
	dst = append(dst, intPart...)
	dst = append(dst, frac...)
	if exp != 0 {
		dst = append(dst, 'e')
		dst = strconv.AppendInt(dst, int64(exp), 10)
	}
	return dst
}

// MaxDecimalDigits bounds Decimal's output: a number whose plain decimal
// form needs more digits is refused.
const MaxDecimalDigits = 64

// Decimal returns the plain decimal spelling of the valid JSON number n,
// the one every spelling of the same value shares: 1000, 1e3, 1000.0 and
// 10000e-1 are all "1000"; 1.50 and 15e-1 are "1.5"; -0 is "0". Exact: no
// float conversion. ok is false when the decimal form would need more than
// MaxDecimalDigits digits (1e400, say).
func Decimal(n string) (s string, ok bool) {
	neg, intPart, frac, exp := splitNumber([]byte(n))
	nd := len(intPart) + len(frac)
	if nd == 0 {
		return "0", true
	}
	width := nd + max(exp, 0) // digits before the point, or all of them
	if exp < 0 {
		width = max(nd, -exp) + 1
	}
	if width > MaxDecimalDigits {
		return "", false
	}
	digits := make([]byte, 0, nd)
	digits = append(append(digits, intPart...), frac...)
	b := make([]byte, 0, width+3)
	if neg {
		b = append(b, '-')
	}
	switch {
	case exp >= 0:
		b = append(b, digits...)
		for range exp {
			b = append(b, '0')
		}
	case nd > -exp:
		b = append(b, digits[:nd+exp]...)
		b = append(b, '.')
		b = append(b, digits[nd+exp:]...)
	default:
		b = append(b, '0', '.')
		for range -exp - nd {
			b = append(b, '0')
		}
		b = append(b, digits...)
	}
	return string(b), true
}

// Canonicalizer reuses its buffers across calls. Not safe for concurrent use.
type Canonicalizer struct {
	c   canon
	out []byte
}

// Canonical returns the canonical form of data (see Canonical) in a buffer
// that is valid until the next call.
func (z *Canonicalizer) Canonical(data []byte) ([]byte, error) {
	z.c.s = scanner{data: data}
	out, err := z.c.value(z.out[:0], 0)
	z.out = out[:0]
	z.c.members = z.c.members[:0]
	if err != nil {
		return nil, err
	}
	if err := z.c.s.end(); err != nil {
		return nil, err
	}
	return out, nil
}
