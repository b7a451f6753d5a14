package rocketmq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"

	rmq "github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/source"
)

// run is the state of one Source.Run: the messages in flight and the consume
// calls that wait for them.
//
// The push consumer calls consume with a batch and wants its result
// synchronously. consume delivers the batch to the consumer, in order, and
// blocks until the consumer settled every delivered message (Ack or
// Release); only then does it know the result:
//
//   - every message acked                -> ConsumeSuccess: the client removes
//     them from its process queue and the offset moves on;
//   - one acked after a broker dead letter -> retry later with delay level -1
//     (concurrent) or suspended past MaxReconsumeTimes (orderly): the client
//     sends the original message to %DLQ%<group>, then moves on;
//   - anything else (released, not delivered, panic, shutdown)
//     -> ConsumeRetryLater / SuspendCurrentQueueAMoment.
//
// ConsumeSuccess is the zero value of ConsumeResult and the client ignores
// the error a callback returns, so consume never returns the zero value by
// accident: every path but the first sets the result explicitly.
type run struct {
	cfg     *Config
	log     *slog.Logger
	deliver source.DeliverFunc
	retryOf map[string]string // the Source's retry topics: their messages wait until due

	mu       sync.Mutex
	inflight map[*consumer.Message]*call
	stopping bool           // Run's context ended: no new deliveries
	isShut   bool           // shut is closed: nothing waits any more
	busy     sync.WaitGroup // calls that deliver or wait for their messages
	parked   sync.WaitGroup // calls that wait for the shutdown (result discarded)
	shut     chan struct{}  // closed once the push consumer was shut down

	laneMu sync.Mutex
	lanes  map[string]*sync.Mutex // serialises delivery per lane

	// Per lane (offsets.go), under mu: one past the highest offset a
	// consume call was handed, the messages of calls that did not return
	// yet, and whether a call returned its result to the client.
	seen     map[string]int64
	held     map[string]int64
	returned map[string]bool
}

// call is one consume call's bookkeeping.
type call struct {
	pending  int  // delivered, not yet settled
	released bool // a message was released or not delivered
	parked   bool // orderly lane stopped: hold the queue until shutdown
	dead     bool // a message was dead-lettered to the broker's DLQ
	done     chan struct{}
}

func newRun(cfg *Config, log *slog.Logger, deliver source.DeliverFunc) *run {
	return &run{
		cfg:      cfg,
		log:      log,
		deliver:  deliver,
		inflight: make(map[*consumer.Message]*call),
		shut:     make(chan struct{}),
		lanes:    make(map[string]*sync.Mutex),
		seen:     make(map[string]int64),
		held:     make(map[string]int64),
		returned: make(map[string]bool),
	}
}

// giveBack is the "not consumed" result of the consumption mode.
func (r *run) giveBack() rmq.ConsumeResult {
	if r.cfg.Orderly {
		return rmq.SuspendCurrentQueueAMoment
	}
	return rmq.ConsumeRetryLater
}

// consume is the push consumer's callback. ctx is Run's context: when it
// ends, deliveries stop. cctx is the client's, carrying the consume context
// whose fields steer what the client does with the result.
func (r *run) consume(ctx, cctx context.Context, msgs []*primitive.MessageExt) (res rmq.ConsumeResult) {
	res = r.giveBack()
	cc, _ := primitive.GetConcurrentlyCtx(cctx)
	if cc != nil {
		cc.DelayLevelWhenNextConsume = r.cfg.RetryDelayLevel
	}
	if oc, ok := primitive.GetOrderlyCtx(cctx); ok {
		oc.SuspendCurrentQueueTimeMillis = int(r.cfg.SuspendTime.Milliseconds())
	}
	if len(msgs) == 0 {
		return res
	}

	r.mu.Lock()
	r.sawLocked(msgs)
	if r.stopping || ctx.Err() != nil {
		wait := r.parkLocked()
		r.mu.Unlock()
		wait()
		return res
	}
	r.busy.Add(1)
	r.mu.Unlock()
	c := &call{done: make(chan struct{})}
	busy := true
	defer func() {
		if v := recover(); v != nil {
			r.log.Error("rocketmq: consume callback panicked; the messages are given back",
				slog.Any("panic", v), slog.String("stack", string(debug.Stack())))
			res = r.giveBack()
			r.mu.Lock()
			r.returnsLocked(laneOf(msgs[0].Queue), len(msgs))
			r.mu.Unlock()
		}
		if busy {
			r.busy.Done()
		}
	}()

	if err := r.deliverAll(ctx, c, msgs); err != nil {
		r.log.Debug("rocketmq: delivery stopped", slog.String("lane", laneOf(msgs[0].Queue)), slog.Any("error", err))
	}
	<-c.done

	r.mu.Lock()
	released, dead := c.released, c.dead
	hold := released && (c.parked || r.stopping || ctx.Err() != nil)
	var wait func()
	if hold {
		// Give the messages back by not consuming them at all: once the
		// push consumer is shut down it drops the result, and the next
		// owner of the queue starts at the committed offset. Returning now
		// would make the client send every message of the call (the acked
		// ones too) to the retry topic. (An orderly queue whose lane
		// stopped is held the same way.)
		wait = r.parkLocked()
	} else {
		r.returnsLocked(laneOf(msgs[0].Queue), len(msgs))
	}
	r.mu.Unlock()
	busy = false
	r.busy.Done()

	switch {
	case hold:
		wait()
		return r.giveBack()
	case released:
		return r.giveBack()
	case dead:
		return r.toBrokerDLQ(cc, msgs)
	default:
		return rmq.ConsumeSuccess
	}
}

// deliverAll delivers msgs to the consumer in order, holding their lane so
// that calls of one queue (concurrent mode runs several at once) do not
// interleave. c.done is closed once every delivered message is settled.
func (r *run) deliverAll(ctx context.Context, c *call, msgs []*primitive.MessageExt) error {
	lane := laneOf(msgs[0].Queue)
	converted := make([]*consumer.Message, len(msgs))
	for i, mx := range msgs {
		converted[i] = toMessage(mx, lane)
	}
	lm := r.laneLock(lane)
	lm.Lock()
	defer lm.Unlock()

	r.mu.Lock()
	c.pending = len(converted)
	for _, m := range converted {
		r.inflight[m] = c
	}
	r.mu.Unlock()
	for i, m := range converted {
		err := r.waitDue(ctx, m)
		if err == nil {
			err = r.deliver(ctx, m)
		}
		if err == nil {
			continue
		}
		// The rest is not in the consumer: it counts as released.
		r.mu.Lock()
		for _, u := range converted[i:] {
			delete(r.inflight, u)
		}
		c.released = true
		c.parked = r.cfg.Orderly && errors.Is(err, consumer.ErrLaneStopped)
		c.pending -= len(converted) - i
		if c.pending == 0 {
			close(c.done)
		}
		r.mu.Unlock()
		return err
	}
	return nil
}

// waitDue waits until m is due when it lies on a retry topic (see the
// package's waitDue): the broker's timer delivers it up to a second early.
func (r *run) waitDue(ctx context.Context, m *consumer.Message) error {
	if _, ok := r.retryOf[m.Topic]; ok && !waitDue(ctx, m) {
		return ctx.Err()
	}
	return nil
}

func (r *run) laneLock(lane string) *sync.Mutex {
	r.laneMu.Lock()
	defer r.laneMu.Unlock()
	lm, ok := r.lanes[lane]
	if !ok {
		lm = new(sync.Mutex)
		r.lanes[lane] = lm
	}
	return lm
}

// settle marks msgs settled; release says whether the consumer gave them
// back.
func (r *run) settle(msgs []*consumer.Message, release, laneStopped bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range msgs {
		c, ok := r.inflight[m]
		if !ok {
			continue
		}
		delete(r.inflight, m)
		if release {
			c.released = true
			if laneStopped && r.cfg.Orderly {
				c.parked = true
			}
		}
		c.pending--
		if c.pending == 0 {
			close(c.done)
		}
	}
}

// markDead records that m is to go to the broker's DLQ when its call ends.
func (r *run) markDead(m *consumer.Message) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	c, ok := r.inflight[m]
	if !ok {
		return fmt.Errorf("rocketmq: dead letter for %s: the message is not in flight in this source", m.Ref())
	}
	c.dead = true
	return nil
}

// toBrokerDLQ sets the call's result so that the client moves its message
// (calls carry one message in this mode) to %DLQ%<group>.
//
// Concurrent mode: "retry later" with DelayLevelWhenNextConsume -1; the
// client's send-back asks the broker for delay level -1, which the broker
// answers by storing the message in %DLQ%<group> (if the send-back fails,
// the client sends the message to the retry topic instead and it comes back
// to be dead-lettered again).
//
// Orderly mode: "suspend" with the message's ReconsumeTimes past
// MaxReconsumeTimes; the client's checkReconsumeTimes then sends it back
// with delay level -1 and commits the queue past it (if that send fails, it
// suspends and hands the message over again).
func (r *run) toBrokerDLQ(cc *primitive.ConsumeConcurrentlyContext, msgs []*primitive.MessageExt) rmq.ConsumeResult {
	if r.cfg.Orderly {
		for _, mx := range msgs {
			mx.ReconsumeTimes = int32(r.cfg.MaxReconsumeTimes) + 1
		}
		return rmq.SuspendCurrentQueueAMoment
	}
	if cc != nil {
		cc.DelayLevelWhenNextConsume = -1
	}
	return rmq.ConsumeRetryLater
}

// parkLocked registers a consume call that waits for the push consumer's
// shutdown and returns what the call runs to wait. r.mu is held.
func (r *run) parkLocked() (wait func()) {
	if r.isShut {
		return func() {}
	}
	r.parked.Add(1)
	return func() {
		<-r.shut
		r.parked.Done()
	}
}

// stop makes new calls wait for the shutdown and waits until the calls in
// flight have settled their messages (a graceful consumer Stop acks them, a
// hard stop releases them).
func (r *run) stop() {
	r.mu.Lock()
	r.stopping = true
	r.mu.Unlock()
	r.busy.Wait()
}

// shutDown lets the parked calls return (their results are dropped by the
// shut-down push consumer) and waits for them. Calls that come in later
// return at once.
func (r *run) shutDown() {
	r.mu.Lock()
	r.isShut = true
	r.mu.Unlock()
	close(r.shut)
	r.parked.Wait()
}
