package dedup

import (
	"context"
	"time"
)

// Claim asks a store to record a key inside a transaction.
type Claim struct {
	Key         Key
	Fingerprint Fingerprint
	// Source is where the message came from (topic/partition/offset, queue),
	// kept for audit. Optional.
	Source string
}

// Status is the outcome of one claim.
type Status uint8

const (
	// StatusNew: the key was not known; this transaction now holds it. Apply
	// the effect in the same transaction.
	StatusNew Status = iota + 1
	// StatusDuplicate: a committed row with the same fingerprint exists (or an
	// earlier claim in the same batch holds the key). Skip.
	StatusDuplicate
	// StatusMismatch: a committed row exists with a different fingerprint.
	// Apply nothing; dead-letter with ErrFingerprintMismatch.
	StatusMismatch
	// StatusFailed: the key was recorded as failed earlier (see
	// Store.RecordFailure) and was dead-lettered then. Apply nothing.
	StatusFailed
)

// Valid reports whether s is one of the statuses above. A claim result left
// at the zero value is not: the consumer refuses it rather than acknowledge a
// message no handler ran for.
func (s Status) Valid() bool { return s >= StatusNew && s <= StatusFailed }

func (s Status) String() string {
	switch s {
	case StatusNew:
		return "new"
	case StatusDuplicate:
		return "duplicate"
	case StatusMismatch:
		return "mismatch"
	case StatusFailed:
		return "failed"
	default:
		return "invalid"
	}
}

// Result is the outcome of one claim. Reason carries the recorded failure
// reason for StatusFailed.
type Result struct {
	Status Status
	Reason string
	// FirstAt is when the key was first claimed, by the store's clock, for
	// every status but StatusNew: how old a duplicate is when it arrives,
	// which is what a retention period must cover.
	FirstAt time.Time
}

// Store records claimed keys in the same database transaction as the
// handler's effects. TTx is the store's transaction type (pgx.Tx for pgstore).
//
// Implementations are safe for concurrent use by many lanes.
type Store[TTx any] interface {
	// InTx runs fn in one transaction. It commits when fn returns nil and
	// rolls back otherwise, returning fn's error. A commit failure is
	// returned; when the connection is lost during COMMIT the outcome is
	// unknown, and the caller must not acknowledge the messages: the
	// redelivery's claim finds the row or not, and decides.
	InTx(ctx context.Context, fn func(ctx context.Context, tx TTx) error) error

	// Claim records claims in tx, set-based, and writes one result per claim
	// into results (len(results) must be at least len(claims)); every one of
	// the first len(claims) results is set to a valid Status, whatever it
	// held before (the consumer refuses a result left unset, with
	// ErrContract, and stops). When the same
	// key appears twice in claims, the first occurrence decides and the later
	// ones are duplicates (or mismatches). A claim that meets a concurrent
	// uncommitted claim waits at most the store's lock timeout, then fails
	// with an error wrapping ErrInFlight. Keys are taken in one canonical
	// order (scope, id), so concurrent claims never deadlock among
	// themselves. After an error tx is unusable.
	Claim(ctx context.Context, tx TTx, claims []Claim, results []Result) error

	// RecordFailure records, in its own transaction, that the claim failed
	// for good and was dead-lettered, with a short reason. Later claims of
	// the key get StatusFailed. A key already recorded is left as it is.
	RecordFailure(ctx context.Context, c Claim, reason string) error

	// Check reports whether the store can serve claims: the database
	// answers and the store's table is migrated. The consumer calls it when
	// Run starts. A store that was never migrated returns an error wrapping
	// ErrNotMigrated that says what to call; a database that does not answer
	// returns an error ClassifyError reports as ClassUnavailable, which the
	// consumer waits out.
	Check(ctx context.Context) error

	// ClassifyError classifies the store's own errors (SQLSTATE and the like).
	ClassifyError(err error) ErrorClass

	// Retention says how long the store keeps a claimed key before a purge
	// may forget it: def for a scope perScope does not name; zero or less
	// is for ever. It returns the store's configuration and is safe to
	// call at any time; the caller may keep or change perScope. A store
	// that never forgets a key returns 0 and nil.
	//
	// The consumer relies on it twice: consumer.New refuses NonBlocking
	// retries whose horizon (consumer.RetryHorizon) a scope of its keys
	// does not outlive, and a retry copy that comes back later after its
	// first failure than its scope's retention is dead-lettered
	// (consumer.ErrRetryExpired) rather than claimed against a key that
	// may be gone.
	Retention() (def time.Duration, perScope map[string]time.Duration)
}

// Purger is a Store with retention: expired rows can be deleted in bounded
// batches. The consumer does not call it; operators and scheduled jobs do.
type Purger interface {
	// Purge deletes at most limit expired rows and returns how many it
	// deleted. Callers loop until it returns fewer than limit.
	Purge(ctx context.Context, limit int) (int, error)
}

// MaxReasonLen bounds a recorded failure reason, in bytes; longer reasons
// are cut (on a rune boundary).
const MaxReasonLen = 500
