package relaytest

import (
	"context"
	"testing"
	"time"
)

// WaitFor polls cond until it holds, failing the test after timeout with
// what cond said last. The timeout only bounds a hung test; nothing asserts
// how long it took.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after %v (%s)", what, timeout, state)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Ctx returns a context that ends after d or with the test.
func Ctx(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
