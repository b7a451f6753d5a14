package dedup

import "errors"

var (
	// ErrInvalidKey: the key is empty, too long, not UTF-8 or has control
	// characters. The message cannot be deduplicated; it is dead-lettered.
	ErrInvalidKey = errors.New("dedup: invalid key")

	// ErrFingerprintMismatch: the key was seen before with a different payload
	// (the HTTP 422 analog). No effect is applied; the message is dead-lettered.
	ErrFingerprintMismatch = errors.New("dedup: same key, different payload")

	// ErrInFlight: another transaction holds an uncommitted claim of the key and
	// did not finish within the store's lock timeout. Retry later.
	ErrInFlight = errors.New("dedup: key is being processed by another transaction")

	// ErrStoreBusy: the database was busy — a lock wider than a key (SQLite's
	// one write lock) stayed held by another transaction past the store's
	// lock timeout — so the store cannot tell whether anyone holds this key.
	// Not the message's fault nor a duplicate: retry later. HTTP answers it
	// 503 with Retry-After; ErrInFlight alone is 409.
	ErrStoreBusy = errors.New("dedup: store busy: its write lock was held past the lock timeout")

	// ErrFailedBefore: the key was recorded as failed by an earlier
	// delivery (Store.RecordFailure), which was dead-lettered then; this one
	// is dead-lettered too, without running the handler. The error carries
	// the recorded reason. Release the key (delete its row) to run it again.
	ErrFailedBefore = errors.New("dedup: key failed before")

	// ErrTxEnded: the handler committed or rolled back the store's
	// transaction itself. The consumer owns the transaction — its effects
	// must commit together with the dedup row — so this is a programming
	// error: the consumer stops.
	ErrTxEnded = errors.New("dedup: the handler ended the transaction itself")

	// ErrNotMigrated: the store's table does not exist or its migrations
	// are behind: call the store's Migrate (or apply its migrations) first.
	ErrNotMigrated = errors.New("dedup: store not migrated")

	// ErrContract: a store broke the Store contract (a claim result left
	// unset, say). Nothing of the transaction is committed and nothing is
	// acknowledged: the consumer stops with this error.
	ErrContract = errors.New("dedup: store broke its contract")
)

// ErrorClass tells the consumer what to do with an error.
type ErrorClass uint8

const (
	// ClassUnknown: the classifier has no opinion; the consumer retries with
	// backoff, bounded by its retry policy.
	ClassUnknown ErrorClass = iota
	// ClassRetryable: transient, possibly the message's doing (a downstream
	// timeout, Retryable(err)). Roll back and retry with backoff, bounded by
	// the consumer's retry policy.
	ClassRetryable
	// ClassPermanent: retrying cannot help (constraint violation, bad data).
	// Roll back, record the failure and dead-letter the message.
	ClassPermanent
	// ClassUnavailable: the database is unreachable or shutting down (lost
	// connection, admin shutdown, too many connections). Not the message's
	// fault: the consumer waits it out and never dead-letters over it.
	ClassUnavailable
	// ClassConflict: the transaction collided with a concurrent one
	// (deadlock, serialization failure, lock timeout, a key in flight
	// elsewhere). Not the message's fault either: the batch is retried whole
	// with jittered backoff, which breaks the cycle, without using up the
	// message's retry budget.
	ClassConflict
	// ClassFatal: the deployment is broken, not the message nor the
	// database's availability — a table that was never migrated, a missing
	// privilege, a store that breaks its contract. Retrying cannot help and
	// dead-lettering would throw away healthy messages: the consumer stops,
	// acknowledges nothing more, and Run returns the error.
	ClassFatal
)

// NotTheMessage reports whether c is a failure of the database or of
// concurrency rather than of the message: such failures are retried for as
// long as they last and never dead-letter a message.
func (c ErrorClass) NotTheMessage() bool { return c == ClassUnavailable || c == ClassConflict }

func (c ErrorClass) String() string {
	switch c {
	case ClassRetryable:
		return "retryable"
	case ClassPermanent:
		return "permanent"
	case ClassUnavailable:
		return "unavailable"
	case ClassConflict:
		return "conflict"
	case ClassFatal:
		return "fatal"
	default:
		return "unknown"
	}
}

// ConnLostError is a store operation that failed because its connection to
// the database was lost or could not be had (pgstore's and mysqlstore's
// InTx, Check and the like). When it happened during COMMIT the outcome is
// unknown: the redelivery's claim finds out. The stores' ClassifyError
// reports it as ClassUnavailable, which the consumer waits out. Match it
// with errors.As and a *ConnLostError; an EOF or network error a handler got
// from somewhere else is never one.
type ConnLostError struct {
	// Store names the store that lost its connection ("pgstore").
	Store string
	// Err is what the driver reported.
	Err error
}

func (e *ConnLostError) Error() string { return e.Store + ": connection lost: " + e.Err.Error() }
func (e *ConnLostError) Unwrap() error { return e.Err }
