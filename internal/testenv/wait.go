package testenv

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// WaitUntil polls cond until it holds, failing the test after d with what it
// waited for. The deadline bounds a hang; no assertion depends on how long
// the wait took.
func WaitUntil(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	WaitUntilProgress(t, d, what, func() (bool, string) { return cond(), "" })
}

// WaitUntilProgress is WaitUntil for a condition that says how far it got:
// the failure shows the progress it last reported.
func WaitUntilProgress(t testing.TB, d time.Duration, what string, cond func() (ok bool, progress string)) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		ok, progress := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			if progress != "" {
				progress = " (" + progress + ")"
			}
			t.Fatalf("gave up after %v waiting until %s%s", d, what, progress)
		}
		time.Sleep(20 * time.Millisecond)
	}
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
