package consumer

import "context"

// Handler applies one message's effects inside tx, the store's transaction.
// It never commits or rolls back: the consumer commits tx together with the
// message's dedup row after every handler of the batch returned nil.
//
// Return Permanent(err) for errors that retrying cannot fix (a payload that
// does not decode, a business rule violation); any other error is retried.
// A handler is called again for the same message after an error or a crash,
// but its effects in tx are committed at most once per key.
type Handler[TTx any] interface {
	Handle(ctx context.Context, tx TTx, msg *Message) error
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc[TTx any] func(ctx context.Context, tx TTx, msg *Message) error

func (f HandlerFunc[TTx]) Handle(ctx context.Context, tx TTx, msg *Message) error {
	return f(ctx, tx, msg)
}

// Middleware wraps a Handler.
type Middleware[TTx any] func(Handler[TTx]) Handler[TTx]

// Chain applies mws to h; the first middleware is the outermost.
func Chain[TTx any](h Handler[TTx], mws ...Middleware[TTx]) Handler[TTx] {
	for i := len(mws) - 1; i >= 0; i-- {
		h = mws[i](h)
	}
	return h
}
