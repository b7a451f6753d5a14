package consumer

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/idemkit/idem/dedup"
)

// committed settles the items of a committed transaction: the new ones are
// applied, the duplicates skipped, and the ones the claim refused — another
// payload under the key, a key that failed before — dead-lettered.
func (c *Consumer[TTx]) committed(ctx context.Context, its []*item) error {
	for _, it := range its {
		switch it.status {
		case dedup.StatusNew:
			c.stats.applied.Add(1)
			c.cfg.Observer.Settled(ctx, Settlement{Message: it.msg, Key: it.claim.Key, Outcome: OutcomeApplied})
		case dedup.StatusDuplicate:
			c.duplicate(ctx, it)
		case dedup.StatusMismatch:
			err := fmt.Errorf("%w: key %q was processed before with another payload", dedup.ErrFingerprintMismatch, it.claim.Key.ID)
			if err := c.deadLetter(ctx, it, err, CauseMismatch); err != nil {
				return err
			}
			continue
		case dedup.StatusFailed:
			err := fmt.Errorf("%w: key %q: %s", dedup.ErrFailedBefore, it.claim.Key.ID, it.reason)
			if err := c.deadLetter(ctx, it, err, CauseFailedBefore); err != nil {
				return err
			}
			continue
		}
		it.settled = true
	}
	return nil
}

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

// halt stops a lane whose message used up its retries (StopLaneOnExhausted).
func (c *Consumer[TTx]) halt(l *lane[TTx], it *item, err error) {
	l.halt()
	attrs := append([]any{slog.String("lane", l.name)}, refAttrs(it.msg, it.claim.Key)...)
	c.cfg.Logger.Error("idem: lane stopped: a message used up its retries", append(attrs, slog.Any("error", err))...)
}

// fatal stops the consumer over a broken deployment: the lane stops where it
// is (its messages are released, none acknowledged), the source stops
// fetching, the other lanes finish what they hold, and Run returns err.
func (c *Consumer[TTx]) fatal(l *lane[TTx], err error) error {
	l.halt()
	c.runMu.Lock()
	first := c.fatalErr == nil
	if first {
		c.fatalErr = err
		c.stopped = true
		if c.stopSrc != nil {
			c.stopSrc()
		}
	}
	c.runMu.Unlock()
	if first {
		c.cfg.Logger.Error("idem: consumer stopping: the deployment is broken, not the message",
			slog.String("lane", l.name), slog.Any("error", err))
	}
	return ErrLaneStopped
}

// refAttrs name a message in a log line as everywhere else: message is its
// Ref, scope and key its dedup key as `idem show --scope SCOPE KEY` takes
// it — left out when no key was derived.
func refAttrs(m *Message, k dedup.Key) []any {
	if k == (dedup.Key{}) {
		return []any{slog.String("message", m.Ref())}
	}
	return []any{slog.String("message", m.Ref()), slog.String("scope", k.Scope), slog.String("key", k.ID)}
}
