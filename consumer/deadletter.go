package consumer

import (
	"context"
	"github.com/idemkit/idem/internal/shorten"
	"log/slog"

	"github.com/idemkit/idem/dedup"
)

// fail dead-letters a message that cannot be processed. With record, the
// failure is first recorded in the store so that a redelivery is dead-lettered
// without running the handler again — unless the handler refused the
// message with Reject, which leaves the key free.
func (c *Consumer[TTx]) fail(ctx context.Context, it *item, reason error, record bool) error {
	if IsRejected(reason) {
		return c.deadLetter(ctx, it, reason, CauseRejected)
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
// ctx ends, and marks it settled.
func (c *Consumer[TTx]) deadLetter(ctx context.Context, it *item, reason error, cause Cause) error {
	err := c.untilDone(ctx, nil, "dead letter", func() error {
		return c.cfg.DeadLetter.DeadLetter(ctx, Letter{Message: it.msg, Key: it.claim.Key, Fingerprint: it.claim.Fingerprint,
			Cause: cause, Reason: reason, Attempts: it.attempts})
	}, nil)
	if err != nil {
		return err
	}
	c.stats.deadLettered.Add(1)
	c.settled(ctx, Settlement{Message: it.msg, Key: it.claim.Key, Outcome: OutcomeDeadLettered, Reason: reason, Cause: cause, Attempts: it.attempts})
	it.settled = true
	if c.holds != nil {
		c.holds.settled(it.msg, c.cfg.Clock.Now())
	}
	c.cfg.Logger.Warn("idem: message dead-lettered", append(refAttrs(it.msg, it.claim.Key),
		slog.String("cause", cause.String()), slog.Int("attempts", it.attempts), slog.String("reason", reason.Error()))...)
	return nil
}
