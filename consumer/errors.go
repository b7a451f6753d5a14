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
	// ErrBadPayload: the payload cannot be read as the key function needs.
	ErrBadPayload = errors.New("consumer: malformed payload")
	// ErrPayloadTooLarge: the payload exceeds Config.MaxPayloadBytes.
	ErrPayloadTooLarge = errors.New("consumer: payload too large")
)

type permanentError struct{ err error }

func (e *permanentError) Error() string { return "permanent: " + e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

type retryableError struct{ err error }

func (e *retryableError) Error() string { return "retryable: " + e.err.Error() }
func (e *retryableError) Unwrap() error { return e.err }

// Permanent marks err as one that retrying cannot fix: the message is
// dead-lettered at once. Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err}
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

// IsRetryable reports whether err was marked with Retryable.
func IsRetryable(err error) bool {
	var r *retryableError
	return errors.As(err, &r)
}

// classify decides between retry and dead letter. Explicit marks win, then
// idem's own sentinels, then the store's classification (SQLSTATE); anything
// unknown is retried, bounded by the retry policy.
func classify(err error, store func(error) dedup.ErrorClass) dedup.ErrorClass {
	var p *permanentError
	var r *retryableError
	switch {
	case errors.As(err, &p):
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
