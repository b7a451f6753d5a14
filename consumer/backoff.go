package consumer

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/idemkit/idem/internal/retry"
)

// retryWait is one retry sequence with its logging.
type retryWait struct {
	c interface {
		logRetry(ctx context.Context, lane string, n int, err error)
	}
	b *retry.Backoff
	n int
}

func (c *Consumer[TTx]) newWait(p retry.Policy) *retryWait {
	return &retryWait{c: c, b: p.New()}
}

func (c *Consumer[TTx]) logRetry(ctx context.Context, lane string, n int, err error) {
	c.stats.retries.Add(1)
	c.cfg.Observer.Retry(ctx, RetryEvent{Lane: lane, N: n, Err: err, Class: classify(err, c.cfg.Store.ClassifyError)})
	lvl := slog.LevelDebug
	if n >= 3 {
		lvl = slog.LevelWarn
	}
	c.cfg.Logger.Log(context.Background(), lvl, "idem: retrying", slog.String("lane", lane), slog.Int("retry", n), slog.Any("error", err))
}

// untilDone calls op until it succeeds, waiting out its failures on the
// unbounded policy for as long as it takes (retry.Forever: it stops when
// ctx ends, or when final says op's error ends the retries). Each retry is
// counted, observed and logged as l's (nil: no lane's, the store's or the
// dead-letter sink's), with op's error prefixed by what (empty: none).
func (c *Consumer[TTx]) untilDone(ctx context.Context, l *lane[TTx], what string, op func() error, final func(err error) (error, bool)) error {
	name := ""
	if l != nil {
		name = l.name
	}
	return retry.Forever(ctx, c.infra, op, final, func(n int, err error) {
		if what != "" {
			err = fmt.Errorf("%s: %w", what, err)
		}
		c.logRetry(ctx, name, n, err)
	})
}

// next waits for the next retry. It returns false when the policy is used up.
func (w *retryWait) next(ctx context.Context, l interface{ laneName() string }, err error) (bool, error) {
	ok, werr := w.b.Wait(ctx)
	if !ok || werr != nil {
		return ok, werr
	}
	w.n++
	name := ""
	if l != nil {
		name = l.laneName()
	}
	w.c.logRetry(ctx, name, w.n, err)
	return true, nil
}

// wait waits for the next retry of an unbounded policy.
func (w *retryWait) wait(ctx context.Context, l interface{ laneName() string }, err error) error {
	_, werr := w.next(ctx, l, err)
	return werr
}
