// Package bgconsumer runs a consumer in the background of a test, for the
// adapters' tests: start it, read its stats and health, stop it gracefully
// or kill it.
package bgconsumer

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/consumer"
)

// runWait bounds how long Wait waits for Run to return.
const runWait = 2 * time.Minute

// Consumer is a *consumer.Consumer of any transaction type.
type Consumer interface {
	Run(ctx context.Context) error
	Stop(ctx context.Context) error
	Stats() consumer.Stats
	Health(ctx context.Context) consumer.Health
	Name() string
	SourceInfo() consumer.SourceInfo
}

// Running is a consumer running in the background.
type Running struct {
	c      Consumer
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
	err    error
	ended  atomic.Bool // Wait returned
}

// Start runs a consumer built from cfg until the test stops or kills it
// (or ends: then it is killed).
func Start[TTx any](t testing.TB, cfg consumer.Config[TTx]) *Running {
	t.Helper()
	c, err := consumer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &Running{c: c, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- c.Run(ctx) }()
	t.Cleanup(func() { r.Kill(t) })
	return r
}

// Consumer is the consumer that runs.
func (r *Running) Consumer() Consumer { return r.c }

// Stats is the consumer's Stats.
func (r *Running) Stats() consumer.Stats { return r.c.Stats() }

// Health is the consumer's Health.
func (r *Running) Health(ctx context.Context) consumer.Health { return r.c.Health(ctx) }

// Wait waits for Run to return, at most two minutes (then the test fails),
// and returns its error; later calls return the same.
func (r *Running) Wait(t testing.TB) error {
	t.Helper()
	r.once.Do(func() {
		select {
		case r.err = <-r.done:
		case <-time.After(runWait):
			t.Errorf("consumer.Run did not return within %v", runWait)
			r.err = errors.New("hung")
		}
		r.cancel()
		r.ended.Store(true)
	})
	return r.err
}

// Stop stops the consumer gracefully and fails the test unless Stop
// returned nil within a minute and Run returned nil. Once Run returned,
// it does nothing.
func (r *Running) Stop(t testing.TB) {
	t.Helper()
	r.StopWithin(t, time.Minute)
}

// StopWithin stops the consumer gracefully and fails the test unless Stop
// returned nil, which it does only when Run returned before d passed, and
// Run returned nil. Once Run returned, it does nothing.
func (r *Running) StopWithin(t testing.TB, d time.Duration) {
	t.Helper()
	if r.ended.Load() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	if err := r.c.Stop(ctx); err != nil {
		t.Errorf("Stop: %v", err)
	}
	if err := r.Wait(t); err != nil {
		t.Errorf("Run: %v", err)
	}
}

// Kill is a hard stop: the context of Run ends, in-flight transactions
// roll back and their messages are released unacknowledged. It fails the
// test unless Run returns nil. Once Run returned, it does nothing.
func (r *Running) Kill(t testing.TB) {
	t.Helper()
	if r.ended.Load() {
		return
	}
	r.cancel()
	if err := r.Wait(t); err != nil {
		t.Errorf("Run: %v", err)
	}
}
