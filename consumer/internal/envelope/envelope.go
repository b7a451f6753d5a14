// Package envelope lets the consumer record on a message what it decided
// about it — the dedup key and fingerprint it claimed, the lineage it honoured — without
// making those fields writable by anyone else. Package source, which
// defines Message, fills these in; only the consumer calls them.
package envelope

import "github.com/idemkit/idem/dedup"

var (
	// SetIdentity records the dedup key and fingerprint the consumer
	// claimed m, a *source.Message, with (source.Message.DedupKey and
	// DedupFingerprint).
	SetIdentity func(m any, k dedup.Key, fp dedup.Fingerprint)
	// SetOrigin records o, a source.Origin, as the lineage the consumer
	// honours for m, a *source.Message, or clears it when o is nil
	// (source.Message.Origin).
	SetOrigin func(m any, o any)
)
