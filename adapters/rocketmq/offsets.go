package rocketmq

import (
	"context"
	"log/slog"
	"slices"
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"

	"github.com/idemkit/idem/internal/rmqremoting"
)

// The push consumer records a queue's new offset after a consume call
// returned, in the goroutine that called it, and only while the queue's
// process queue is not dropped. Shutdown drops every process queue first
// and then persists the offsets it recorded. A call that returned just
// before Run stopped (its messages acked, its result handed back) could
// lose that race: its offset was never recorded, and the group's next
// member was delivered the acked messages again. So between the last
// call's return and the shutdown, Run waits until the client handled the
// result of every call that returned (awaitHandled).
//
// Shutdown then sends what the client recorded one way, without waiting
// for an answer, and closes its connections at once: under load the
// broker was seen keeping the previous offset (2 of about 450 queue stops
// in the conformance suite's stop tests), and the group's next member was
// delivered what the first had acked. So Run commits the recorded offsets
// itself, each answered by the broker, before the shutdown
// (commitRecorded).

// processQueue is what the client reports of one of its process queues.
type processQueue struct {
	mq      primitive.MessageQueue
	lane    string
	dropped bool
	commit  int64 // the offset it recorded (memory, else the broker's)
	cached  int64 // pulled and not removed (concurrent), not taken by a call (orderly)
	minC    int64 // the lowest of those
	taken   int64 // orderly: taken by a call, not committed yet
	minT    int64 // the lowest of those
}

// sawLocked, under r.mu: msgs were handed to a consume call.
func (r *run) sawLocked(msgs []*primitive.MessageExt) {
	lane := laneOf(msgs[0].Queue)
	for _, m := range msgs {
		r.seen[lane] = max(r.seen[lane], m.QueueOffset+1)
	}
	r.held[lane] += int64(len(msgs))
}

// returnsLocked, under r.mu: a call of lane returns its result for n
// messages to the client, which handles it after that.
func (r *run) returnsLocked(lane string, n int) {
	r.held[lane] -= int64(n)
	r.returned[lane] = true
}

// handled reports whether the client handled the result of every call
// that returned, on the queues it still holds, and the first lane where it
// did not. It did once the messages it keeps for the calls are only those
// of calls that did not return (the cache, or in orderly mode the taken
// messages), and the offset it recorded is the lowest message it keeps,
// or one past the highest it handed to a call when it keeps none.
// (Concurrent mode: messages pulled and not handed to a call yet, for lack
// of a free consume goroutine, keep this false until they are.)
func (r *run) handled(queues []processQueue) (bool, string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, q := range queues {
		if q.dropped || !r.returned[q.lane] {
			continue
		}
		inCalls := q.cached
		if r.cfg.Orderly {
			inCalls = q.taken
		}
		want := r.seen[q.lane]
		switch {
		case q.taken > 0:
			want = q.minT
		case q.cached > 0:
			want = q.minC
		}
		if inCalls != r.held[q.lane] || q.commit < want {
			return false, q.lane
		}
	}
	return true, ""
}

// awaitHandled waits, for at most d, until r.handled holds for what
// states reports, and reports the lane it did not hold for when it gave
// up.
func (r *run) awaitHandled(states func() []processQueue, d time.Duration) (bool, string) {
	deadline := time.Now().Add(d)
	for wait := 100 * time.Microsecond; ; wait = min(2*wait, 20*time.Millisecond) {
		ok, lane := r.handled(states())
		if ok || time.Now().After(deadline) {
			return ok, lane
		}
		time.Sleep(wait)
	}
}

// commitRecorded commits the offset the client recorded for each queue it
// still holds and handed a returned call of, and waits for the broker's
// answers, for at most d. Without name servers it can reach unsigned
// (AccessKey set), it leaves that to the client's own one-way persist.
func (s *Source) commitRecorded(r *run, queues []processQueue, d time.Duration) {
	if s.cfg.AccessKey != "" {
		return
	}
	want := map[string]int64{}
	var topics []string
	r.mu.Lock()
	for _, q := range queues {
		if q.dropped || !r.returned[q.lane] || q.commit < 0 {
			continue
		}
		want[q.lane] = q.commit
		if !slices.Contains(topics, q.mq.Topic) {
			topics = append(topics, q.mq.Topic)
		}
	}
	r.mu.Unlock()
	if len(want) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	readQueues(ctx, s.cfg.NameServers, topics, func(topic string, err error) {
		s.log.Warn("rocketmq: cannot read a topic's route to commit its offsets before the shutdown; the client's own persist is left",
			slog.String("topic", topic), slog.Any("error", err))
	}, func(q rmqremoting.Queue) {
		off, ok := want[laneOf(&primitive.MessageQueue{Topic: q.Topic, BrokerName: q.Broker, QueueId: q.ID})]
		if !ok {
			return
		}
		if err := rmqremoting.CommitOffset(ctx, s.cfg.Group, q, off); err != nil {
			s.log.Warn("rocketmq: cannot commit a queue's offset before the shutdown; the client's own persist is left",
				slog.String("queue", q.String()), slog.Int64("offset", off), slog.Any("error", err))
		}
	})
}
