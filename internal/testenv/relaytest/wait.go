package relaytest

import (
	"context"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/testenv/poll"
)

// WaitFor polls cond until it holds, failing the test after timeout with
// what cond said last; see poll.UntilProgress.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	poll.UntilProgress(t, timeout, what, cond)
}

// Ctx returns a context that ends after d or with the test.
func Ctx(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
