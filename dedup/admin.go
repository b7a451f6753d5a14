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
	// Lock takes the store's exclusive lock called name, waiting until
	// whoever holds it — in this process or another — lets it go, or ctx
	// ends; unlock lets it go. A lock whose holder dies (its connection
	// ends) is let go. The idem command serializes the executions of a
	// redrive of one dead-letter topic and group with it.
	Lock(ctx context.Context, name string) (unlock func(), err error)
	// Auditor records and lists what operators executed.
	Auditor
}

// Action is one entry of the operators' audit log: an action the idem
// command or its console executed on the store or a dead-letter topic.
type Action struct {
	ID    int64     // the store's, growing; set by Actions
	At    time.Time // when it was recorded, by the store's clock; set by Actions
	Actor string    // who: "console:<token name>@<client>" or "cli:<OS user>"
	// Kind is what was done: release, release-request, redrive, skip, purge.
	Kind string
	// Plan is what was executed, as one JSON document: the keys released,
	// the letters sent or skipped, the batches purged.
	Plan []byte
	// Outcome is how it ended: "ok", or "partial: …", "refused: …",
	// "error: …" with the reason.
	Outcome string
}

// Auditor is the operators' audit log of a store: what the idem command
// and its console executed, by whom, when and with what outcome. The
// stores that implement Admin implement it too (Admin embeds it).
type Auditor interface {
	// RecordAction appends a to the log; ID and At are the store's.
	RecordAction(ctx context.Context, a Action) error
	// Actions lists the log, newest first: at most limit entries (0: 100).
	Actions(ctx context.Context, limit int) ([]Action, error)
}
