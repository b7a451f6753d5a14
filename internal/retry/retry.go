// Package retry turns a retry policy into delays: exponential backoff with
// jitter from cenkalti/backoff, bounded by attempts and elapsed time, on an
// injectable clock so that tests never sleep.
package retry

import (
	"context"
	"time"

	"github.com/cenkalti/backoff/v4"
)

// Clock tells the time and waits. The consumer's tests inject a fake one.
type Clock interface {
	Now() time.Time
	Sleep(ctx context.Context, d time.Duration) error
}

// Policy bounds the retries of one unit of work.
type Policy struct {
	Initial     time.Duration
	Max         time.Duration
	Multiplier  float64
	Jitter      float64 // randomization factor in [0,1]: each delay is d ± d*Jitter
	MaxAttempts int     // attempts in all, including the first
	MaxElapsed  time.Duration
	Clock       Clock
}

// Backoff hands out the delays of one retry sequence. Not safe for concurrent use.
type Backoff struct {
	clock      Clock
	b          backoff.BackOff
	maxElapsed time.Duration
	slept      time.Duration
}

// New starts a retry sequence.
//
// MaxElapsed bounds the time this sequence itself waited, not the wall
// clock: a caller that also waits for other reasons (the database is down)
// does not use up the message's budget meanwhile.
func (p Policy) New() *Backoff {
	eb := &backoff.ExponentialBackOff{
		InitialInterval:     p.Initial,
		RandomizationFactor: p.Jitter,
		Multiplier:          p.Multiplier,
		MaxInterval:         p.Max,
		MaxElapsedTime:      0, // enforced on slept time below
		Stop:                backoff.Stop,
		Clock:               p.Clock,
	}
	eb.Reset()
	var b backoff.BackOff = eb
	if p.MaxAttempts > 0 {
		b = backoff.WithMaxRetries(eb, uint64(p.MaxAttempts-1))
	}
	return &Backoff{clock: p.Clock, b: b, maxElapsed: p.MaxElapsed}
}

// Wait sleeps for the next delay. It returns false when the policy is used
// up (no sleep happened) and ctx.Err() when ctx ends while waiting.
func (b *Backoff) Wait(ctx context.Context) (bool, error) {
	d := b.b.NextBackOff()
	if d == backoff.Stop || b.maxElapsed > 0 && b.slept+d > b.maxElapsed {
		return false, nil
	}
	b.slept += d
	if err := b.clock.Sleep(ctx, d); err != nil {
		return true, err
	}
	return true, nil
}

// Forever calls op until it returns nil, waiting p's next delay between
// calls for as long as it takes: p's MaxAttempts and MaxElapsed are
// ignored. It is for failures no caller should give up on — a database
// away, a dead-letter sink failing — which stop only with ctx or with an
// error retrying cannot mend.
//
// After a failed call, Forever returns ctx.Err() when ctx has ended, and
// what final returns when final (nil: never) says the error ends the
// retries; otherwise it waits (returning the wait's error when ctx ends
// meanwhile), tells retried (nil: no one) that retry n — 1 for the first —
// follows op's error err, and calls op again.
func Forever(ctx context.Context, p Policy, op func() error, final func(err error) (error, bool), retried func(n int, err error)) error {
	p.MaxAttempts, p.MaxElapsed = 0, 0
	b := p.New()
	for n := 1; ; n++ {
		err := op()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if final != nil {
			if ferr, ok := final(err); ok {
				return ferr
			}
		}
		if _, werr := b.Wait(ctx); werr != nil {
			return werr
		}
		if retried != nil {
			retried(n, err)
		}
	}
}

// SystemClock is the real clock.
type SystemClock struct{}

func (SystemClock) Now() time.Time { return time.Now() }

func (SystemClock) Sleep(ctx context.Context, d time.Duration) error { return Sleep(ctx, d) }
