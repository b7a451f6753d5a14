package dedup

import (
	"context"
	"errors"
	"time"
)

// ErrReleaseInProgress: another release of the scope has begun and has
// neither ended nor run past its hold (EpochStore.BeginRelease). Try again
// once it ended.
var ErrReleaseInProgress = errors.New("dedup: another release of the scope is in progress")

// Epoch is a scope's release epoch as EpochStore.Epochs reads it.
type Epoch struct {
	// N only grows: a release moves it forward when it begins and again
	// when it ends, and so does AdvanceEpoch. A scope without a row is at 0.
	N int64
	// Releasing: a release of the scope has begun and has neither ended
	// nor run past its hold, by the store's clock when Epochs read it.
	Releasing bool
}

// EpochStore is a Store that keeps, per scope, a release epoch in its own
// database: a counter moved forward around every deliberate deletion of a
// scope's rows, so that a cache in front of the store (dedup/redisfront)
// can tell an entry it wrote before a release from one written after it,
// whatever happened to the cache meanwhile (flushed, restarted, restored
// from an old snapshot). The cache tags each entry with the epoch it read
// before the claim that made the entry, and trusts an entry only while the
// scope's epoch is still that one and no release is in progress.
//
// Implementations are safe for concurrent use.
type EpochStore interface {
	// Epochs returns, outside any transaction, the epoch of every scope
	// that has one; a scope it does not list is at Epoch{}.
	Epochs(ctx context.Context) (map[string]Epoch, error)

	// AdvanceEpoch moves scope's epoch forward, in a transaction of its
	// own, and returns the new N.
	AdvanceEpoch(ctx context.Context, scope string) (int64, error)

	// BeginRelease moves scope's epoch forward and marks a release of it
	// in progress until EndRelease ends it or the store's clock passes
	// now + hold. It returns the release's token (the new N). While another
	// release of scope is marked it moves nothing and fails with an error
	// wrapping ErrReleaseInProgress.
	BeginRelease(ctx context.Context, scope string, hold time.Duration) (token int64, err error)

	// EndRelease moves scope's epoch forward and ends the release of
	// token; a release marked since (token's ran past its hold) stays
	// marked.
	EndRelease(ctx context.Context, scope string, token int64) error
}
