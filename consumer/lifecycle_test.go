package consumer_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/dedup/memstore"
)

// blockingSource delivers msgs, closes delivered, then waits for ctx.
type blockingSource struct {
	msgs            []*consumer.Message
	delivered       chan struct{}
	mu              sync.Mutex
	acked, released []*consumer.Message
}

func (s *blockingSource) Run(ctx context.Context, deliver consumer.DeliverFunc) error {
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

func (s *blockingSource) Release(msgs []*consumer.Message, _ error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.released = append(s.released, msgs...)
}

func stuckConfig(src consumer.Source, block <-chan struct{}, started chan<- struct{}) consumer.Config[*memstore.Tx] {
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
	return cfg
}

func twoMessages() []*consumer.Message {
	return []*consumer.Message{
		consumertest.Message("pay", 0, 0, "", payment(0)),
		consumertest.Message("pay", 0, 1, "", payment(1)),
	}
}

func TestStopDrainsQueuedMessages(t *testing.T) {
	block, started := make(chan struct{}), make(chan struct{}, 10)
	src := &blockingSource{msgs: twoMessages(), delivered: make(chan struct{})}
	c, err := consumer.New(stuckConfig(src, block, started))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- c.Run(context.Background()) }()
	<-started
	<-src.delivered // the second message waits in the lane
	stopped := make(chan error, 1)
	go func() { stopped <- c.Stop(context.Background()) }()
	close(block)
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if len(src.acked) != 2 || len(src.released) != 0 {
		t.Fatalf("graceful stop: acked %d, released %d; want 2 and 0", len(src.acked), len(src.released))
	}
}

func TestStopPastDeadlineReleases(t *testing.T) {
	block, started := make(chan struct{}), make(chan struct{}, 10)
	defer close(block)
	src := &blockingSource{msgs: twoMessages(), delivered: make(chan struct{})}
	c, err := consumer.New(stuckConfig(src, block, started))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- c.Run(context.Background()) }()
	<-started
	<-src.delivered // the second message waits in the lane
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := c.Stop(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Stop past deadline: %v", err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if len(src.acked) != 0 || len(src.released) != 2 {
		t.Fatalf("hard stop: acked %d, released %d; want 0 and 2", len(src.acked), len(src.released))
	}
}

// TestCancelDrainsWithinDrainTimeout: with DrainTimeout set, cancelling
// Run's context is a graceful stop — the batch in flight and the message
// queued behind it are finished and acknowledged — with no Stop call.
func TestCancelDrainsWithinDrainTimeout(t *testing.T) {
	block, started := make(chan struct{}), make(chan struct{}, 10)
	src := &blockingSource{msgs: twoMessages(), delivered: make(chan struct{})}
	cfg := stuckConfig(src, block, started)
	cfg.DrainTimeout = time.Minute
	c, err := consumer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	<-started
	<-src.delivered // the second message waits in the lane
	cancel()
	close(block) // the handler finishes after the cancel: a hard stop would have rolled it back
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if len(src.acked) != 2 || len(src.released) != 0 {
		t.Fatalf("drain: acked %d, released %d; want 2 and 0", len(src.acked), len(src.released))
	}
}

// TestCancelPastDrainTimeoutReleases: a drain that does not finish in time
// is cut short: the work in flight rolls back and is released.
func TestCancelPastDrainTimeoutReleases(t *testing.T) {
	block, started := make(chan struct{}), make(chan struct{}, 10)
	defer close(block)
	src := &blockingSource{msgs: twoMessages(), delivered: make(chan struct{})}
	cfg := stuckConfig(src, block, started)
	cfg.DrainTimeout = 50 * time.Millisecond
	c, err := consumer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	<-started
	<-src.delivered
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if len(src.acked) != 0 || len(src.released) != 2 {
		t.Fatalf("drain cut short: acked %d, released %d; want 0 and 2", len(src.acked), len(src.released))
	}
}
