package httpidem

import (
	"net/http"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

func keyFromValue(v string) (string, error) {
	r := &http.Request{Header: http.Header{DefaultHeader: {v}}}
	return keyOf(r, DefaultHeader)
}

func TestKeyOf(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		bad      bool
	}{
		{in: "8e03978e-40d5-43e8-bc93-6894a57f9324", want: "8e03978e-40d5-43e8-bc93-6894a57f9324"},
		{in: `"8e03978e-40d5"`, want: "8e03978e-40d5"},
		{in: `"a\"b\\c"`, want: `a"b\c`},
		{in: "café", want: "café"},
		{in: `"`, want: `"`}, // one quote is no quoted string
		{in: strings.Repeat("k", 256), want: strings.Repeat("k", 256)},
		{in: "", bad: true},
		{in: `""`, bad: true},
		{in: strings.Repeat("k", 257), bad: true},
		{in: "a\tb", bad: true},
		{in: "a\x00", bad: true},
		{in: "\xff", bad: true},
		{in: `"a\nb"`, bad: true},
		{in: `"a"b"`, bad: true},
		{in: "\"caf\xc3\xa9\"", bad: true},
	} {
		got, err := keyFromValue(tc.in)
		if tc.bad != (err != nil) || !tc.bad && got != tc.want {
			t.Errorf("keyOf(%q) = %q, %v; want %q (bad %v)", tc.in, got, err, tc.want, tc.bad)
		}
	}
	if _, err := keyOf(&http.Request{Header: http.Header{}}, DefaultHeader); err != errNoKey {
		t.Errorf("no header: %v, want errNoKey", err)
	}
	if _, err := keyOf(&http.Request{Header: http.Header{DefaultHeader: {"a", "b"}}}, DefaultHeader); err == nil {
		t.Error("two header fields accepted")
	}
}

// FuzzKeyOf: a key is either refused or valid as every dedup key is, and
// never cut: unquoted it is the header's value, quoted its decoding.
func FuzzKeyOf(f *testing.F) {
	for _, s := range []string{"k", `"k"`, `"a\"b"`, "a\tb", strings.Repeat("x", 300), "\xff", `"\`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		got, err := keyFromValue(v)
		if err != nil {
			return
		}
		if got == "" || len(got) > 256 || !utf8.ValidString(got) || strings.IndexFunc(got, unicode.IsControl) >= 0 {
			t.Fatalf("keyOf(%q) = %q: not a valid key", v, got)
		}
		quoted := len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"'
		if !quoted && got != v {
			t.Fatalf("keyOf(%q) = %q: an unquoted value must be the key as it stands", v, got)
		}
		if quoted && len(got) < len(v)-2-strings.Count(v, `\`) {
			t.Fatalf("keyOf(%q) = %q: shorter than its decoding can be", v, got)
		}
	})
}

func TestCapture(t *testing.T) {
	c := newCapture(10)
	c.WriteHeader(http.StatusContinue) // informational: ignored
	c.Header().Set("Location", "/x")
	c.Header().Set("X-Trace", "t")
	c.Header().Add("Link", "<b>")
	c.Header().Add("Link", "<a>")
	if _, err := c.Write([]byte("<html>")); err != nil {
		t.Fatal(err)
	}
	c.WriteHeader(http.StatusTeapot) // after the body: ignored
	c.Flush()
	if _, err := c.Write([]byte("12345")); err == nil || !c.tooLarge {
		t.Fatalf("write past the limit: %v", err)
	}
	c.finish()
	if c.status != http.StatusOK || c.header.Get("Content-Type") != "text/html; charset=utf-8" {
		t.Fatalf("status %d, Content-Type %q", c.status, c.header.Get("Content-Type"))
	}
	res := newCapture(10)
	res.Header().Set("Content-Type", "text/plain")
	res.Header().Set("X-Trace", "t")
	res.Header().Add("Link", "<b>")
	res.Header().Add("Link", "<a>")
	res.WriteHeader(http.StatusCreated)
	res.finish()
	stored := map[string]bool{"Content-Type": true, "Link": true}
	if got := string(res.response(stored).Header); got != `[["Content-Type","text/plain"],["Link","\u003cb\u003e"],["Link","\u003ca\u003e"]]` {
		t.Fatalf("stored header %s: want the stored fields sorted by name, values in order", got)
	}
}

func TestRouteName(t *testing.T) {
	rt, err := Route{}.resolve(false)
	if err != nil {
		t.Fatal(err)
	}
	for pattern, want := range map[string]string{
		"POST /payments/{id}":        "/payments/{id}",
		"/payments":                  "/payments",
		"POST example.com/payments/": "/payments/",
		"":                           "",
	} {
		got, err := rt.name(&http.Request{Pattern: pattern})
		if got != want || (want == "") != (err != nil) {
			t.Errorf("pattern %q: %q, %v; want %q", pattern, got, err, want)
		}
	}
}
