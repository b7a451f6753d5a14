package dedup

import (
	"crypto/sha256"
	"encoding/hex"
	"sync"

	"github.com/idemkit/idem/internal/jsonx"
)

// Fingerprint is the SHA-256 of a payload's canonical form. Two deliveries of
// the same key with different fingerprints are different requests under one
// key: a mismatch, not a duplicate.
type Fingerprint [32]byte

func (f Fingerprint) String() string { return hex.EncodeToString(f[:]) }

// IsZero reports whether f is the zero Fingerprint, which stands for none.
func (f Fingerprint) IsZero() bool { return f == Fingerprint{} }

// Mismatches reports whether a step kept with fingerprint f was begun for
// another payload than fp: both are set and they differ (see
// Journal.BeginStep).
func (f Fingerprint) Mismatches(fp Fingerprint) bool {
	return !f.IsZero() && !fp.IsZero() && f != fp
}

var canonicalizers = sync.Pool{New: func() any { return new(jsonx.Canonicalizer) }}

// FingerprintOf returns the fingerprint of payload. A payload that is valid
// JSON is hashed in canonical form: object keys sorted, insignificant
// whitespace dropped, strings re-escaped one way and numbers spelled one way
// (1.50, 1.5 and 15e-1 are the same number). Anything else is hashed as raw
// bytes.
func FingerprintOf(payload []byte) Fingerprint {
	z := canonicalizers.Get().(*jsonx.Canonicalizer)
	defer canonicalizers.Put(z)
	if c, err := z.Canonical(payload); err == nil {
		return sha256.Sum256(c)
	}
	return sha256.Sum256(payload)
}
