package consumer

import (
	"context"
	"errors"

	"github.com/idemkit/idem/dedup"
)

var (
	// ErrStopped: the consumer is stopping and takes no more messages.
	ErrStopped = errors.New("consumer: stopped")
	// ErrLaneStopped: the lane stopped after a message used up its retries
	// (OnExhausted is StopLane). Its messages stay unacknowledged.
	ErrLaneStopped = errors.New("consumer: lane stopped")
	// ErrNoKey: the key function found no key in the message.
	ErrNoKey = errors.New("consumer: message has no key")
	// ErrKeyMisconfigured: Config.Key failed on most of the first messages
	// of a run (Health.Misconfigured): a key path with a typo, a header
	// the producers do not set. Each message is dead-lettered as well.
	ErrKeyMisconfigured = errors.New("consumer: the key function looks misconfigured")
	// ErrBadPayload: the payload cannot be read as the key function needs.
	ErrBadPayload = errors.New("consumer: malformed payload")
	// ErrPayloadTooLarge: the payload exceeds Config.MaxPayloadBytes.
	ErrPayloadTooLarge = errors.New("consumer: payload too large")
)

type permanentError struct{ err error }

func (e *permanentError) Error() string { return "permanent: " + e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

type retryableError struct{ err error }

type rejectedError struct {
	err     error
	inDoubt bool // InDoubt: the letter's cause is CauseInDoubt
}

func (e *rejectedError) Error() string {
	if e.inDoubt {
		return "in doubt: " + e.err.Error()
	}
	return "rejected: " + e.err.Error()
}
func (e *rejectedError) Unwrap() error { return e.err }

// rejects tells the two marks of a message that fails for good apart; the
// outermost one wins.
func (e *rejectedError) rejects() bool  { return true }
func (e *permanentError) rejects() bool { return false }

func (e *retryableError) Error() string { return "retryable: " + e.err.Error() }
func (e *retryableError) Unwrap() error { return e.err }

// Permanent marks err as one that retrying cannot fix: the message is
// dead-lettered at once (CausePermanent), and its key is recorded as failed,
// so that every later message with that key is dead-lettered without the
// handler running (CauseFailedBefore). For a failure of the event itself:
// what is wrong with this message is wrong with its re-sends too.
// Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err}
}

// Reject refuses the message, not its key: the handler's transaction rolls
// back, nothing is recorded under the key, and the message is dead-lettered
// at once (CauseRejected). A later message with that key is judged on its
// own, by the handler again. For checks that need the store — the amount
// against the order, read FOR UPDATE in the handler's transaction — and
// refuse a message that does not speak for its key: a notice with a wrong
// amount arriving ahead of the genuine one must not take the genuine
// one's key, as Permanent would (the genuine one would then be
// dead-lettered as a mismatch or as failed before). A re-send of a
// rejected message is rejected again, each time a letter. Wrapped in
// Permanent (or the other way round), the outermost mark wins. A rejection
// of dedup.ErrFingerprintMismatch (package effect's, when a call under the
// key was made for another payload) has cause CauseMismatch. Reject(nil)
// is nil.
func Reject(err error) error {
	if err == nil {
		return nil
	}
	return &rejectedError{err: err}
}

// InDoubt refuses the message the way Reject does — the handler's
// transaction rolls back, nothing is recorded under the key, the message
// is dead-lettered at once — with cause CauseInDoubt: a call the handler
// made to another system (a payment provider) has an outcome that can no
// longer be found out nor repeated safely, and an operator must resolve it
// first. Package effect returns it; the key stays free so that the
// message, redriven once the operator resolved the call, runs the handler
// again. Outermost marks win as with Reject. InDoubt(nil) is nil.
func InDoubt(err error) error {
	if err == nil {
		return nil
	}
	return &rejectedError{err: err, inDoubt: true}
}

// IsInDoubt reports whether err was marked with InDoubt, and not wrapped in
// Permanent since.
func IsInDoubt(err error) bool {
	var m interface{ rejects() bool }
	if !errors.As(err, &m) || !m.rejects() {
		return false
	}
	var r *rejectedError
	return errors.As(err, &r) && r.inDoubt
}

// Retryable marks err as transient: the message is retried with backoff.
// Retryable(nil) is nil.
func Retryable(err error) error {
	if err == nil {
		return nil
	}
	return &retryableError{err}
}

// IsPermanent reports whether err was marked with Permanent; for middleware
// and handler tests.
func IsPermanent(err error) bool {
	var p *permanentError
	return errors.As(err, &p)
}

// IsRejected reports whether err was marked with Reject, and not wrapped in
// Permanent since: of the two marks, the outermost says what happens.
func IsRejected(err error) bool {
	var m interface{ rejects() bool }
	return errors.As(err, &m) && m.rejects()
}

// IsRetryable reports whether err was marked with Retryable.
func IsRetryable(err error) bool {
	var r *retryableError
	return errors.As(err, &r)
}

// classify decides between retry and dead letter. Explicit marks win (a
// Reject is permanent too; fail tells it apart), then
// idem's own sentinels, then the store's classification (SQLSTATE); anything
// unknown is retried, bounded by the retry policy.
func classify(err error, store func(error) dedup.ErrorClass) dedup.ErrorClass {
	var p *permanentError
	var r *retryableError
	switch {
	case errors.As(err, &p), IsRejected(err):
		return dedup.ClassPermanent
	case errors.As(err, &r):
		return dedup.ClassRetryable
	case errors.Is(err, dedup.ErrInFlight), errors.Is(err, dedup.ErrStoreBusy), errors.Is(err, errOffsetMoved), errors.Is(err, errOffsetsAheadSuspect):
		return dedup.ClassConflict
	case errors.Is(err, dedup.ErrContract), errors.Is(err, dedup.ErrTxEnded), errors.Is(err, dedup.ErrOffsetsAhead):
		return dedup.ClassFatal
	case errors.Is(err, dedup.ErrInvalidKey), errors.Is(err, dedup.ErrFingerprintMismatch),
		errors.Is(err, ErrNoKey), errors.Is(err, ErrBadPayload), errors.Is(err, ErrPayloadTooLarge):
		return dedup.ClassPermanent
	}
	if c := store(err); c != dedup.ClassUnknown {
		return c
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return dedup.ClassRetryable
	}
	return dedup.ClassRetryable
}
