package rocketmq

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"

	"github.com/idemkit/idem/consumer/source"
	"github.com/idemkit/idem/internal/rmqremoting"
)

// groupWatch reads, every Config.GroupCheck, each queue of the Source's
// topics from its broker: the queue's last offset and the group's committed
// offset. The members of a group split the queues among themselves, each
// from its own view of who is in the group; a queue left out of every view
// is consumed by no process, and no process's own report (its process
// queues) shows it. The watch reports such a queue — one this process does
// not hold, with messages behind the committed offset, which has not moved
// for two checks — as a lane of this process, so that Health, /healthz and
// the stalled-lanes gauge see it wherever it is held or not.
type groupWatch struct {
	nameServers []string
	group       string
	topics      []string
	every       time.Duration
	fromFirst   bool // Config.StartFrom is FirstOffset
	log         *slog.Logger

	mu     sync.Mutex
	queues map[string]*queueState // by lane
}

// queueState is what the last checks saw of one queue.
type queueState struct {
	committed, last int64     // the group's committed offset; the offset after the queue's last message
	movedAt         time.Time // when committed last changed (or was first seen)
	checkedAt       time.Time
}

func newGroupWatch(cfg *Config, log *slog.Logger) *groupWatch {
	return &groupWatch{
		nameServers: cfg.NameServers, group: cfg.Group, topics: cfg.Topics, every: cfg.GroupCheck,
		fromFirst: cfg.StartFrom != LastOffset, log: log,
		queues: make(map[string]*queueState),
	}
}

// run checks at once and then every w.every until ctx ends.
func (w *groupWatch) run(ctx context.Context) {
	t := time.NewTicker(w.every)
	defer t.Stop()
	for {
		w.check(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// check reads every queue once, within one interval. A queue it cannot read
// keeps what the last check saw, and is dropped by unheld once that is old.
func (w *groupWatch) check(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, w.every)
	defer cancel()
	readQueues(ctx, w.nameServers, w.topics, func(topic string, err error) {
		w.log.Debug("rocketmq: group check: no route", slog.String("topic", topic), slog.Any("error", err))
	}, func(q rmqremoting.Queue) {
		last, err := rmqremoting.MaxOffset(ctx, q)
		if err != nil {
			w.log.Debug("rocketmq: group check", slog.String("queue", q.String()), slog.Any("error", err))
			return
		}
		committed, ok, err := rmqremoting.ConsumerOffset(ctx, w.group, q)
		if err == nil && !ok {
			// Never consumed: the group would start at the first
			// message (FirstOffset) or at the end (LastOffset).
			committed = last
			if w.fromFirst {
				committed, err = rmqremoting.MinOffset(ctx, q)
			}
		}
		if err != nil {
			w.log.Debug("rocketmq: group check", slog.String("queue", q.String()), slog.Any("error", err))
			return
		}
		w.saw(laneOf(&primitive.MessageQueue{Topic: q.Topic, BrokerName: q.Broker, QueueId: q.ID}), committed, last, time.Now())
	})
}

// readQueues calls fn with each readable queue of topics as the name
// servers route them, and noRoute with a topic whose route none of them
// gave: the walk the group check and the retry queues' start share.
func readQueues(ctx context.Context, nameServers, topics []string, noRoute func(topic string, err error), fn func(q rmqremoting.Queue)) {
	for _, topic := range topics {
		route, err := topicRoute(ctx, nameServers, topic)
		if err != nil {
			noRoute(topic, err)
			continue
		}
		for _, b := range route {
			if !b.Readable() || b.Addr == "" {
				continue
			}
			for id := range b.ReadQueues {
				fn(rmqremoting.Queue{Addr: b.Addr, Broker: b.Name, Topic: topic, ID: id})
			}
		}
	}
}

// topicRoute asks each name server in turn for topic's route.
func topicRoute(ctx context.Context, nameServers []string, topic string) (route []rmqremoting.RouteBroker, err error) {
	for _, ns := range nameServers {
		if route, err = rmqremoting.TopicRoute(ctx, ns, topic); err == nil {
			return route, nil
		}
	}
	return nil, err
}

func (w *groupWatch) saw(lane string, committed, last int64, now time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	st, ok := w.queues[lane]
	if !ok || st.committed != committed {
		st = &queueState{movedAt: now}
		w.queues[lane] = st
	}
	st.committed, st.last, st.checkedAt = committed, last, now
}

// unheld returns the queues that are not in held, have messages behind the
// group's committed offset and whose committed offset has not moved for two
// checks, as lanes: Waiting the messages behind, LastSettled when the
// committed offset last moved. What the last three checks did not see again
// is left out.
func (w *groupWatch) unheld(now time.Time, held map[string]bool) []source.LaneStatus {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []source.LaneStatus
	for lane, st := range w.queues {
		if held[lane] || st.last <= st.committed || now.Sub(st.checkedAt) > 3*w.every || now.Sub(st.movedAt) < 2*w.every {
			continue
		}
		out = append(out, source.LaneStatus{Lane: lane, Waiting: st.last - st.committed, LastSettled: st.movedAt, Elsewhere: true})
	}
	return out
}
