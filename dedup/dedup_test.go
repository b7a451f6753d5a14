package dedup_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/idemkit/idem/dedup"
)

func TestKeyValidate(t *testing.T) {
	ok := []dedup.Key{{"payments", "T-1"}, {"p/tenant-a", strings.Repeat("k", 256)}, {strings.Repeat("s", 128), "ü"}}
	for _, k := range ok {
		if err := k.Validate(); err != nil {
			t.Errorf("%q: %v", k, err)
		}
	}
	bad := []struct {
		k    dedup.Key
		says string
	}{
		{dedup.Key{"", "x"}, "scope is empty"},
		{dedup.Key{"s", ""}, "id is empty"},
		{dedup.Key{"s", strings.Repeat("k", 257)}, "id is 257 bytes, the limit is 256"},
		{dedup.Key{strings.Repeat("s", 129), "x"}, "scope is 129 bytes, the limit is 128"},
		{dedup.Key{"s", "a\nb"}, "control character U+000A"},
		{dedup.Key{"s", "a\x00"}, "control character U+0000"},
		{dedup.Key{"s", "\xff"}, "not valid UTF-8"},
	}
	for _, c := range bad {
		err := c.k.Validate()
		if !errors.Is(err, dedup.ErrInvalidKey) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%q: %v, want ErrInvalidKey saying %q", c.k, err, c.says)
		}
	}
}

func TestFingerprint(t *testing.T) {
	same := [][]string{
		{`{"amount":100,"txn":"T1"}`, `{ "txn" : "T1", "amount" : 100.0 }`, `{"amount":1e2,"txn":"\u0054\u0031"}`},
		{`not json`, `not json`},
	}
	for _, group := range same {
		want := dedup.FingerprintOf([]byte(group[0]))
		for _, p := range group[1:] {
			if got := dedup.FingerprintOf([]byte(p)); got != want {
				t.Errorf("%s and %s differ", group[0], p)
			}
		}
	}
	differ := []string{`{"amount":100,"txn":"T1"}`, `{"amount":101,"txn":"T1"}`, `{"amount":"100","txn":"T1"}`, `{"amount":100,"txn":"T1","x":null}`, `not json `}
	seen := map[dedup.Fingerprint]string{}
	for _, p := range differ {
		f := dedup.FingerprintOf([]byte(p))
		if q, ok := seen[f]; ok {
			t.Errorf("%s and %s have one fingerprint", p, q)
		}
		seen[f] = p
	}
}
