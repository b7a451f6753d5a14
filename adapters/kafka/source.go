package kafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	kafkago "github.com/segmentio/kafka-go"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/source"
)

// Source is a source.Source over a Kafka consumer group, and a
// consumer.DeadLetter that writes to a dead-letter topic of the same
// cluster. Create it with New and give it to consumer.Config as both Source
// and DeadLetter; the consumer calls Run, Ack, Release and DeadLetter. Safe
// for concurrent use. Run may be called again after it returned.
type Source struct {
	cfg    Config
	dialer *kafkago.Dialer
	log    *slog.Logger

	running atomic.Bool

	mu    sync.Mutex
	parts map[string]*partition // by lane: the current assignment

	fetchers sync.WaitGroup // fetch loops that may still deliver

	countsMu sync.Mutex
	counts   map[string]int // partitions per topic, as last seen by the partition watch

	// settled is signalled when a partition has nothing unsettled left or an
	// assignment ended; Run waits on it while it drains.
	settled chan struct{}

	dlqMu sync.RWMutex      // held for reading while a letter is written
	dlq   *deadLetterWriter // during Run

	retryOf map[string]string // retry topic -> its topic (Config.RetryDelays)
}

// New validates cfg and returns a Source. The error names every field that
// is wrong.
func New(cfg Config) (*Source, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	cfg.Brokers = append([]string(nil), cfg.Brokers...)
	cfg.Topics = append([]string(nil), cfg.Topics...)
	cfg.RetryDelays = append([]time.Duration(nil), cfg.RetryDelays...)
	retryOf := make(map[string]string)
	for _, t := range cfg.Topics {
		for _, d := range cfg.RetryDelays {
			retryOf[RetryTopic(t, d)] = t
		}
	}
	for _, t := range cfg.Topics[:len(cfg.Topics):len(cfg.Topics)] {
		for _, d := range cfg.RetryDelays {
			cfg.Topics = append(cfg.Topics, RetryTopic(t, d)) // consumed beside their topics
		}
	}
	return &Source{
		retryOf: retryOf,
		cfg:     cfg,
		dialer:  cfg.dialer(),
		log:     cfg.Logger.With(slog.String("group", cfg.Group)),
		parts:   make(map[string]*partition),
		settled: make(chan struct{}, 1),
	}, nil
}

// Run joins the group and consumes the partitions assigned to this member
// until ctx ends: one fetcher per partition delivers its messages in offset
// order, a committer per generation commits acked offsets. A generation that
// ends (rebalance, lost coordinator, broker restart) stops its fetchers and
// drops its uncommitted acks; Run joins the next one by itself and resumes
// from the committed offsets. Errors on the way (broker unreachable, join
// failed) are logged and retried; Run returns only when ctx ends.
//
// When ctx ends Run stops fetching, waits until every message it delivered
// is acked or released (the consumer settles them: graceful Stop finishes
// them, a hard stop releases them), closes its dead-letter writer, commits,
// leaves the group and returns nil.
func (s *Source) Run(ctx context.Context, deliver source.DeliverFunc) error {
	if !s.running.CompareAndSwap(false, true) {
		return errors.New("kafka: Source.Run is already running")
	}
	defer s.running.Store(false)
	if err := s.checkRetiredRetryTopics(ctx); err != nil {
		return err
	}
	s.openDeadLetters()
	defer s.closeDeadLetters()

	if s.cfg.PartitionWatchInterval > 0 {
		// The partition watch's first baseline; see watchPartitions.
		var conn *kafkago.Conn
		rctx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout)
		if counts, err := s.partitionCounts(rctx, &conn, 0); err == nil {
			s.setKnownCounts(counts)
		}
		cancel()
		if conn != nil {
			conn.Close()
		}
	}
	group, err := kafkago.NewConsumerGroup(s.cfg.groupConfig(s.dialer, s.log))
	if err != nil {
		return fmt.Errorf("kafka: consumer group: %w", err)
	}
	failures := 0
	for {
		kg, err := group.Next(ctx)
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			// kafka-go backs off (JoinGroupBackoff) before its next attempt,
			// except after RebalanceInProgress, where the broker paces it.
			failures++
			level := slog.LevelDebug
			switch {
			case errors.Is(err, kafkago.RebalanceInProgress):
				level = slog.LevelInfo
			case failures%logEvery == 1:
				level = slog.LevelWarn
			}
			s.log.Log(ctx, level, "kafka: joining the group failed; retrying",
				slog.Int("failures", failures), slog.Any("error", err))
			continue
		}
		if failures > 0 {
			s.log.Info("kafka: joined the group again", slog.Int("failures", failures))
			failures = 0
		}
		s.startGeneration(ctx, kg, deliver)
	}

	// Fetchers see ctx too and stop promptly (their connections are closed
	// under them); after this nothing more is delivered.
	s.fetchers.Wait()
	s.drain()
	// A letter comes before its message's ack, and every ack Run waits for
	// has come: no letter of this Run is left to write.
	s.closeDeadLetters()
	// Closing the group ends the current generation: its committer commits
	// what was acked, then kafka-go leaves the group.
	closed := make(chan struct{})
	go func() {
		group.Close()
		close(closed)
	}()
	t := time.NewTimer(s.cfg.CloseTimeout)
	defer t.Stop()
	select {
	case <-closed:
	case <-t.C:
		s.log.Warn("kafka: leaving the group takes longer than CloseTimeout; it goes on in the background",
			slog.Duration("close_timeout", s.cfg.CloseTimeout))
	}
	return nil
}

// drain waits until no message of a current assignment is unsettled.
func (s *Source) drain() {
	for s.busy() {
		<-s.settled
	}
}

func (s *Source) busy() bool {
	s.mu.Lock()
	parts := make([]*partition, 0, len(s.parts))
	for _, p := range s.parts {
		parts = append(parts, p)
	}
	s.mu.Unlock()
	for _, p := range parts {
		if p.busy() {
			return true
		}
	}
	return false
}

func (s *Source) signalSettled() {
	select {
	case s.settled <- struct{}{}:
	default:
	}
}

// Ack records that msgs are settled. Offsets are committed in the
// background, per partition up to the longest acked prefix of what was
// delivered; acks of partitions this member no longer owns are dropped (the
// new owner is redelivered the messages and skips them as duplicates). Ack
// does not wait for the commit and never fails.
func (s *Source) Ack(_ context.Context, msgs []*consumer.Message) error {
	s.settle(msgs, acked)
	return nil
}

// Describe declares the Source: Kafka, in Config.Group; OffsetOrdered (a
// partition is fetched in offset order, and after a rebalance or restart
// it starts again from the committed offset, or the store's with
// Config.StartOffsets); the scope of Config.StartOffsets when it is
// StoreOffsets's, for consumer.New to check against its Name; its retry
// topics (Config.RetryDelays); whether a message still belongs to an
// assignment this member holds; and how each assigned partition is doing.
func (s *Source) Describe() source.Description {
	d := source.Description{
		System:        "kafka",
		Group:         s.cfg.Group,
		OffsetOrdered: true,
		RetryDelays:   append([]time.Duration{}, s.cfg.RetryDelays...),
		RetryOf:       s.retryTopicOf,
		Assigned:      s.assigned,
		Lanes:         s.lanes,
	}
	if so, ok := s.cfg.StartOffsets.(storeOffsets); ok {
		d.ReadsScopes = []string{so.scope}
	}
	return d
}

// lanes reports the partitions of the current assignment: when each was
// last fetched from, how many of its delivered messages are not settled,
// and when one last was. A partition whose leader cannot be reached shows
// as not fetched from.
func (s *Source) lanes() []source.LaneStatus {
	s.mu.Lock()
	parts := make([]*partition, 0, len(s.parts))
	for _, p := range s.parts {
		parts = append(parts, p)
	}
	s.mu.Unlock()
	out := make([]source.LaneStatus, 0, len(parts))
	for _, p := range parts {
		if st, ok := p.status(s.cfg.MaxWait); ok {
			out = append(out, st)
		}
	}
	return out
}

// assigned reports whether m was delivered by a partition assignment this
// member still holds: false once a rebalance ended it, while the
// consumer's lane may still hold m.
func (s *Source) assigned(m *consumer.Message) bool {
	s.mu.Lock()
	p := s.parts[m.Lane]
	s.mu.Unlock()
	return p != nil && p.holds(m)
}

// Release records that the consumer gave up on msgs: nothing at or after
// the first of them is committed in the current generation, so the
// partition resumes from there after a restart or rebalance.
func (s *Source) Release(msgs []*consumer.Message, reason error) {
	s.settle(msgs, released)
	if len(msgs) > 0 {
		s.log.Debug("kafka: messages released", slog.Int("count", len(msgs)),
			slog.String("first", msgs[0].Ref()), slog.Any("reason", reason))
	}
}

func (s *Source) settle(msgs []*consumer.Message, to entryState) {
	var p *partition
	for i, m := range msgs {
		if i == 0 || m.Lane != msgs[i-1].Lane {
			s.mu.Lock()
			p = s.parts[m.Lane]
			s.mu.Unlock()
		}
		if p == nil {
			continue
		}
		commit, idle := p.settle(m, to)
		if commit && s.cfg.CommitInterval == 0 {
			p.gen.wakeCommitter()
		}
		if idle {
			s.signalSettled()
		}
	}
}

// logEvery: of a run of identical failures, the first and every logEvery-th
// are logged at warn level, the others at debug level.
const logEvery = 20

// reconnectBackoff paces reconnects and commit retries: from 100ms, doubling,
// jittered, up to Config.ReconnectBackoff, for as long as it takes.
func (s *Source) reconnectBackoff() *backoff.ExponentialBackOff {
	return backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(100*time.Millisecond),
		backoff.WithMaxInterval(s.cfg.ReconnectBackoff),
		backoff.WithMaxElapsedTime(0))
}

var _ source.Source = (*Source)(nil)
