package consumer

import (
	"context"
	"time"
)

// Timeout bounds each handler call by d. A handler that overruns sees its
// context cancelled; the resulting error is retryable.
func Timeout[TTx any](d time.Duration) Middleware[TTx] {
	return func(next Handler[TTx]) Handler[TTx] {
		return HandlerFunc[TTx](func(ctx context.Context, tx TTx, msg *Message) error {
			ctx, cancel := context.WithTimeout(ctx, d)
			defer cancel()
			return next.Handle(ctx, tx, msg)
		})
	}
}
