package consumer

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"sync/atomic"
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

// MissingKeyPolicy says what happens to a message whose key function finds
// no key (ErrNoKey).
type MissingKeyPolicy uint8

const (
	// DeadLetterMissingKey (the default) dead-letters the message: idem never
	// falls back to another key silently.
	DeadLetterMissingKey MissingKeyPolicy = iota
	// FallBackToMessageID keys the message by its broker message ID instead,
	// counted in Stats.KeyFallbacks and logged. For migrations, while old
	// producers do not set the business key yet: such messages are protected
	// against redelivery only, not against re-sends.
	FallBackToMessageID
)

// ageBounds are the upper bounds of AgeHistogram's buckets.
var ageBounds = [...]time.Duration{
	time.Second, 10 * time.Second, time.Minute, 10 * time.Minute, time.Hour,
	6 * time.Hour, 24 * time.Hour, 7 * 24 * time.Hour, 30 * 24 * time.Hour, 90 * 24 * time.Hour,
}

// AgeHistogram counts duplicates by age: Counts[i] those no older than
// Bounds[i] (and older than the bound before), the last one those older
// than every bound (1s, 10s, 1m, 10m, 1h, 6h, 1d, 7d, 30d, 90d).
type AgeHistogram struct {
	Bounds [len(ageBounds)]time.Duration
	Counts [len(ageBounds) + 1]int64
	Max    time.Duration // the oldest duplicate seen
}

// Quantile returns the bucket bound under which at least q (0..1) of the
// duplicates arrived — the retention that would have caught them — or Max
// for the last bucket; 0 when there were none. Compare Quantile(0.999) with
// the store's retention.
func (h AgeHistogram) Quantile(q float64) time.Duration {
	var n int64
	for _, c := range h.Counts {
		n += c
	}
	if n == 0 {
		return 0
	}
	want := int64(math.Ceil(q * float64(n))) // at least q of them
	if want < 1 {
		want = 1
	}
	var seen int64
	for i, c := range h.Counts {
		seen += c
		if seen >= want {
			if i < len(h.Bounds) {
				return h.Bounds[i]
			}
			break
		}
	}
	return h.Max
}

type ageCounters struct {
	counts [len(ageBounds) + 1]atomic.Int64
	max    atomic.Int64
}

func (a *ageCounters) add(age time.Duration) {
	i := 0
	for i < len(ageBounds) && age > ageBounds[i] {
		i++
	}
	a.counts[i].Add(1)
	for {
		m := a.max.Load()
		if int64(age) <= m || a.max.CompareAndSwap(m, int64(age)) {
			return
		}
	}
}

func (a *ageCounters) snapshot() AgeHistogram {
	h := AgeHistogram{Bounds: ageBounds}
	for i := range a.counts {
		h.Counts[i] = a.counts[i].Load()
	}
	h.Max = time.Duration(a.max.Load())
	return h
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
	c.cfg.Observer.Settled(ctx, Settlement{Message: it.msg, Key: it.claim.Key, Outcome: OutcomeDuplicate, FirstAt: it.firstAt, Age: age})
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
