package consumer

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/idemkit/idem/dedup"
)

// fail dead-letters a message that cannot be processed. With record, the
// failure is first recorded in the store so that a redelivery is dead-lettered
// without running the handler again.
func (c *Consumer[TTx]) fail(ctx context.Context, it *item, reason error, record bool) error {
	if record && c.cfg.Key != nil { // with Config.Offsets alone there is no key row: the offset moves past it after the dead letter
		w := c.newWait(c.infra)
		for {
			err := c.cfg.Store.RecordFailure(ctx, it.claim, dedup.ShortReason(reason.Error()))
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if class := classify(err, c.cfg.Store.ClassifyError); class == dedup.ClassPermanent || class == dedup.ClassFatal {
				c.cfg.Logger.Error("idem: recording a failure failed", append(refAttrs(it.msg, it.claim.Key), slog.Any("error", err))...)
				break
			}
			if err := w.wait(ctx, nil, err); err != nil {
				return err
			}
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
	w := c.newWait(c.infra)
	for {
		err := c.cfg.DeadLetter.DeadLetter(ctx, Letter{Message: it.msg, Key: it.claim.Key, Fingerprint: it.claim.Fingerprint,
			Cause: cause, Reason: reason, Attempts: it.attempts})
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err := w.wait(ctx, nil, fmt.Errorf("dead letter: %w", err)); err != nil {
			return err
		}
	}
	c.stats.deadLettered.Add(1)
	c.cfg.Observer.Settled(ctx, Settlement{Message: it.msg, Key: it.claim.Key, Outcome: OutcomeDeadLettered, Reason: reason, Cause: cause, Attempts: it.attempts})
	it.settled = true
	c.cfg.Logger.Warn("idem: message dead-lettered", append(refAttrs(it.msg, it.claim.Key),
		slog.String("cause", cause.String()), slog.Int("attempts", it.attempts), slog.String("reason", reason.Error()))...)
	return nil
}
