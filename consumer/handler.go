package consumer

import (
	"context"
	"fmt"
)

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

// BatchHandler applies the effects of many messages at once — one multi-row
// INSERT, COPY, or a pgx.Batch — for throughput near the database's limit.
// It gets the messages of a batch whose keys are new, in lane order, and the
// same contract as Handler: it never commits, and its writes in tx commit
// with the messages' dedup rows.
//
// To say which message failed, return a *MessageError; then the messages
// before it commit without it and it is retried or dead-lettered alone. Any
// other error fails the whole call, and the consumer isolates the culprit by
// splitting the batch in halves.
type BatchHandler[TTx any] interface {
	HandleBatch(ctx context.Context, tx TTx, msgs []*Message) error
}

// BatchHandlerFunc adapts a function to BatchHandler.
type BatchHandlerFunc[TTx any] func(ctx context.Context, tx TTx, msgs []*Message) error

func (f BatchHandlerFunc[TTx]) HandleBatch(ctx context.Context, tx TTx, msgs []*Message) error {
	return f(ctx, tx, msgs)
}

// MessageError names the message of a BatchHandler call that failed: Index
// into the msgs slice it was given.
type MessageError struct {
	Index int
	Err   error
}

func (e *MessageError) Error() string {
	return fmt.Sprintf("message %d of the batch: %v", e.Index, e.Err)
}
func (e *MessageError) Unwrap() error { return e.Err }
