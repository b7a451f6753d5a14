package source

import (
	"context"
	"fmt"
	"time"
)

// DeliverFunc hands one message to the consumer. It blocks while the
// message's lane is full (backpressure) and returns an error when ctx ends,
// the consumer stops (consumer.ErrStopped) or the lane stopped
// (consumer.ErrLaneStopped). It is safe for concurrent use; calls for one
// lane must come from one goroutine at a time, in the order the broker
// delivered the messages.
type DeliverFunc func(ctx context.Context, m *Message) error

// Source is a broker adapter. The consumer calls Describe once, in
// consumer.New, and Run once; Run fetches messages and passes them to
// deliver until ctx ends. After ctx ends, Run should go on serving Ack and
// Release until every message it delivered was settled — the lanes finish
// what is queued when the consumer stops gracefully — and then return (a
// Kafka source commits those last offsets and leaves the group). After Run
// returns it must not call deliver again.
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
//
// A Source that wraps another, to time, log or fault it, returns the
// wrapped Source's Description (or a changed copy of it).
type Source interface {
	Run(ctx context.Context, deliver DeliverFunc) error
	Ack(ctx context.Context, msgs []*Message) error
	Release(msgs []*Message, reason error)
	// Describe says what the source is and what it can do. Its zero
	// value is a source that declares nothing: the consumer then takes
	// the safe side of every choice below.
	Describe() Description
}

// Description is what a Source declares of itself: data, and the few
// behaviours the consumer calls back (nil when the source has none).
type Description struct {
	// System is the messaging system, as OpenTelemetry's messaging.system
	// names it ("kafka", "rocketmq"); empty when unknown.
	System string
	// Group is the broker's consumer group; empty when it has none.
	Group string

	// OffsetOrdered: the source delivers each partition's messages in
	// offset order — within an assignment, offset n+1 only after n, and a
	// redelivery starts again from the oldest message not acknowledged, as
	// a Kafka consumer group does. consumer.Config.Offsets needs it: a
	// message below the partition's stored next offset is skipped as
	// settled, which is only true when nothing below it can still be
	// outstanding. RocketMQ is not: a queue's message that fails comes back
	// through the group's retry topic, behind later offsets committed.
	OffsetOrdered bool

	// LaneOrdered: the source delivers each lane's messages in the order
	// the broker holds them, the next only after the one before it was
	// delivered — one consume call of a queue at a time. An OffsetOrdered
	// source is. consumer.NonBlocking.KeyOrdered needs one or the other: a
	// key's later message delivered beside its earlier one could be tried
	// first, before the earlier one fails and parks the key. RocketMQ's is
	// in orderly mode (rocketmq.Config.Orderly), not in concurrent mode.
	LaneOrdered bool

	// ProducerChosenIDs: Message.ID is chosen by the producer rather than
	// assigned by the broker. RocketMQ's is (a producer may set UNIQ_KEY);
	// Kafka's is not (its ID is the message's position). The consumer then
	// honours a redriven copy's original message ID wherever the copy lies.
	// False is the safe side: lineage is honoured only when it points at
	// an earlier offset of the copy's own partition.
	ProducerChosenIDs bool

	// ReadsScopes are the scopes of the store whose state the source
	// reads — the Kafka source that starts each partition at the store's
	// next offset (kafka.StoreOffsets). consumer.New refuses one that reads
	// another scope than its Config.Name: it would read another consumer's
	// offsets, or none, and nothing would say so.
	ReadsScopes []string

	// RetryDelays are the delays the source has retry destinations for,
	// and reads back (kafka and rocketmq Config.RetryDelays); nil when it
	// declares none, empty when it has none. When the source is also a
	// consumer.NonBlocking's Sink and declares them, consumer.New refuses
	// Delays that are not all among them: a copy written for another delay
	// would have nowhere to go.
	RetryDelays []time.Duration

	// RetryOf says whether topic is a retry topic of one of the source's
	// topics, and which. A copy on a retry topic is deduplicated by the
	// identity its lineage headers name (Message.Origin), wherever that
	// lies; with RetryOf nil the source reads no retry copies, and a
	// message with retry headers is keyed as a message of its own. Anyone
	// who can produce to a retry topic can name any message of its
	// original topic there: allow only the consumer to write to it.
	RetryOf func(topic string) (original string, ok bool)

	// Assigned reports whether m, which the source delivered, still
	// belongs to a partition assignment this consumer holds; nil for a
	// source whose partitions do not move between consumers. With
	// consumer.Config.Offsets the consumer asks it before it refuses a
	// message below a stored next offset that lies past the message's
	// LogEnd: a message of an assignment that ended was fetched before the
	// partition's new owner moved the offset on, and is a duplicate, not a
	// sign of a recreated topic.
	Assigned func(m *Message) bool

	// Lanes reports how each partition (queue) the source is assigned is
	// doing on the broker's side; nil when the source cannot tell. The
	// consumer's Health carries the report, and Health.Live fails for a
	// lane that stalls: a partition whose fetching stopped, or whose
	// messages wait unconsumed, is lost throughput that nothing else shows.
	Lanes func() []LaneStatus
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
