package shorten

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestShortCutsOnARuneBoundary(t *testing.T) {
	if got := Reason("too late"); got != "too late" {
		t.Errorf("Reason of a short reason: %q", got)
	}
	if got := Reason(strings.Repeat("é", 400)); len(got) != MaxLen || !utf8.ValidString(got) { // 800 bytes
		t.Errorf("Reason of 400 two-byte runes: %d bytes", len(got))
	}
	s := strings.Repeat("a", MaxLen-1) + "é" // the rune straddles MaxLen
	got := Reason(s)
	if len(got) != MaxLen-1 || !utf8.ValidString(got) {
		t.Errorf("Short: %d bytes, valid %v; want %d bytes of valid UTF-8", len(got), utf8.ValidString(got), MaxLen-1)
	}
}
