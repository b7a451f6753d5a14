package consumer

import (
	"context"
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
