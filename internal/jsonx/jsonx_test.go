package jsonx

import (
	"bytes"
	"encoding/json"
	"errors"
	"math/big"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestCanonical(t *testing.T) {
	cases := []struct{ in, want string }{
		{`{"b":1,"a":2}`, `{"a":2,"b":1}`},
		{` { "a" : [ 1 , 2.50 , -0.0 , 1e2 , 0.05 , 10 ] } `, `{"a":[1,25e-1,0,1e2,5e-2,1e1]}`},
		{`{"a":{"z":null,"y":true},"\u0041":false}`, `{"A":false,"a":{"y":true,"z":null}}`},
		{`"a\/b\u00e9\n"`, `"a/bé\u000a"`},
		{`"\ud83d\ude00"`, `"😀"`},
		{`[]`, `[]`},
		{`{}`, `{}`},
		{`150`, `15e1`},
		{`1.5E+2`, `15e1`},
		{`-12.340e-1`, `-1234e-3`},
	}
	for _, c := range cases {
		got, err := Canonical(nil, []byte(c.in))
		if err != nil {
			t.Errorf("Canonical(%s): %v", c.in, err)
			continue
		}
		if string(got) != c.want {
			t.Errorf("Canonical(%s) = %s, want %s", c.in, got, c.want)
		}
	}
	for _, bad := range []string{``, `{`, `{"a":}`, `[1,]`, `01`, `1.`, `"\x"`, `{"a":1}x`, `tru`, `{"a" 1}`, "\"a\x01\""} {
		if _, err := Canonical(nil, []byte(bad)); err == nil {
			t.Errorf("Canonical(%q) accepted", bad)
		}
	}
}

func TestLookup(t *testing.T) {
	doc := []byte(`{"id":"x","pay":{"txn":"T-1","n":12.5,"o":{},"list":[1,{"txn":"no"}]},"esc\u0061":"yes"}`)
	cases := []struct {
		path []string
		kind Kind
		val  string
		err  error
	}{
		{[]string{"id"}, String, "x", nil},
		{[]string{"pay", "txn"}, String, "T-1", nil},
		{[]string{"pay", "n"}, Number, "12.5", nil},
		{[]string{"pay", "o"}, Object, "", nil},
		{[]string{"esca"}, String, "yes", nil},
		{[]string{"pay", "missing"}, Invalid, "", ErrNotFound},
		{[]string{"nope"}, Invalid, "", ErrNotFound},
	}
	for _, c := range cases {
		k, v, err := Lookup(doc, c.path)
		if k != c.kind || v != c.val || !errors.Is(err, c.err) {
			t.Errorf("Lookup(%v) = %v %q %v, want %v %q %v", c.path, k, v, err, c.kind, c.val, c.err)
		}
	}
	var dup *DuplicateKeyError
	if _, _, err := Lookup([]byte(`{"a":{"b":1,"b":2}}`), []string{"a", "b"}); !errors.As(err, &dup) || dup.Key != "b" {
		t.Errorf("duplicate key on the path: %v", err)
	}
	if k, v, err := Lookup([]byte(`{"a":1,"x":{"b":1,"b":2},"a2":3}`), []string{"a"}); err != nil || k != Number || v != "1" {
		t.Errorf("duplicates off the path are not the path's business: %v %q %v", k, v, err)
	}
	var no *NotObjectError
	if _, _, err := Lookup(doc, []string{"id", "x"}); !errors.As(err, &no) || no.Depth != 1 || no.Kind != String {
		t.Errorf("Lookup through a string: %v", err)
	}
}

func FuzzCanonical(f *testing.F) {
	for _, s := range []string{`{"b":1,"a":[1,2.0,{"c":"\u00e9"}]}`, `[]`, `"x"`, `-0.5e-3`, `{"a":{"a":{}}}`, `nul`, `{"a":1,"a":2}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		out, err := Canonical(nil, data)
		if (err == nil) != json.Valid(data) {
			t.Fatalf("Canonical error %v, json.Valid %v for %q", err, json.Valid(data), data)
		}
		if err != nil {
			return
		}
		if !json.Valid(out) {
			t.Fatalf("canonical form is not JSON: %q -> %q", data, out)
		}
		again, err := Canonical(nil, out)
		if err != nil || string(again) != string(out) {
			t.Fatalf("not idempotent: %q -> %q -> %q (%v)", data, out, again, err)
		}
		var z Canonicalizer
		reused, err := z.Canonical(data)
		if err != nil || string(reused) != string(out) {
			t.Fatalf("Canonicalizer differs: %q vs %q", reused, out)
		}
	})
}

func FuzzLookup(f *testing.F) {
	f.Add([]byte(`{"a":{"b":"x"}}`), "a", "b")
	f.Add([]byte(`{"a":1}`), "a", "")
	f.Fuzz(func(t *testing.T, data []byte, a, b string) {
		path := []string{a}
		if b != "" {
			path = append(path, b)
		}
		k, v, err := Lookup(data, path)
		if err != nil || !json.Valid(data) {
			return
		}
		// Compare with encoding/json on valid documents.
		var doc any
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.UseNumber()
		if dec.Decode(&doc) != nil {
			return
		}
		cur := doc
		for _, p := range path {
			m, ok := cur.(map[string]any)
			if !ok {
				t.Fatalf("Lookup found %v %q where encoding/json has no object", k, v)
			}
			if cur, ok = m[p]; !ok {
				t.Fatalf("Lookup found %v %q for a missing key", k, v)
			}
		}
		// Lookup refuses duplicate keys on the path, so it must agree with
		// encoding/json on kind and value.
		switch want := cur.(type) {
		case string:
			// encoding/json turns invalid UTF-8 into U+FFFD; Lookup keeps the
			// bytes (and dedup.Key refuses them).
			if k != String || utf8.ValidString(v) && v != want {
				t.Fatalf("Lookup = %v %q, encoding/json has string %q", k, v, want)
			}
		case json.Number:
			if k != Number || v != string(want) {
				t.Fatalf("Lookup = %v %q, encoding/json has number %s", k, v, want)
			}
		}
	})
}

func TestDecimal(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"1000", "1000"}, {"1e3", "1000"}, {"1E+3", "1000"}, {"1000.0", "1000"}, {"10000e-1", "1000"},
		{"1.50", "1.5"}, {"15e-1", "1.5"}, {"0.015e2", "1.5"}, {"-0", "0"}, {"-0.0e5", "0"}, {"0", "0"},
		{"-42", "-42"}, {"0.001", "0.001"}, {"1e-3", "0.001"}, {"123.456", "123.456"}, {"4200000000000421", "4200000000000421"},
	} {
		got, ok := Decimal(tc.in)
		if !ok || got != tc.want {
			t.Errorf("Decimal(%s) = %q, %v; want %q", tc.in, got, ok, tc.want)
		}
	}
	for _, in := range []string{"1e400", "1e-400", "1e64"} {
		if got, ok := Decimal(in); ok {
			t.Errorf("Decimal(%s) = %q, want refused (more than %d digits)", in, got, MaxDecimalDigits)
		}
	}
}

// FuzzDecimal: Decimal keeps the exact value, and every spelling of a value
// (here: its canonical one) gets the same decimal.
func FuzzDecimal(f *testing.F) {
	for _, s := range []string{"1000", "1e3", "1000.0", "-0.5e-2", "0", "12.0e+7"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, n string) {
		if Valid([]byte(n)) != nil || strings.ContainsAny(n, " \t\r\n") {
			return
		}
		if kind, _, err := Lookup([]byte(`{"n":`+n+`}`), []string{"n"}); err != nil || kind != Number {
			return
		}
		dec, ok := Decimal(n)
		if !ok {
			return
		}
		want, ok1 := new(big.Rat).SetString(n)
		if !ok1 {
			return // an exponent too large for big.Rat
		}
		got, ok2 := new(big.Rat).SetString(dec)
		if !ok2 || want.Cmp(got) != 0 {
			t.Fatalf("Decimal(%s) = %s: value changed", n, dec)
		}
		canon, err := Canonical(nil, []byte(n))
		if err != nil {
			t.Fatal(err)
		}
		if again, _ := Decimal(string(canon)); again != dec {
			t.Fatalf("Decimal(%s) = %s but Decimal(%s) = %s", n, dec, canon, again)
		}
	})
}
