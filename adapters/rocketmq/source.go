package rocketmq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	rmq "github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/source"
	"github.com/idemkit/idem/internal/retry"
)

// ErrNotRunning is what Source.DeadLetter and Source.Retry return outside
// Source.Run: the consumer calls them only while Run runs.
var ErrNotRunning = errors.New("rocketmq: Source.Run is not running")

// Source is a source.Source over a RocketMQ push consumer, a
// consumer.DeadLetter (see Config.DeadLetter) and, with Config.RetryDelays,
// a consumer.RetrySink (see Source.Retry). Create it with New and give it
// to consumer.Config as both Source and DeadLetter (and NonBlocking.Sink). Safe for concurrent use.
// Run may be called again after it returned.
type Source struct {
	cfg     Config
	log     *slog.Logger
	retryOf map[string]string // retry topic -> its topic (Config.RetryDelays)

	running atomic.Bool
	runs    atomic.Int64 // numbers the instance name of each Run
	// allocate replaces the client's queue allocation (tests: a group that
	// leaves a queue to no one).
	allocate rmq.AllocateStrategy
	// slowResults delays the client after each consume call returned,
	// before it records the call's offset (tests: the shutdown race of
	// offsets.go).
	slowResults time.Duration

	mu  sync.Mutex
	cur *run   // the Run in progress, nil outside Run
	dlq sender // DeadLetterTopic mode, during Run
	// lanes reads the process queues of the Run's push consumer, once it
	// started (a closure: the client's types are internal to it).
	lanes func() []source.LaneStatus
}

// New validates cfg and returns a Source. The error names every field that
// is wrong. New leaves the client library's process-wide logger alone; see
// SetClientLogger.
func New(cfg Config) (*Source, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	cfg.NameServers = append([]string(nil), cfg.NameServers...)
	cfg.Topics = append([]string(nil), cfg.Topics...)
	cfg.RetryDelays = append([]time.Duration(nil), cfg.RetryDelays...)
	retryOf := make(map[string]string)
	if len(cfg.RetryDelays) > 0 {
		for _, t := range cfg.Topics {
			retryOf[RetryTopic(t)] = t
		}
	}
	return &Source{
		cfg:     cfg,
		log:     cfg.Logger.With(slog.String("group", cfg.Group)),
		retryOf: retryOf,
	}, nil
}

// Run starts a push consumer for Config.Group on Config.Topics and delivers
// what it is handed until ctx ends. It fails at once when a topic does not
// exist (create topics first) or the client cannot start.
//
// When ctx ends Run stops delivering, waits until every message it delivered
// is acked or released (a graceful consumer Stop finishes them, a hard stop
// releases them), shuts the push consumer down (orderly queues unlocked,
// offsets persisted, the client unregistered; bounded by
// Config.CloseTimeout) and returns nil. Consume calls that were not finished
// are dropped with their process queues: their messages are redelivered to
// the next owner from the committed offset, not sent to the retry topic.
func (s *Source) Run(ctx context.Context, deliver source.DeliverFunc) error {
	if !s.running.CompareAndSwap(false, true) {
		return errors.New("rocketmq: Source.Run is already running")
	}
	defer s.running.Store(false)
	if ctx.Err() != nil {
		return nil
	}
	instance := s.cfg.InstanceName
	if n := s.runs.Add(1); n > 1 {
		instance += "-" + strconv.FormatInt(n, 10)
	}

	var dlq sender
	if s.cfg.DeadLetter == DeadLetterTopic || len(s.retryOf) > 0 {
		p, err := s.startProducer(instance + "-dlq")
		if err != nil {
			return err
		}
		dlq = p
		defer s.shutdownProducer(p)
	}
	r := newRun(&s.cfg, s.log, deliver)
	r.retryOf = s.retryOf
	s.mu.Lock()
	s.cur, s.dlq = r, dlq
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.cur, s.dlq = nil, nil
		s.mu.Unlock()
	}()

	topics := slices.Clone(s.cfg.Topics)
	var retryTopics []string
	for _, t := range s.cfg.Topics {
		if len(s.retryOf) > 0 {
			retryTopics = append(retryTopics, RetryTopic(t))
		}
	}
	topics = append(topics, retryTopics...) // consumed beside their topics
	s.seedRetryOffsets(ctx, retryTopics)    // retry topics start at their first message (retrystart.go)
	pc, started, err := startConsumer(ctx, s, instance, topics, r, rmq.NewPushConsumer)
	if !started {
		return err // nil: ctx ended while a route was missing
	}
	var watch *groupWatch
	if s.cfg.GroupCheck > 0 && s.cfg.AccessKey == "" {
		watch = newGroupWatch(&s.cfg, s.log)
		wctx, stopWatch := context.WithCancel(ctx)
		var watching sync.WaitGroup
		watching.Go(func() { watch.run(wctx) })
		defer func() {
			stopWatch()
			watching.Wait()
		}()
	}
	s.mu.Lock()
	s.lanes = func() []source.LaneStatus {
		info := pc.GetConsumerRunningInfo(false)
		out := make([]source.LaneStatus, 0, len(info.MQTable))
		for mq, pq := range info.MQTable {
			if pq.Dropped {
				continue
			}
			// A pull the broker holds (long polling) is fetching until it
			// answers.
			fetch := time.UnixMilli(pq.LastPullTimestamp).Add(pullHold)
			if now := time.Now(); fetch.After(now) {
				fetch = now
			}
			out = append(out, source.LaneStatus{
				Lane:        laneOf(&mq),
				LastFetch:   fetch,
				Waiting:     int64(pq.CachedMsgCount),
				LastSettled: time.UnixMilli(pq.LastConsumeTimestamp),
			})
		}
		if watch != nil {
			held := make(map[string]bool, len(out))
			for _, l := range out {
				held[l.Lane] = true
			}
			out = append(out, watch.unheld(time.Now(), held)...)
		}
		return out
	}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.lanes = nil
		s.mu.Unlock()
	}()
	s.log.Debug("rocketmq: consuming", slog.Any("topics", topics), slog.String("instance", instance),
		slog.Bool("orderly", s.cfg.Orderly))

	<-ctx.Done()
	r.stop()
	states := func() []processQueue {
		info := pc.GetConsumerRunningInfo(false)
		out := make([]processQueue, 0, len(info.MQTable))
		for mq, pq := range info.MQTable {
			out = append(out, processQueue{mq: mq, lane: laneOf(&mq), dropped: pq.Dropped, commit: pq.CommitOffset,
				cached: int64(pq.CachedMsgCount), minC: pq.CachedMsgMinOffset,
				taken: int64(pq.TransactionMsgCount), minT: pq.TransactionMsgMinOffset})
		}
		return out
	}
	if ok, lane := r.awaitHandled(states, min(s.cfg.CloseTimeout, handleWait)); !ok {
		s.log.Warn("rocketmq: the client did not handle the result of a queue's last consume calls before the shutdown; what they acked may come again to the queue's next owner",
			slog.String("lane", lane), slog.Duration("waited", min(s.cfg.CloseTimeout, handleWait)))
	}
	s.commitRecorded(r, states(), min(s.cfg.CloseTimeout, handleWait))
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := pc.Shutdown(); err != nil {
			s.log.Warn("rocketmq: consumer shutdown", slog.Any("error", err))
		}
	}()
	t := time.NewTimer(s.cfg.CloseTimeout)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		s.log.Warn("rocketmq: consumer shutdown still running after CloseTimeout; Run returns without it",
			slog.Duration("close_timeout", s.cfg.CloseTimeout))
	}
	r.shutDown()
	return nil
}

// startConsumer creates, subscribes and starts the push consumer. The
// client refuses to start while a topic has no route on the name servers,
// and shuts the consumer down itself. That is a topic not created yet, or
// one whose route a name server dropped for a while: it forgets every topic
// of a broker the moment the broker's connection to it closes (a broker
// closes it when the name server answers slowly), until the broker
// registers again, within 30 s. Such a start is tried again, with a new
// instance name each time, until Config.RouteWait; then Run returns the
// client's error. started is false when it failed or ctx ended first.
//
// newPC is rmq.NewPushConsumer, passed for its result type, which the
// client does not export.
func startConsumer[PC pushConsumer](ctx context.Context, s *Source, instance string, topics []string, r *run,
	newPC func(...rmq.Option) (PC, error)) (pc PC, started bool, err error) {
	begin := time.Now()
	wait := retry.Policy{Initial: 500 * time.Millisecond, Max: 5 * time.Second, Multiplier: 2, Jitter: 0.2,
		MaxElapsed: s.cfg.RouteWait, Clock: retry.SystemClock{}}.New()
	for attempt := 1; ; attempt++ {
		name := instance
		if attempt > 1 {
			name += "-start" + strconv.Itoa(attempt)
		}
		pc, err = newConsumer(ctx, s, name, topics, r, newPC)
		if err == nil || !routeMissing(err) || s.cfg.RouteWait < 0 {
			return pc, err == nil, err
		}
		s.log.Warn("rocketmq: a topic has no route on the name servers; starting again",
			slog.Any("error", err), slog.Int("attempt", attempt), slog.Duration("route_wait", s.cfg.RouteWait))
		more, werr := wait.Wait(ctx)
		if werr != nil {
			return pc, false, nil
		}
		if !more {
			return pc, false, fmt.Errorf("%w (refused for %v, Config.RouteWait %v: create the topic, or check NameServers)",
				err, time.Since(begin).Round(time.Millisecond), s.cfg.RouteWait)
		}
	}
}

// pushConsumer is what startConsumer needs of the client's push consumer.
type pushConsumer interface {
	Subscribe(topic string, selector rmq.MessageSelector,
		f func(context.Context, ...*primitive.MessageExt) (rmq.ConsumeResult, error)) error
	Start() error
}

func newConsumer[PC pushConsumer](ctx context.Context, s *Source, instance string, topics []string, r *run,
	newPC func(...rmq.Option) (PC, error)) (PC, error) {
	pc, err := newPC(s.consumerOptions(instance)...)
	if err != nil {
		return pc, fmt.Errorf("rocketmq: push consumer: %w", err)
	}
	sel := rmq.MessageSelector{Type: rmq.TAG, Expression: s.cfg.Tags}
	for _, topic := range topics {
		err := pc.Subscribe(topic, sel, func(cctx context.Context, msgs ...*primitive.MessageExt) (rmq.ConsumeResult, error) {
			return r.consume(ctx, cctx, msgs), nil
		})
		if err != nil {
			return pc, fmt.Errorf("rocketmq: subscribe %s: %w", topic, err)
		}
	}
	// On a missing route Start shuts the consumer down itself. Its other
	// failures (validation, instance taken) happen before anything started.
	if err := pc.Start(); err != nil {
		return pc, fmt.Errorf("rocketmq: start consumer group %s: %w", s.cfg.Group, err)
	}
	return pc, nil
}

// routeMissing reports whether err is the client's refusal to start for a
// topic without a route ("the topic=%s route info not found, it may not
// exist", push_consumer.go; TestRunWaitsForTheTopicsRoute pins it).
func routeMissing(err error) bool { return strings.Contains(err.Error(), "route info not found") }

// Ack settles msgs as consumed: a consume call returns ConsumeSuccess once
// all of its messages are acked.
func (s *Source) Ack(_ context.Context, msgs []*consumer.Message) error {
	if r := s.current(); r != nil {
		r.settle(msgs, false, false)
	}
	return nil
}

// Release gives msgs back: their consume calls return "retry later"
// (concurrent mode: to the retry topic with Config.RetryDelayLevel; orderly
// mode: suspended and handed over again), or, while the source stops, are
// dropped so that the next owner of the queue gets the messages from the
// committed offset. In orderly mode a queue whose lane stopped
// (consumer.ErrLaneStopped) is held until Run ends.
func (s *Source) Release(msgs []*consumer.Message, reason error) {
	if r := s.current(); r != nil {
		r.settle(msgs, true, errors.Is(reason, consumer.ErrLaneStopped))
	}
}

// pullHold is how long the broker may hold a pull of this client before it
// answers: the push consumer's SuspendTimeoutMillis, 20 s, fixed.
const pullHold = 20 * time.Second

// handleWait bounds how long Run waits, once its last consume calls
// returned, for the client to handle their results (offsets.go).
const handleWait = 3 * time.Second

// Describe declares the Source: RocketMQ, in Config.Group; its message
// IDs chosen by the producer (ProducerChosenIDs: a message's ID is its
// UNIQ_KEY, which the producer sets, or may set to anything — the client
// adds one only when it is missing; a redriven copy sent with the lineage
// of its dead letter, wire.MetaRedriveCount and the idem-original-*
// properties, is a new message with a UNIQ_KEY of its own, in whichever
// queue the producer picked, and comes back through the retry topic in yet
// another: the consumer keys it by the idem-original-msg-id it carries,
// wherever it lies); not OffsetOrdered (a failed message comes back
// through the group's retry topic, behind later offsets); LaneOrdered in
// orderly mode (Config.Orderly) only; its retry topics (Config.RetryDelays);
// and the queues it holds.
func (s *Source) Describe() source.Description {
	return source.Description{
		System:            "rocketmq",
		Group:             s.cfg.Group,
		ProducerChosenIDs: true,
		LaneOrdered:       s.cfg.Orderly,
		RetryDelays:       append([]time.Duration{}, s.cfg.RetryDelays...),
		RetryOf:           s.retryTopicOf,
		Lanes:             s.lanesNow,
	}
}

// lanesNow reports the queues the push consumer holds (its process
// queues): when it last pulled each, how many pulled messages are not
// consumed yet and when it last finished consuming some (or took the
// queue). It is the client's own view, so it shows a queue whose pulling
// stopped or whose messages wait unconsumed, which nothing delivered to
// the consumer shows. Nil outside Run.
func (s *Source) lanesNow() []source.LaneStatus {
	s.mu.Lock()
	lanes := s.lanes
	s.mu.Unlock()
	if lanes == nil {
		return nil
	}
	return lanes()
}

func (s *Source) current() *run {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur
}

func (s *Source) consumerOptions(instance string) []rmq.Option {
	from := rmq.ConsumeFromFirstOffset
	if s.cfg.StartFrom == LastOffset {
		from = rmq.ConsumeFromLastOffset
	}
	opts := []rmq.Option{
		rmq.WithNsResolver(primitive.NewPassthroughResolver(s.cfg.NameServers)),
		rmq.WithGroupName(s.cfg.Group),
		rmq.WithInstance(instance),
		rmq.WithConsumerModel(rmq.Clustering),
		rmq.WithConsumerOrder(s.cfg.Orderly),
		rmq.WithConsumeFromWhere(from),
		rmq.WithConsumeMessageBatchMaxSize(s.cfg.BatchMaxSize),
		rmq.WithPullBatchSize(int32(s.cfg.PullBatchSize)),
		rmq.WithConsumeGoroutineNums(s.cfg.ConsumeGoroutines),
		rmq.WithMaxReconsumeTimes(int32(s.cfg.MaxReconsumeTimes)),
		rmq.WithConsumeTimeout(s.cfg.ConsumeTimeout),
		rmq.WithAutoCommit(true),
	}
	if s.allocate != nil {
		opts = append(opts, rmq.WithStrategy(s.allocate))
	}
	if d := s.slowResults; d > 0 {
		opts = append(opts, rmq.WithInterceptor(func(ctx context.Context, req, reply any, next primitive.Invoker) error {
			err := next(ctx, req, reply)
			time.Sleep(d)
			return err
		}))
	}
	if s.cfg.AccessKey != "" {
		opts = append(opts, rmq.WithCredentials(s.credentials()))
	}
	return opts
}

func (s *Source) credentials() primitive.Credentials {
	return primitive.Credentials{AccessKey: s.cfg.AccessKey, SecretKey: s.cfg.SecretKey, SecurityToken: s.cfg.SecurityToken}
}
