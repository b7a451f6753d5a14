package retry

import (
	"context"
	"errors"
	"fmt"
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

// recordingClock records the delays slept, and fails a sleep once ctx
// has ended.
type recordingClock struct {
	now    time.Time
	sleeps []time.Duration
}

func (c *recordingClock) Now() time.Time { return c.now }
func (c *recordingClock) Sleep(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	c.now = c.now.Add(d)
	c.sleeps = append(c.sleeps, d)
	return nil
}

var errDown = errors.New("down")

// failing returns an op that fails n times with errDown, then succeeds,
// and counts its calls.
func failing(n int, calls *int) func() error {
	return func() error {
		*calls++
		if *calls <= n {
			return fmt.Errorf("call %d: %w", *calls, errDown)
		}
		return nil
	}
}

// TestForeverBacksOffPastThePolicysBounds: the delays grow by Multiplier
// up to Max, MaxAttempts and MaxElapsed do not stop the retries, and each
// retry is told after its wait with its number and the failure before it.
func TestForeverBacksOffPastThePolicysBounds(t *testing.T) {
	clock := &recordingClock{}
	p := Policy{Initial: time.Second, Max: 8 * time.Second, Multiplier: 2, MaxAttempts: 2, MaxElapsed: 3 * time.Second, Clock: clock}
	calls := 0
	var told []string
	err := Forever(context.Background(), p, failing(6, &calls), nil, func(n int, err error) {
		told = append(told, fmt.Sprintf("%d after %d sleeps: %v", n, len(clock.sleeps), err))
	})
	if err != nil || calls != 7 {
		t.Fatalf("Forever = %v after %d calls, want nil after 7", err, calls)
	}
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 8 * time.Second, 8 * time.Second}
	if fmt.Sprint(clock.sleeps) != fmt.Sprint(want) {
		t.Errorf("slept %v, want %v", clock.sleeps, want)
	}
	wantTold := []string{"1 after 1 sleeps: call 1: down", "2 after 2 sleeps: call 2: down", "3 after 3 sleeps: call 3: down",
		"4 after 4 sleeps: call 4: down", "5 after 5 sleeps: call 5: down", "6 after 6 sleeps: call 6: down"}
	if fmt.Sprint(told) != fmt.Sprint(wantTold) {
		t.Errorf("retried told\n%q, want\n%q", told, wantTold)
	}
}

// TestForeverFinal: an error final claims ends the retries at once with
// final's result — an error, or nil — and no wait; the others are retried.
func TestForeverFinal(t *testing.T) {
	errFinal := errors.New("final")
	for _, tc := range []struct {
		name   string
		result error
	}{{"error", errFinal}, {"nil", nil}} {
		t.Run(tc.name, func(t *testing.T) {
			clock := &recordingClock{}
			calls := 0
			var seen []error
			final := func(err error) (error, bool) {
				seen = append(seen, err)
				return tc.result, calls == 3
			}
			err := Forever(context.Background(), Policy{Initial: time.Second, Max: time.Second, Multiplier: 1, Clock: clock},
				failing(10, &calls), final, nil)
			if err != tc.result || calls != 3 || len(clock.sleeps) != 2 {
				t.Fatalf("Forever = %v after %d calls and %d sleeps, want %v after 3 calls and 2 sleeps", err, calls, len(clock.sleeps), tc.result)
			}
			if len(seen) != 3 || !errors.Is(seen[2], errDown) {
				t.Errorf("final saw %v, want op's three errors", seen)
			}
		})
	}
}

// TestForeverStopsWithCtx: a failure once ctx has ended returns ctx's
// error without asking final or waiting; ctx ending during a wait returns
// the wait's error, and that retry is not told.
func TestForeverStopsWithCtx(t *testing.T) {
	t.Run("after a failure", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		clock := &recordingClock{}
		calls := 0
		op := func() error { calls++; cancel(); return errDown }
		final := func(error) (error, bool) { t.Error("final asked after ctx ended"); return nil, false }
		err := Forever(ctx, Policy{Initial: time.Second, Max: time.Second, Multiplier: 1, Clock: clock}, op, final, nil)
		if !errors.Is(err, context.Canceled) || calls != 1 || len(clock.sleeps) != 0 {
			t.Fatalf("Forever = %v after %d calls and %d sleeps, want context.Canceled after 1 call and none", err, calls, len(clock.sleeps))
		}
	})
	t.Run("during a wait", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		calls := 0
		var told []int
		clock := sleepCancels{cancel: cancel}
		err := Forever(ctx, Policy{Initial: time.Second, Max: time.Second, Multiplier: 1, Clock: clock},
			failing(10, &calls), nil, func(n int, _ error) { told = append(told, n) })
		if !errors.Is(err, context.Canceled) || calls != 1 || len(told) != 0 {
			t.Fatalf("Forever = %v after %d calls, told %v; want context.Canceled after 1 call, none told", err, calls, told)
		}
	})
}

// sleepCancels ends ctx while it sleeps.
type sleepCancels struct{ cancel context.CancelFunc }

func (sleepCancels) Now() time.Time { return time.Time{} }
func (s sleepCancels) Sleep(ctx context.Context, _ time.Duration) error {
	s.cancel()
	return ctx.Err()
}
