package consumer

import (
	"context"
	"errors"
	"log/slog"

	"github.com/idemkit/idem/consumer/wire"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/internal/shorten"
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
	// Entity is the entity the message is an event of, and its version
	// (Config.Entity; for a copy, the ones it carries); zero when it names
	// none.
	Entity Entity
	// Watermark is, for a stale event (CauseStale), the entity's watermark
	// it met; zero otherwise.
	Watermark dedup.Version
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

// Cause says why a message was dead-lettered (wire.Cause: a letter
// carries it in its wire.MetaCause header).
type Cause = wire.Cause

const (
	CauseBadInput      = wire.CauseBadInput      // no key, an invalid key, an unreadable or too large payload: no row recorded
	CauseMismatch      = wire.CauseMismatch      // its key was applied before with another payload, or the handler rejected it with dedup.ErrFingerprintMismatch (a call was made under the key for another payload)
	CauseFailedBefore  = wire.CauseFailedBefore  // its key was recorded as failed before: a repeat of an incident
	CausePermanent     = wire.CausePermanent     // Permanent, a constraint violation: recorded as failed
	CauseExhausted     = wire.CauseExhausted     // its retries ran out
	CauseValidate      = wire.CauseValidate      // Config.Validate refused it: no row recorded, the key stays free
	CauseRejected      = wire.CauseRejected      // the handler refused it with Reject: rolled back, no row recorded, the key stays free
	CauseInDoubt       = wire.CauseInDoubt       // InDoubt: a provider call's outcome is in doubt; rolled back, no row recorded, the key stays free. Also a stale event whose key has provider steps that did not fail (see Config.Stale), refused so before its commit
	CauseStale         = wire.CauseStale         // an event at or below its entity's watermark, with StaleDeadLetter: not applied; the store recorded it
	CauseParkedTooLong = wire.CauseParkedTooLong // its record key was parked (NonBlocking.KeyOrdered) longer than MaxParkedWait or deeper than MaxParkedDepth: not tried, no row recorded, the key stays free
)

// fail dead-letters a message that cannot be processed. With record, the
// failure is first recorded in the store so that a redelivery is dead-lettered
// without running the handler again — unless the handler refused the
// message with Reject, which leaves the key free (its cause
// CauseMismatch when it refused it with dedup.ErrFingerprintMismatch).
func (c *Consumer[TTx]) fail(ctx context.Context, it *item, reason error, record bool) error {
	if IsRejected(reason) {
		cause := CauseRejected
		switch {
		case IsInDoubt(reason):
			cause = CauseInDoubt
		case errors.Is(reason, dedup.ErrFingerprintMismatch):
			cause = CauseMismatch
		}
		return c.deadLetter(ctx, it, reason, cause)
	}
	if record && c.cfg.Key != nil { // with Config.Offsets alone there is no key row: the offset moves past it after the dead letter
		err := c.untilDone(ctx, nil, "", func() error {
			return c.cfg.Store.RecordFailure(ctx, it.claim, shorten.Reason(reason.Error()))
		}, func(err error) (error, bool) {
			if class := classify(err, c.cfg.Store.ClassifyError); class == dedup.ClassPermanent || class == dedup.ClassFatal {
				c.cfg.Logger.Error("idem: recording a failure failed", append(refAttrs(it.msg, it.claim.Key), slog.Any("error", err))...)
				return nil, true // dead-lettered all the same
			}
			return nil, false
		})
		if err != nil {
			return err
		}
	}
	cause := CauseExhausted
	if record {
		cause = CausePermanent
	}
	return c.deadLetter(ctx, it, reason, cause)
}

// deadLetter writes it to the dead-letter sink, retrying until it succeeds or
// ctx ends, unparks it (KeyOrdered) and marks it settled.
func (c *Consumer[TTx]) deadLetter(ctx context.Context, it *item, reason error, cause Cause) error {
	err := c.untilDone(ctx, nil, "dead letter", func() error {
		l := Letter{Message: it.msg, Key: it.claim.Key, Fingerprint: it.claim.Fingerprint,
			Cause: cause, Reason: reason, Attempts: it.attempts, Entity: it.entity}
		if cause == CauseStale {
			l.Watermark = it.watermark
		}
		return c.cfg.DeadLetter.DeadLetter(ctx, l)
	}, nil)
	if err != nil {
		return err
	}
	if err := c.unpark(ctx, it); err != nil {
		return err
	}
	c.stats.deadLettered.Add(1)
	c.settled(ctx, Settlement{Message: it.msg, Key: it.claim.Key, Outcome: OutcomeDeadLettered, Reason: reason, Cause: cause, Attempts: it.attempts})
	it.settled = true
	c.cfg.Logger.Warn("idem: message dead-lettered", append(refAttrs(it.msg, it.claim.Key),
		slog.String("cause", cause.String()), slog.Int("attempts", it.attempts), slog.String("reason", reason.Error()))...)
	return nil
}
