package dedup

import (
	"context"
	"time"
)

// Row is one row of a store's dedup table, as an operator sees it.
type Row struct {
	Key         Key
	Fingerprint Fingerprint
	Outcome     string // "done" or "failed"
	Reason      string // why a failed key failed
	Source      string // where its first message came from
	CreatedAt   time.Time
	ExpiresAt   time.Time // zero: kept for ever
}

// ScopeSummary counts one scope's rows of one outcome.
type ScopeSummary struct {
	Scope   string
	Outcome string
	Rows    int64
	Expired int64 // past ExpiresAt, waiting for Purge
	// Oldest is the row created first.
	OldestKey string
	OldestAt  time.Time
	// Retention is the longest ExpiresAt − CreatedAt among the rows; Forever
	// reports rows kept for ever.
	Retention time.Duration
	Forever   bool
	// HTTP Idempotency-Keys (RequestStore) among Rows, by state: a scope
	// with any is an HTTP scope. Stuck counts the Processing ones whose
	// lease has run out. All zero for a consumer's scope.
	Processing, Finished, Stuck int64
}

// RowFilter selects failed rows.
type RowFilter struct {
	Scope     string        // exact; empty: every scope
	OlderThan time.Duration // created at least this long ago; 0: any
	NewerThan time.Duration // created at most this long ago; 0: any
	Reason    string        // a substring of the reason; empty: any
	Limit     int           // at most this many rows, oldest first; 0: 100
}

// Admin is what the idem command needs of a store: the dedup table seen
// from outside the consumer. pgstore and sqlitestore implement it (Store.Admin).
type Admin interface {
	// Migrate creates or upgrades the table.
	Migrate(ctx context.Context) error
	// Summary counts the rows by scope and outcome.
	Summary(ctx context.Context) ([]ScopeSummary, error)
	// Find returns the rows of id: in scope, or in every scope when scope is
	// empty.
	Find(ctx context.Context, scope, id string) ([]Row, error)
	// Failed lists failed rows, oldest first.
	Failed(ctx context.Context, f RowFilter) ([]Row, error)
	// Release deletes the failed rows of keys — never a done one — so that
	// a redelivery runs the handler again, and returns the rows it deleted.
	// With dryRun it deletes nothing and returns what it would delete.
	Release(ctx context.Context, keys []Key, dryRun bool) ([]Row, error)
	// Purge deletes at most limit expired rows (see Purger).
	Purge(ctx context.Context, limit int) (int, error)
}
