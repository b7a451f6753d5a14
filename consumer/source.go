package consumer

import (
	"context"
	"fmt"
	"time"
)

// DeliverFunc hands one message to the consumer. It blocks while the
// message's lane is full (backpressure) and returns an error when ctx ends,
// the consumer stops (ErrStopped) or the lane stopped (ErrLaneStopped). It is
// safe for concurrent use; calls for one lane must come from one goroutine
// at a time, in the order the broker delivered the messages.
type DeliverFunc func(ctx context.Context, m *Message) error

// Source is a broker adapter. The consumer calls Run once; Run fetches
// messages and passes them to deliver until ctx ends. After ctx ends, Run
// should go on serving Ack and Release until every message it delivered was
// settled — the lanes finish what is queued when the consumer stops
// gracefully — and then return (a Kafka source commits those last offsets
// and leaves the group). After Run returns it must not call deliver again.
//
// Every message delivered is later passed to exactly one of Ack or Release.
// Both are called from the message's lane, once per batch: Ack with the
// batch's settled messages in delivery order, then Release with the rest in
// delivery order.
//
//   - Ack: the message is settled — its effects (or its skip as a duplicate,
//     or its dead letter) are committed. The source may acknowledge it to the
//     broker (commit the offset, return ConsumeSuccess). Ack is never called
//     before the database commit. Ack should not block on the broker: commit
//     in the background.
//   - Release: the consumer gave up on the message for now (hard stop, lane
//     stopped). The source must not acknowledge it; the broker redelivers it.
//     A Kafka source therefore commits nothing past a released offset.
//
// The slices passed to Ack and Release are reused for the next batch: they
// are valid only during the call (the messages themselves stay valid).
//
// A source that loses ownership of a partition (Kafka rebalance) may drop
// acks for it: the next owner is redelivered the messages and skips them as
// duplicates.
type Source interface {
	Run(ctx context.Context, deliver DeliverFunc) error
	Ack(ctx context.Context, msgs []*Message) error
	Release(msgs []*Message, reason error)
}

// AssignmentChecker is a Source whose partitions move between consumers
// (Kafka's rebalances) and that can tell whether a message it delivered
// still belongs to an assignment this consumer holds. With Config.Offsets
// the consumer asks it before it refuses a message below a stored next
// offset that lies past the message's LogEnd: a message of an assignment
// that ended was fetched before the partition's new owner moved the offset
// on, and is a duplicate, not a sign of a recreated topic.
type AssignmentChecker interface {
	Assigned(m *Message) bool
}

// OffsetOrdered is a Source that knows whether it delivers each partition's
// messages in offset order: within an assignment, offset n+1 only after n,
// and a redelivery starts again from the oldest message not acknowledged, as
// a Kafka consumer group does. Config.Offsets needs such a source: a message
// below the partition's stored next offset is skipped as settled, which is
// only true when nothing below it can still be outstanding. RocketMQ is not
// one: a queue's message that fails comes back through the group's retry
// topic, behind later offsets already committed.
type OffsetOrdered interface {
	InOffsetOrder() bool
}

// LaneReporter is a Source that can say how each partition (queue) it is
// assigned is doing on the broker's side: whether it is still fetched from,
// and whether messages of it wait with nothing settled. The consumer's
// Health carries the report, and Health.Live fails for a lane that stalls: a
// partition whose fetching stopped, or whose messages wait unconsumed, is
// lost throughput that nothing else shows (no message of it is in flight,
// so InFlight and LastProgress look fine).
type LaneReporter interface {
	Lanes() []LaneStatus
}

// LaneStatus is what a Source knows of one lane it is assigned.
type LaneStatus struct {
	Lane string // as Message.Lane
	// LastFetch is when the source last asked the broker for the lane's
	// messages (an answer with none counts); zero when unknown.
	LastFetch time.Time
	// Waiting is how many of the lane's fetched messages are not settled
	// yet, in the source or the consumer; LastSettled is when one was last
	// settled, or the lane was assigned.
	Waiting     int64
	LastSettled time.Time
	// Elsewhere marks a lane the source reports without holding it: a
	// queue of the group that, by the brokers' offsets, no process consumes
	// (the RocketMQ source, Config.GroupCheck; every member reports it).
	// It counts in StalledLanes, and so in /healthz and the stalled-lanes
	// gauge, but not in Health.Live: restarting this process is not the
	// remedy, and a slow handler in another process would otherwise fail
	// every member's liveness.
	Elsewhere bool
}

// Stalled says why the lane made no progress for longer than d before now,
// or "" when it did.
func (l LaneStatus) Stalled(now time.Time, d time.Duration) string {
	// While messages wait, fetching may rightly pause (the source's buffer
	// is full): only settling counts then.
	switch {
	case l.Elsewhere && l.Waiting > 0 && now.Sub(l.LastSettled) > d:
		return fmt.Sprintf("%d messages waiting, the group's committed offset still for %v, and no process here holds it",
			l.Waiting, now.Sub(l.LastSettled).Round(time.Second))
	case l.Waiting > 0 && now.Sub(l.LastSettled) > d:
		return fmt.Sprintf("%d messages waiting, none settled for %v", l.Waiting, now.Sub(l.LastSettled).Round(time.Second))
	case l.Waiting == 0 && !l.LastFetch.IsZero() && now.Sub(l.LastFetch) > d:
		return fmt.Sprintf("not fetched from for %v", now.Sub(l.LastFetch).Round(time.Second))
	}
	return ""
}

// SourceInfo is what a Source says of itself, for telemetry and health:
// the messaging system and the broker's consumer group. Consumer.SourceInfo
// returns it; consumer/otelconsumer takes messaging.system and
// messaging.consumer.group.name from it.
type SourceInfo struct {
	System string // messaging.system: "kafka", "rocketmq"; empty when unknown
	Group  string // the broker's consumer group; empty when it has none
}

// Describer is a Source that says what it is. The Kafka and RocketMQ
// sources are.
type Describer interface {
	SourceInfo() SourceInfo
}

// Wrapper is a Source that wraps another, to time, log or fault it: the
// consumer looks for the optional interfaces (OffsetOrdered,
// AssignmentChecker, LaneReporter, ProducerChosenIDs, ScopeReader,
// Describer) through Unwrap, so a wrapper that embeds the Source interface,
// which hides them, needs to forward none of them. The wrapper's own
// methods come first.
type Wrapper interface {
	Unwrap() Source
}

// sourceAs finds the first Source in s's Unwrap chain that is a T.
func sourceAs[T any](s Source) (T, bool) {
	for s != nil {
		if t, ok := s.(T); ok {
			return t, true
		}
		w, ok := s.(Wrapper)
		if !ok {
			break
		}
		s = w.Unwrap()
	}
	var zero T
	return zero, false
}

// ScopeReader is a Source that reads what the store keeps under a
// consumer's scope — the Kafka source that starts each partition at the
// store's next offset (kafka.StoreOffsets). New refuses one that reads
// another scope than Config.Name: it would read another consumer's
// offsets, or none, and nothing would say so.
type ScopeReader interface {
	ReadsScopes() []string
}

// assigned reports whether m belongs to an assignment the source still
// holds; true when the source cannot tell.
func (c *Consumer[TTx]) assigned(m *Message) bool {
	ac, ok := sourceAs[AssignmentChecker](c.cfg.Source)
	return !ok || ac.Assigned(m)
}
