package dedup_test

import (
	"testing"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/internal/shorten"
)

// TestMaxReasonLenIsShortensBound: the stores cut reasons with
// internal/shorten, which stands below dedup and so keeps its own number.
func TestMaxReasonLenIsShortensBound(t *testing.T) {
	if dedup.MaxReasonLen != shorten.MaxLen {
		t.Fatalf("dedup.MaxReasonLen is %d, shorten.MaxLen %d: the stores would cut reasons to another length than the contract says", dedup.MaxReasonLen, shorten.MaxLen)
	}
}
