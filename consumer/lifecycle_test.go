package consumer_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/consumer/source"
	"github.com/idemkit/idem/dedup/memstore"
)

// blockingSource delivers msgs, closes delivered, then waits for ctx.
type blockingSource struct {
	msgs            []*consumer.Message
	delivered       chan struct{}
	mu              sync.Mutex
	acked, released []*consumer.Message
}

func (s *blockingSource) Run(ctx context.Context, deliver source.DeliverFunc) error {
	for _, m := range s.msgs {
		if err := deliver(ctx, m); err != nil {
			return err
		}
	}
	close(s.delivered)
	<-ctx.Done()
	return ctx.Err()
}

func (s *blockingSource) Ack(_ context.Context, msgs []*consumer.Message) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.acked = append(s.acked, msgs...)
	return nil
}

func (s *blockingSource) Describe() source.Description { return source.Description{} }

func (s *blockingSource) Release(msgs []*consumer.Message, _ error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.released = append(s.released, msgs...)
}

// stuck is a consumer whose handler holds the first of two messages of a
// lane until unblock is called, with the second queued behind it.
type stuck struct {
	c       *consumer.Consumer[*memstore.Tx]
	src     *blockingSource
	done    chan error // Run's
	unblock func()
}

// startStuck runs such a consumer with ctx and Config.DrainTimeout drain,
// and returns once its first message is in the handler and the second
// waits in the lane.
func startStuck(ctx context.Context, t *testing.T, drain time.Duration) *stuck {
	t.Helper()
	block, started := make(chan struct{}), make(chan struct{}, 10)
	var once sync.Once
	unblock := func() { once.Do(func() { close(block) }) }
	t.Cleanup(unblock)
	src := &blockingSource{delivered: make(chan struct{}), msgs: payments(2)}
	cfg := baseConfig(func(ctx context.Context, tx *memstore.Tx, m *consumer.Message) error {
		started <- struct{}{}
		select {
		case <-block:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	cfg.BatchSize = 1
	cfg.DeadLetter = &consumertest.DeadLetters{}
	cfg.Source = src
	cfg.DrainTimeout = drain
	c, err := consumer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s := &stuck{c: c, src: src, done: make(chan error, 1), unblock: unblock}
	go func() { s.done <- c.Run(ctx) }()
	<-started
	<-src.delivered // the second message waits in the lane
	return s
}

// settled fails t unless Run returns nil, having acknowledged acked
// messages and released released.
func (s *stuck) settled(t *testing.T, stop string, acked, released int) {
	t.Helper()
	if err := <-s.done; err != nil {
		t.Fatal(err)
	}
	s.src.mu.Lock()
	defer s.src.mu.Unlock()
	if len(s.src.acked) != acked || len(s.src.released) != released {
		t.Fatalf("%s: acked %d, released %d; want %d and %d", stop, len(s.src.acked), len(s.src.released), acked, released)
	}
}

func TestStopDrainsQueuedMessages(t *testing.T) {
	s := startStuck(context.Background(), t, 0)
	stopped := make(chan error, 1)
	go func() { stopped <- s.c.Stop(context.Background()) }()
	s.unblock()
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	s.settled(t, "graceful stop", 2, 0)
}

func TestStopPastDeadlineReleases(t *testing.T) {
	s := startStuck(context.Background(), t, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := s.c.Stop(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Stop past deadline: %v", err)
	}
	s.settled(t, "hard stop", 0, 2)
}

// TestCancelDrainsWithinDrainTimeout: with DrainTimeout set, cancelling
// Run's context is a graceful stop — the batch in flight and the message
// queued behind it are finished and acknowledged — with no Stop call.
func TestCancelDrainsWithinDrainTimeout(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	s := startStuck(ctx, t, time.Minute)
	cancel()
	s.unblock() // the handler finishes after the cancel: a hard stop would have rolled it back
	s.settled(t, "drain", 2, 0)
}

// TestCancelPastDrainTimeoutReleases: a drain that does not finish in time
// is cut short: the work in flight rolls back and is released.
func TestCancelPastDrainTimeoutReleases(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	s := startStuck(ctx, t, 50*time.Millisecond)
	cancel()
	s.settled(t, "drain cut short", 0, 2)
}
