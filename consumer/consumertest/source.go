// Package consumertest has a scripted, in-memory Source that redelivers,
// duplicates, reorders and "crashes" between commit and ack, a recording
// dead-letter sink, a clock that never sleeps, and Run, which drives a
// consumer over a set of messages until everything is settled. Use it to test
// your own handlers: deliver every message several times, then count rows.
package consumertest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/source"
)

// Script says how the fake source misbehaves. The zero value delivers every
// message once, in order.
type Script struct {
	// Seed makes the run reproducible; default 1.
	Seed uint64
	// MinDeliveries and MaxDeliveries: each pushed message is delivered a
	// number of times drawn uniformly from [MinDeliveries, MaxDeliveries];
	// default 1 and 1.
	MinDeliveries, MaxDeliveries int
	// ReorderWindow: each delivery is drawn at random from the next
	// ReorderWindow queued ones; default 1 (in order).
	ReorderWindow int
	// CrashAfterCommitEvery: once n more messages have been acknowledged
	// since the last crash, the Ack that brings the count to n is lost, as
	// if the process died after the database commit and before the broker
	// ack: every message of that Ack (the whole batch) is delivered again.
	// Messages are counted, not Ack calls, so a consumer that commits
	// batches crashes about as often as one that commits messages one by
	// one; a message delivered again because its Ack was lost does not
	// count again, so every run settles. 0: never.
	CrashAfterCommitEvery int
	// ProducerChosenIDs makes the source say that its message IDs are
	// chosen by the producer, as RocketMQ's are
	// (source.Description.ProducerChosenIDs); default false: IDs are positions, as
	// Kafka's are.
	ProducerChosenIDs bool
}

// Source is a source.Source driven by a Script. Safe for concurrent use.
type Source struct {
	script Script

	mu       sync.Mutex
	rng      *rand.Rand
	queue    []*consumer.Message
	inflight int
	acked    map[string]int // message ID -> acks
	acks     int            // Ack calls
	crashes  int
	counted  int                        // messages acked since the last crash
	lost     map[*consumer.Message]bool // delivered again by a crash: not counted again
	released int
	delivers int
	stalled  []*consumer.Message // refused by a stopped lane
	wake     chan struct{}
	idle     chan struct{} // closed while nothing is queued or in flight
}

// NewSource returns a Source that follows script.
func NewSource(script Script) *Source {
	if script.Seed == 0 {
		script.Seed = 1
	}
	if script.MinDeliveries <= 0 {
		script.MinDeliveries = 1
	}
	if script.MaxDeliveries < script.MinDeliveries {
		script.MaxDeliveries = script.MinDeliveries
	}
	if script.ReorderWindow <= 0 {
		script.ReorderWindow = 1
	}
	idle := make(chan struct{})
	close(idle)
	return &Source{
		script: script,
		rng:    rand.New(rand.NewPCG(script.Seed, script.Seed^0x9e3779b97f4a7c15)),
		acked:  make(map[string]int),
		lost:   make(map[*consumer.Message]bool),
		wake:   make(chan struct{}, 1),
		idle:   idle,
	}
}

// Message builds a message as a Kafka source would: ID topic/partition/offset,
// lane per partition.
func Message(topic string, partition int32, offset int64, key, value string) *consumer.Message {
	m := &consumer.Message{Topic: topic, Partition: partition, Offset: offset, Value: []byte(value), Attempt: 1}
	if key != "" {
		m.Key = []byte(key)
	}
	m.ID = m.Coordinates()
	m.Lane = topic + "/" + strconv.Itoa(int(partition))
	return m
}

// Push queues msgs, each as many times as the script says.
func (s *Source) Push(msgs ...*consumer.Message) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, m := range msgs {
		if m.Lane == "" {
			m.Lane = m.Topic + "/" + strconv.Itoa(int(m.Partition))
		}
		if m.Attempt == 0 {
			m.Attempt = 1
		}
		n := s.script.MinDeliveries + s.rng.IntN(s.script.MaxDeliveries-s.script.MinDeliveries+1)
		for i := range n {
			s.enqueue(copyWithAttempt(m, m.Attempt+i))
		}
	}
}

func copyWithAttempt(m *consumer.Message, attempt int) *consumer.Message {
	c := *m
	c.Attempt = attempt
	return &c
}

func (s *Source) enqueue(m *consumer.Message) { s.enqueueAt(m, len(s.queue)) }

// redeliver queues m again ahead of the later offsets of its lane, as a
// broker resumes a partition from the first message not acknowledged: a
// message given back (released, or not taken) comes before what followed
// it.
func (s *Source) redeliver(m *consumer.Message) {
	i := slices.IndexFunc(s.queue, func(q *consumer.Message) bool { return q.Lane == m.Lane && q.Offset > m.Offset })
	if i < 0 {
		i = len(s.queue)
	}
	s.enqueueAt(m, i)
}

func (s *Source) enqueueAt(m *consumer.Message, i int) {
	select {
	case <-s.idle: // idle until now: from here on busy
		s.idle = make(chan struct{})
	default:
	}
	s.queue = slices.Insert(s.queue, i, m)
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Describe declares the source OffsetOrdered unless the script's
// ReorderWindow is above 1 (messages must be pushed in offset order per
// lane; a released message comes again ahead of its lane's later ones),
// and ProducerChosenIDs as the script says.
func (s *Source) Describe() source.Description {
	return source.Description{
		OffsetOrdered:     s.script.ReorderWindow == 1,
		ProducerChosenIDs: s.script.ProducerChosenIDs,
	}
}

// Run delivers queued messages until ctx ends.
func (s *Source) Run(ctx context.Context, deliver source.DeliverFunc) error {
	for {
		s.mu.Lock()
		var m *consumer.Message
		if n := len(s.queue); n > 0 {
			i := s.rng.IntN(min(n, s.script.ReorderWindow))
			m = s.queue[i]
			s.queue[i] = s.queue[0] // the head moves into the window: O(1) per delivery
			s.queue[0] = nil
			s.queue = s.queue[1:]
			s.inflight++
			s.delivers++
		}
		s.mu.Unlock()
		if m == nil {
			select {
			case <-s.wake:
				continue
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		if err := deliver(ctx, m); err != nil {
			s.mu.Lock()
			s.inflight--
			if errors.Is(err, consumer.ErrLaneStopped) {
				// A broker would keep the message for the next consumer.
				s.stalled = append(s.stalled, m)
				s.settleIdle()
				s.mu.Unlock()
				continue
			}
			s.redeliver(m) // not taken: keep it for the next run
			s.mu.Unlock()
			return err
		}
	}
}

// Ack records acknowledgements, or loses them when the script crashes here.
func (s *Source) Ack(_ context.Context, msgs []*consumer.Message) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.acks++
	s.inflight -= len(msgs)
	for _, m := range msgs {
		if s.lost[m] {
			delete(s.lost, m)
		} else {
			s.counted++
		}
	}
	if n := s.script.CrashAfterCommitEvery; n > 0 && s.counted >= n {
		s.counted = 0
		s.crashes++
		for _, m := range msgs {
			c := copyWithAttempt(m, m.Attempt+1)
			s.lost[c] = true
			s.enqueue(c)
		}
		return nil
	}
	for _, m := range msgs {
		s.acked[m.ID]++
	}
	s.settleIdle()
	return nil
}

// Release queues released messages for redelivery, as a broker would.
func (s *Source) Release(msgs []*consumer.Message, _ error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.inflight -= len(msgs)
	s.released += len(msgs)
	for _, m := range msgs {
		s.redeliver(copyWithAttempt(m, m.Attempt+1))
	}
	s.settleIdle()
}

func (s *Source) settleIdle() {
	if len(s.queue) == 0 && s.inflight == 0 {
		select {
		case <-s.idle:
		default:
			close(s.idle)
		}
	}
}

// WaitIdle blocks until nothing is queued or in flight: every delivery was
// acked (or released and delivered again, and acked).
func (s *Source) WaitIdle(ctx context.Context) error {
	for {
		s.mu.Lock()
		idle := s.idle
		s.mu.Unlock()
		select {
		case <-idle:
			s.mu.Lock()
			done := len(s.queue) == 0 && s.inflight == 0
			s.mu.Unlock()
			if done {
				return nil
			}
		case <-ctx.Done():
			s.mu.Lock()
			defer s.mu.Unlock()
			return fmt.Errorf("consumertest: not idle: %d queued, %d in flight: %w", len(s.queue), s.inflight, ctx.Err())
		}
	}
}

// SourceStats counts what the source saw.
type SourceStats struct {
	Deliveries int // deliveries handed to the consumer
	Acked      int // distinct message IDs acknowledged
	AckCalls   int
	Crashes    int // acks lost on purpose
	Released   int
}

// Stats returns the source's counters.
func (s *Source) Stats() SourceStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return SourceStats{Deliveries: s.delivers, Acked: len(s.acked), AckCalls: s.acks, Crashes: s.crashes, Released: s.released}
}

// Acked returns how many times the message with id was acknowledged.
func (s *Source) Acked(id string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.acked[id]
}

var _ source.Source = (*Source)(nil)
