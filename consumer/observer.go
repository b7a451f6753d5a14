package consumer

import (
	"context"
	"time"

	"github.com/idemkit/idem/dedup"
)

// An Observer sees the engine's events. Telemetry is a view of them:
// consumer/otelconsumer turns them into OpenTelemetry metrics and traces, as
// Stats counts them. Config.Observer; default none.
//
// A lane calls its Observer from its own goroutine, per batch in this order:
//
//	BatchStart            a lane took messages into a batch
//	  TxStart, TxEnd      per transaction: the batch's first, a retry, a part of a split batch
//	  Settled             per message: applied, skipped as a duplicate or stale, or dead-lettered
//	  Retry               before each wait to retry
//	BatchEnd              the settled messages were acknowledged, the rest released
//
// Lanes call concurrently. An Observer must be quick (the lane waits for it)
// and must not keep the slices it is given past the call; the messages
// themselves stay valid. Embed NopObserver to implement only some methods.
type Observer interface {
	// BatchStart returns the batch's context: its transactions, handlers,
	// dead letters and acknowledgements run under it, so that a tracer's
	// span for the batch is their parent.
	BatchStart(ctx context.Context, b Batch) context.Context
	// TxStart returns the context of a transaction over n of the batch's
	// messages: the store and the handlers run under it.
	TxStart(ctx context.Context, n int) context.Context
	// TxEnd is called with TxStart's context when the transaction ended.
	TxEnd(ctx context.Context, t TxEvent)
	// Settled is called for each message the batch settled.
	Settled(ctx context.Context, s Settlement)
	// Retry is called for each retry after a failure, once its wait is over
	// and before the attempt it announces.
	Retry(ctx context.Context, r RetryEvent)
	// BatchEnd is called with BatchStart's context, after the acknowledgement.
	BatchEnd(ctx context.Context, b Batch)
}

// Batch is one batch of a lane.
type Batch struct {
	Consumer string     // Config.Name
	Source   SourceInfo // Consumer.SourceInfo
	Lane     string     // the partition or queue
	Messages []*Message // in delivery order
	// At BatchEnd: what was acknowledged (settled) and released (given back
	// unacknowledged, for the broker to deliver again), and the Source's
	// error from Ack, if any.
	Acked, Released []*Message
	AckErr          error
}

// TxEvent is one transaction: one claim of every key, the handlers of the new
// ones, one COMMIT.
type TxEvent struct {
	Messages int // claimed in it
	Start    time.Time
	// ClaimStart and ClaimEnd bracket Store.Claim; zero when the
	// transaction failed before it (BEGIN). ClaimErr is Claim's error.
	ClaimStart, ClaimEnd time.Time
	ClaimErr             error
	// CommitStart is when the handlers were done and COMMIT began; zero
	// when the transaction failed before COMMIT.
	CommitStart time.Time
	End         time.Time
	// Err is why the transaction failed (nil: committed), Class what the
	// consumer made of it: a conflict (deadlock, serialization failure, a
	// key in flight) is dedup.ClassConflict.
	Err   error
	Class dedup.ErrorClass
}

// Outcome is how a message was settled.
type Outcome uint8

const (
	OutcomeApplied      Outcome = iota + 1 // its handler's effects committed
	OutcomeDuplicate                       // skipped: its key was claimed before
	OutcomeDeadLettered                    // written to the dead-letter sink
	// written to the retry sink (NonBlocking), to come back after a delay;
	// Reason and Attempts say why, as for a dead letter
	OutcomeRetryLater
	// not applied: an event at or below its entity's watermark
	// (Config.Entity, StaleSkip); Reason wraps ErrStale and names the
	// versions. With StaleDeadLetter a stale event is OutcomeDeadLettered,
	// CauseStale.
	OutcomeStale
)

func (o Outcome) String() string {
	switch o {
	case OutcomeApplied:
		return "applied"
	case OutcomeDuplicate:
		return "duplicate"
	case OutcomeDeadLettered:
		return "dead_lettered"
	case OutcomeRetryLater:
		return "retry_later"
	case OutcomeStale:
		return "stale"
	}
	return "unknown"
}

// SourceInfo is what a Source says of itself (source.Description), for
// telemetry and health: the messaging system and the broker's consumer
// group. Consumer.SourceInfo
// returns it; consumer/otelconsumer takes messaging.system and
// messaging.consumer.group.name from it.
type SourceInfo struct {
	System string // messaging.system: "kafka", "rocketmq"; empty when unknown
	Group  string // the broker's consumer group; empty when it has none
}

// Settlement is one message settled.
type Settlement struct {
	Message *Message
	Key     dedup.Key // zero when no key was derived (CauseBadInput)
	Outcome Outcome
	// OutcomeDuplicate: when the key was first claimed (store clock) and how old
	// it was when the duplicate arrived, as in Duplicate.
	FirstAt time.Time
	Age     time.Duration
	// OutcomeDeadLettered, OutcomeRetryLater: why, and the failures
	// charged to the message.
	Reason   error
	Cause    Cause
	Attempts int
	// OutcomeRetryLater: the wait of the retry destination the message
	// was written to (NonBlocking.Delays).
	RetryDelay time.Duration
	// ReturnedFrom, whatever the outcome: the message is a retry copy come
	// back (NonBlocking), and this is the wait of the trip it came back
	// from; 0 for any other message. Copies sent (RetryDelay) less copies
	// returned, by delay, are the copies in retry.
	ReturnedFrom time.Duration
}

// RetryEvent is a wait before a retry.
type RetryEvent struct {
	Lane string // empty for the store's and the dead-letter sink's retries
	N    int    // 1 for the first retry of a sequence
	Err  error
	// Class: dedup.ClassConflict for a conflict with another transaction,
	// ClassUnavailable for the database away.
	Class dedup.ErrorClass
}

// DeadLetterObserver is an Observer that also sees each dead letter as it
// is written: New wraps Config.DeadLetter with ObserveDeadLetter, so that
// the letter is written under the observer's view of it (a PRODUCER span
// whose trace context the letter carries, in otelconsumer). ctx is the
// batch's (BatchStart's). The wrapper must pass the Letter's Message on as
// it is: a Source finds its in-flight message by it. Wrapping a sink the
// observer wrapped already must return it unchanged.
type DeadLetterObserver interface {
	ObserveDeadLetter(next DeadLetter) DeadLetter
}

// NopObserver observes nothing. Embed it to implement some of Observer's
// methods.
type NopObserver struct{}

func (NopObserver) BatchStart(ctx context.Context, _ Batch) context.Context { return ctx }
func (NopObserver) TxStart(ctx context.Context, _ int) context.Context      { return ctx }
func (NopObserver) TxEnd(context.Context, TxEvent)                          {}
func (NopObserver) Settled(context.Context, Settlement)                     {}
func (NopObserver) Retry(context.Context, RetryEvent)                       {}
func (NopObserver) BatchEnd(context.Context, Batch)                         {}

var _ Observer = NopObserver{}
