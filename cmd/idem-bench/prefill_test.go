package main

import (
	"fmt"
	"slices"
	"testing"
)

// The table-size rows' keys have the prefilled keys' shape: 36 to 64
// bytes, a UUID first, every width in between used; the same message
// gives the same key, another row another one.
func TestWideKeys(t *testing.T) {
	seen := map[int]bool{}
	for i := range 5000 {
		id := fmt.Sprintf("T%012d", i)
		k := wideOf("idem-b100@10M", id)
		if len(k) < 36 || len(k) > 64 || k[8] != '-' || k[13] != '-' || k[18] != '-' || k[23] != '-' {
			t.Fatalf("key %q of %d bytes: want a UUID and up to 28 hex digits", k, len(k))
		}
		if wideOf("idem-b100@10M", id) != k || wideOf("idem-b1@10M", id) == k {
			t.Fatalf("key of %s: not the row's own, or not stable", id)
		}
		seen[len(k)] = true
	}
	for w := 36; w <= 64; w++ {
		if !seen[w] {
			t.Fatalf("no key of %d bytes in 5000", w)
		}
	}
}

func TestParseCounts(t *testing.T) {
	got, err := parseCounts("0, 1M,250k,10000000,30M") // 250k after 1M: the table only grows
	if err == nil {
		t.Fatalf("decreasing counts accepted: %v", got)
	}
	got, err = parseCounts("0,1M,10000000,30M")
	if err != nil || !slices.Equal(got, []int64{0, 1000000, 10000000, 30000000}) {
		t.Fatalf("parseCounts: %v, %v", got, err)
	}
	for _, bad := range []string{"", "x", "-1", "1G"} {
		if _, err := parseCounts(bad); err == nil {
			t.Fatalf("parseCounts(%q) accepted", bad)
		}
	}
	if countName(30000000) != "30M" || countName(0) != "0" || countName(250000) != "250k" || countName(1234) != "1234" {
		t.Fatal("countName")
	}
}
