package httpidem

import (
	"crypto/sha256"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"testing"

	"github.com/idemkit/idem/dedup"
)

// TestPathValues: the wildcards of the pattern ServeMux matched, in order,
// with their values; none without wildcards or without a pattern.
func TestPathValues(t *testing.T) {
	for _, tc := range []struct {
		pattern, path string
		want          []pathValue
	}{
		{"POST /payments/{id}/capture", "/payments/7/capture", []pathValue{{"id", "7"}}},
		{"POST example.com/a/{x}/b/{rest...}", "/a/1/b/c/d", []pathValue{{"x", "1"}, {"rest", "c/d"}}},
		{"/files/{name}/{$}", "/files/%2Fetc/", []pathValue{{"name", "/etc"}}},
		{"POST /payments", "/payments", nil},
		{"GET /{$}", "/", nil},
	} {
		mux := http.NewServeMux()
		var got []pathValue
		mux.HandleFunc(tc.pattern, func(_ http.ResponseWriter, r *http.Request) { got = pathValues(r) })
		r := httptest.NewRequest(http.MethodPost, "http://example.com"+tc.path, nil)
		if tc.pattern == "GET /{$}" {
			r.Method = http.MethodGet
		}
		mux.ServeHTTP(httptest.NewRecorder(), r)
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s on %s: %v, want %v", tc.pattern, tc.path, got, tc.want)
		}
	}
	if got := pathValues(httptest.NewRequest(http.MethodPost, "/x", nil)); got != nil {
		t.Errorf("no pattern: %v, want none", got)
	}
}

// TestRequestFingerprintCompatible: a route without wildcards fingerprints
// as before path values joined the identity, so that keys stored by an
// earlier version still match; with them, each value changes it.
func TestRequestFingerprintCompatible(t *testing.T) {
	body := dedup.FingerprintOf([]byte(`{"amount":1}`))
	h := sha256.New()
	for _, f := range [][2]string{{"method", "POST"}, {"route", "/payments"}, {"body", string(body[:])}} {
		fmt.Fprintf(h, "%d:%s%d:%s", len(f[0]), f[0], len(f[1]), f[1])
	}
	var before dedup.Fingerprint
	h.Sum(before[:0])
	if got := requestFingerprint("POST", "/payments", nil, body); got != before {
		t.Fatalf("without path values: %x, want the earlier %x", got, before)
	}
	one := requestFingerprint("POST", "/payments/{id}", []pathValue{{"id", "1"}}, body)
	two := requestFingerprint("POST", "/payments/{id}", []pathValue{{"id", "2"}}, body)
	if one == two || one == requestFingerprint("POST", "/payments/{id}", nil, body) {
		t.Fatal("path values do not change the fingerprint")
	}
}
