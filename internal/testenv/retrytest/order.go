package retrytest

import (
	"fmt"
	"strings"
	"testing"
)

// KeySeq splits the ID of a key-ordered test's message, "<key>-<seq>"
// ("k03-2": the third message of key k03).
func KeySeq(id string) (key string, seq int) {
	key, s, _ := strings.Cut(id, "-")
	fmt.Sscanf(s, "%d", &seq)
	return key, seq
}

// CheckHeldBack fails t for each ID of applied (what was applied while the
// failing keys' message seq from was in retry) that is a failing key's
// message from seq from on: with KeyOrdered those follow it into retry.
func CheckHeldBack(t testing.TB, applied []string, failingKeys map[string]bool, from int) {
	t.Helper()
	for _, id := range applied {
		if k, s := KeySeq(id); failingKeys[k] && s >= from {
			t.Errorf("%s applied while %s-%d was in retry", id, k, from)
		}
	}
}

// CheckKeyOrder fails t when the IDs of ledger, in the order they were
// applied, do not run 0, 1, 2, … for each key (the first 5 reported), and
// returns how many were out of their key's order.
func CheckKeyOrder(t testing.TB, ledger []string) int {
	t.Helper()
	next := map[string]int{}
	outOfOrder := 0
	for _, id := range ledger {
		k, s := KeySeq(id)
		if s != next[k] {
			outOfOrder++
			if outOfOrder <= 5 {
				t.Errorf("%s applied after %s-%d: out of its key's order", id, k, next[k]-1)
			}
		}
		next[k] = s + 1
	}
	return outOfOrder
}
