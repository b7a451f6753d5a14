// Package poll waits on conditions in tests, never on a fixed time. It
// imports nothing but the standard library, so that the test kits users
// import (deduptest, httpidemtest) can use it.
package poll

import (
	"testing"
	"time"
)

// maxWait caps the pause between two looks at a condition.
const maxWait = 20 * time.Millisecond

// Until polls cond until it holds, failing the test after d with what it
// waited for. The deadline bounds a hang; no assertion depends on how long
// the wait took.
func Until(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	UntilProgress(t, d, what, func() (bool, string) { return cond(), "" })
}

// UntilProgress is Until for a condition that says how far it got: the
// failure shows the progress it last reported.
func UntilProgress(t testing.TB, d time.Duration, what string, cond func() (ok bool, progress string)) {
	t.Helper()
	deadline := time.Now().Add(d)
	for wait := time.Millisecond; ; wait = min(2*wait, maxWait) {
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
		time.Sleep(wait)
	}
}
