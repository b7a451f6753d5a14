package testenv

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/poll"
	"github.com/idemkit/idem/internal/retry"
)

// WaitUntil polls cond until it holds, failing the test after d with what it
// waited for; see poll.Until.
func WaitUntil(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	poll.Until(t, d, what, cond)
}

// WaitUntilProgress is WaitUntil for a condition that says how far it got;
// see poll.UntilProgress.
func WaitUntilProgress(t testing.TB, d time.Duration, what string, cond func() (ok bool, progress string)) {
	t.Helper()
	poll.UntilProgress(t, d, what, cond)
}

// Context returns a context that ends after d or when the test ends.
func Context(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

var names atomic.Int64

// Name returns a topic or group name unique to this test run: letters,
// digits and '_' (what both brokers allow), at most about 90 bytes, the end
// of the test's name in it.
func Name(t testing.TB, what string) string {
	s := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			return r
		}
		return '_'
	}, t.Name())
	if len(s) > 60 {
		s = s[len(s)-60:]
	}
	return fmt.Sprintf("idem_%s_%s_%d_%d", what, s, os.Getpid(), names.Add(1))
}

// ShortClock is a consumer.Clock that waits for real, a tenth of the asked
// delay: for fault tests whose retries must really wait (a pool
// reconnecting, a server restarting) without the policy's full delays.
type ShortClock struct{}

func (ShortClock) Now() time.Time { return time.Now() }

func (ShortClock) Sleep(ctx context.Context, d time.Duration) error { return retry.Sleep(ctx, d/10) }
