package retry

import (
	"context"
	"testing"
	"time"
)

type fakeClock struct{ now time.Time }

func (c *fakeClock) Now() time.Time { return c.now }
func (c *fakeClock) Sleep(_ context.Context, d time.Duration) error {
	c.now = c.now.Add(d)
	return nil
}

func TestAttemptsBound(t *testing.T) {
	b := Policy{Initial: time.Second, Max: time.Minute, Multiplier: 2, MaxAttempts: 4, Clock: &fakeClock{}}.New()
	n := 0
	for {
		ok, err := b.Wait(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		n++
	}
	if n != 3 {
		t.Fatalf("%d retries for MaxAttempts 4, want 3", n)
	}
}

// TestElapsedCountsOnlyOwnWaits: time the caller spends elsewhere (a
// database outage it waits out on another policy) does not use up the
// budget; the sequence's own waits do.
func TestElapsedCountsOnlyOwnWaits(t *testing.T) {
	clock := &fakeClock{}
	b := Policy{Initial: 10 * time.Second, Max: 10 * time.Second, Multiplier: 1, MaxElapsed: 35 * time.Second, Clock: clock}.New()
	if ok, _ := b.Wait(context.Background()); !ok {
		t.Fatal("first retry refused")
	}
	clock.now = clock.now.Add(time.Hour) // an outage waited out elsewhere
	n := 1
	for {
		ok, _ := b.Wait(context.Background())
		if !ok {
			break
		}
		n++
	}
	if n != 3 {
		t.Fatalf("%d retries of 10s within a 35s budget, want 3", n)
	}
}
