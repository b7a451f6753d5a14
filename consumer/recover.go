package consumer

import (
	"context"
	"fmt"
	"runtime/debug"
)

// PanicError is the error a recovered handler panic becomes. It is
// retryable (unless Config.PanicsArePermanent): the transaction is rolled
// back, the attempt counts, and the stack is logged at ERROR.
type PanicError struct {
	Value any
	Stack []byte
}

func (e *PanicError) Error() string { return fmt.Sprintf("handler panicked: %v", e.Value) }

// Recover turns a handler panic into a *PanicError. The consumer always
// applies it outermost; it is exported for handler tests and other routers.
func Recover[TTx any]() Middleware[TTx] {
	return func(next Handler[TTx]) Handler[TTx] {
		return HandlerFunc[TTx](func(ctx context.Context, tx TTx, msg *Message) error {
			return protect(func() error { return next.Handle(ctx, tx, msg) })
		})
	}
}

// protect runs fn and turns a panic into a *PanicError.
func protect(fn func() error) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &PanicError{Value: v, Stack: debug.Stack()}
		}
	}()
	return fn()
}
