package consumer

import (
	"context"

	"github.com/idemkit/idem/dedup"
)

// Letter is a message the consumer could not process, with why. An
// adapter writes it as wire.Letter(l).Record(max): its fields are
// wire.Letter's.
type Letter struct {
	Message *Message
	// Key is the dedup key, zero when no key could be derived. A message
	// Validate refused carries the key it would have been claimed under
	// (the key is not claimed: see Config.Validate).
	Key dedup.Key
	// Fingerprint is the message's fingerprint under Key; zero when it was
	// not computed (no key, a fingerprint that failed).
	Fingerprint dedup.Fingerprint
	// Cause says, as one of a few values, why the message was
	// dead-lettered; Reason says it in words.
	Cause Cause
	// Reason says what went wrong; errors.Is works on it
	// (dedup.ErrFingerprintMismatch, dedup.ErrInvalidKey, ErrNoKey, ...).
	Reason error
	// Attempts is how many times the handler ran and failed (0 when it never
	// ran).
	Attempts int
	// Headers go on the letter in place of the message's headers of the
	// same names (matched case-insensitively; one with a nil Value only
	// removes them): a DeadLetterObserver's trace context, so that the
	// letter names the trace of the batch that failed it, not the
	// producer's. wire.Letter.Record applies them; Message stays the message the
	// Source delivered.
	Headers []Header
}

// DeadLetter stores messages that cannot be processed. The consumer
// acknowledges a dead-lettered message only after DeadLetter returned nil, and
// retries a failing DeadLetter with backoff until it succeeds or the consumer
// stops: a message is never lost over a failing dead-letter sink. It may be
// called more than once for one message (at-least-once).
type DeadLetter interface {
	DeadLetter(ctx context.Context, l Letter) error
}

// DeadLetterFunc adapts a function to DeadLetter.
type DeadLetterFunc func(ctx context.Context, l Letter) error

func (f DeadLetterFunc) DeadLetter(ctx context.Context, l Letter) error { return f(ctx, l) }
