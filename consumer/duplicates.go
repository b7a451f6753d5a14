package consumer

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/idemkit/idem/dedup"
)

// Duplicate is a message skipped because its key was claimed before.
type Duplicate struct {
	Message *Message
	Key     dedup.Key
	// FirstAt is when the key was first claimed, by the store's clock.
	FirstAt time.Time
	// Age is how long after FirstAt the duplicate arrived, by the
	// consumer's Config.Clock (skew between the two shows up here; never
	// negative).
	// A retention shorter than the ages seen lets late duplicates through.
	Age time.Duration
}

// duplicate counts a skipped message and tells Config.OnDuplicate. Its age
// is by Config.Clock, as every other time the consumer takes.
func (c *Consumer[TTx]) duplicate(ctx context.Context, it *item) {
	c.stats.duplicates.Add(1)
	age := max(c.cfg.Clock.Now().Sub(it.firstAt), 0)
	if it.firstAt.IsZero() {
		age = 0
	} else {
		c.stats.dupAges.add(age)
	}
	c.settled(ctx, Settlement{Message: it.msg, Key: it.claim.Key, Outcome: OutcomeDuplicate, FirstAt: it.firstAt, Age: age})
	if c.cfg.OnDuplicate != nil {
		c.onDuplicate(ctx, Duplicate{Message: it.msg, Key: it.claim.Key, FirstAt: it.firstAt, Age: age})
	}
}

// onDuplicate calls Config.OnDuplicate. A panic in it is recovered and
// logged with its stack: the duplicate is settled (its transaction
// committed), and a hook for metrics or replies must not bring the lane
// down with it, nor keep the message from being acknowledged.
func (c *Consumer[TTx]) onDuplicate(ctx context.Context, d Duplicate) {
	if err := protect(func() error { c.cfg.OnDuplicate(ctx, d); return nil }); err != nil {
		var p *PanicError
		if errors.As(err, &p) {
			c.cfg.Logger.Error("idem: OnDuplicate panicked", slog.String("message", d.Message.Coordinates()),
				slog.String("key", d.Key.String()), slog.Any("panic", p.Value), slog.String("stack", string(p.Stack)))
		}
	}
}
