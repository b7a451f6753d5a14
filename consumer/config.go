package consumer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/idemkit/idem/consumer/source"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/internal/retry"
)

// Clock tells the time and waits; inject a fake one in tests (such as
// consumertest.Clock) so that retries never sleep.
type Clock interface {
	Now() time.Time
	// Sleep waits d, or until ctx ends and returns its error.
	Sleep(ctx context.Context, d time.Duration) error
}

// ExhaustedPolicy says what happens to a message whose transient failures
// used up the retry policy.
type ExhaustedPolicy uint8

const (
	// DeadLetterOnExhausted (the default) dead-letters the message and moves on.
	DeadLetterOnExhausted ExhaustedPolicy = iota
	// StopLaneOnExhausted stops the message's lane: nothing more of its
	// partition or queue is processed or acknowledged until the consumer is
	// restarted. Other lanes go on. For streams where order matters more than
	// progress.
	StopLaneOnExhausted
)

// RetryPolicy bounds the retries of transient failures. Zero fields take the
// defaults.
type RetryPolicy struct {
	Initial     time.Duration // first delay; default 100ms
	Max         time.Duration // largest delay before jitter (a delay reaches Max×(1+Jitter) at most); default 10s
	Multiplier  float64       // growth per attempt; default 2
	Jitter      float64       // randomization factor in (0,1]; default 0.5 (delay ± 50%)
	MaxAttempts int           // attempts in all, the first included; default 10
	MaxElapsed  time.Duration // time bound of one message's retries; default 2m
}

// Config configures a Consumer. Zero values take the documented defaults.
type Config[TTx any] struct {
	// Name identifies the consumer; it is the scope of its dedup keys, so two
	// consumers with one Name deduplicate against each other. Required, at
	// most 64 bytes, no "/" and no control characters.
	Name string
	// Source delivers messages. Required.
	Source source.Source
	// Store claims keys in the handler's transaction. Required.
	Store dedup.Store[TTx]
	// Handler applies the effects, one message at a time. Exactly one of
	// Handler and BatchHandler is required.
	Handler Handler[TTx]
	// BatchHandler applies the effects of all new messages of a batch in one
	// call; see BatchHandler.
	BatchHandler BatchHandler[TTx]
	// Middleware wraps Handler, the first outermost. Recover is always
	// applied outside of them (and around BatchHandler).
	Middleware []Middleware[TTx]
	// DeadLetter receives messages that cannot be processed. Required: a
	// message must not vanish.
	DeadLetter DeadLetter

	// Key derives the dedup key's ID, and so decides which duplicates are
	// caught (see KeyFunc). Required, unless Offsets is set: ByMessageID
	// catches broker redeliveries only, a business key (ByJSONField,
	// ByHeader, ByRecordKey) also a producer's or a payment channel's
	// re-sends — a choice too important to default. With Offsets, Key is a
	// business key claimed in the key table for the messages the offsets do
	// not already skip (nil: none). ByMessageID beside Offsets repeats what
	// the offsets do, except while an existing consumer switches to them:
	// its old key rows then still catch what it applied past the group's
	// offset (docs/offsets.md, "Switching an existing consumer to offsets").
	Key KeyFunc
	// Offsets, when set, catches broker redeliveries by offset instead of
	// by a key row per message: each batch's transaction moves its
	// partition's next offset forward (one row per partition, a
	// compare-and-set: see dedup.OffsetStore), and a message below it is a
	// duplicate. Usually the Store itself (pgstore.Store is both). For
	// sources that deliver each partition in offset order (OffsetOrdered:
	// Kafka; not RocketMQ, whose failed messages come back through a retry
	// topic — New refuses such a Source) and not with KeyLanes. The broker's own offsets are still committed, for
	// lag tooling, but no longer decide what is a duplicate. Messages carry
	// their partition's log end (Message.LogEnd) so that a stored offset
	// past it (the topic was created again) stops the consumer with
	// dedup.ErrOffsetsAhead instead of skipping the new log's messages.
	// See docs/offsets.md, "Offsets in the store". Default nil: a key row per
	// message.
	Offsets dedup.OffsetStore[TTx]
	// Validate, when set, checks a message before its key is claimed — a
	// signature, a schema. An error is bad input: the message is
	// dead-lettered with it (CauseValidate) and its key is not claimed, so a
	// forgery cannot take the key of the genuine message it imitates. (A
	// handler that verifies a signature itself is too late for that: a
	// forged callback arriving first would claim the key, be recorded as
	// failed, and the genuine one be dead-lettered as failed before.)
	//
	// An error marked with Retryable says the check could not be made — the
	// verifier's certificate or key could not be fetched — not that the
	// message is bad: the lane waits and calls Validate again, on Retry's
	// delays, for as long as it takes (until the consumer stops). Those
	// waits are not the message's failures: neither Retry.MaxAttempts nor
	// Retry.MaxElapsed applies, and nothing is dead-lettered. The messages
	// of the lane ahead of it commit first; those behind it wait.
	Validate func(ctx context.Context, m *Message) error
	// OnMissingKey says what happens when Key finds no key (ErrNoKey);
	// default DeadLetterMissingKey.
	OnMissingKey MissingKeyPolicy
	// Fingerprint says what "the same request" is under one key; default
	// WholePayload. See FingerprintFunc for choosing the fields.
	Fingerprint FingerprintFunc
	// OnDuplicate, when set, is called for every message skipped as a
	// duplicate, after its transaction committed and before it is
	// acknowledged, with when its key was first claimed: for metrics, for
	// answering a request/reply caller, for measuring how old duplicates get
	// (Stats.DuplicateAge counts that too). It must not block for long; the
	// lane waits for it. A panic in it is recovered and logged at ERROR; the
	// duplicate is acknowledged all the same.
	OnDuplicate func(ctx context.Context, d Duplicate)
	// Tenant, when set, derives a tenant that becomes part of the key's scope
	// (Name + "/" + tenant), so equal IDs of two tenants never collide. Take
	// it from a trusted source (topic, a header set by the platform). Like
	// Key and Fingerprint it sees a message as first delivered: a copy
	// (retry copy, redriven letter) is keyed by the identity it carries,
	// and one that carries none is shown as its original (its topic and
	// coordinates, without idem's metadata headers). See docs/keys.md.
	Tenant KeyFunc

	// Entity, when set, names the entity each message is an event of (a
	// trade, a payment intent, an account) and the event's version, so
	// that the events of one entity apply in version order whatever order
	// they arrive in: in each batch's transaction, right after the claim,
	// each new message's version is compared with its entity's watermark
	// (the highest version applied, per key scope and entity; see
	// dedup.Watermarks), and one at or below it is stale — never handed to
	// Handler or BatchHandler, and settled as Stale says. Use it where a
	// re-sent older event (TRADE_SUCCESS after TRADE_CLOSED) is a new
	// message to dedup, with a key of its own, but must not apply.
	//
	// It sees the message as first delivered: a retry copy or a redriven
	// letter carries the entity and version decided then (like its key),
	// and is ordered by them. A zero Entity.Name: the message is of no
	// entity and is not ordered. An error dead-letters the message
	// (CauseBadInput), as a Key error does. Requires a Store that
	// implements dedup.Watermarks[TTx] (New says so otherwise). Default
	// nil: no entity order.
	Entity func(m *Message) (Entity, error)
	// Stale says what happens to a stale event (see Entity): StaleSkip
	// (the default) acknowledges it, counted in Stats.Stale, the store
	// keeping the record (dedup.Watermarks.StaleEvents); StaleDeadLetter
	// dead-letters it with CauseStale, its letter naming the entity, the
	// event's version and the watermark it met. Whatever it says, a stale
	// event whose key has provider steps in the Store's effect journal
	// (dedup.Journal, package effect) that are not failed — an earlier,
	// rolled-back attempt called a provider before a later event of its
	// entity committed — is refused before its commit and dead-lettered
	// with CauseInDoubt, its reason naming the steps: the call's effect is
	// not booked, and an operator resolves it by hand. The steps of a
	// batch's stale events are read in its transaction, in one statement,
	// when the journal is a dedup.TxSteps[TTx] (pgstore, sqlitestore,
	// mysqlstore and memstore are). Another journal is read with Steps,
	// one query for each stale event, on a connection besides the one the
	// batch's transaction holds: its pool needs more connections than
	// there are lanes (partitions × KeyLanes), or lanes that meet stale
	// events at once each hold one and wait for another, for good.
	Stale StalePolicy

	// MaxPayloadBytes dead-letters larger payloads before any parsing, with
	// ErrPayloadTooLarge; default 0: no limit beyond the broker's.
	MaxPayloadBytes int

	// BatchSize is the most messages of one lane in one transaction;
	// default 100, at most 10000.
	BatchSize int
	// BatchWait is how long a lane waits for more messages to fill a batch;
	// default 0: a batch is what has arrived by the time the lane is free.
	BatchWait time.Duration
	// LaneBuffer is how many delivered messages a lane queues before deliver
	// blocks; default 2*BatchSize.
	LaneBuffer int
	// KeyLanes, above 1, spreads each partition's (queue's) messages over
	// that many lanes by record key (Message.Key; FNV-1a, mixed, modulo
	// KeyLanes — independent of a producer's FNV-1a partitioner):
	// messages of one key stay in one lane and in order, messages of other
	// keys commit beside them in their own transactions. For topics with
	// fewer partitions than the store has room for transactions. The
	// broker's offset still moves only past a contiguous run of settled
	// messages (the adapters commit the watermark), so a crash or rebalance
	// redelivers what lies behind the slowest key lane, and the dedup store
	// skips it. Order between keys is not kept; messages without a key all
	// share one key lane. Pick a record key that is the dedup key's
	// partitioning (a business key in the record key): two messages with one
	// dedup key in two key lanes wait for each other's transaction.
	// Default 0 (or 1): one lane per partition; at most 256.
	KeyLanes int

	// Retry bounds the retries of transient failures.
	Retry RetryPolicy
	// OnExhausted says what happens when Retry is used up; default
	// DeadLetterOnExhausted.
	OnExhausted ExhaustedPolicy
	// Retries says whether a failing message holds its lane while it is
	// retried: Blocking (the default; nil is Blocking) or NonBlocking,
	// which after a few attempts in the lane sends it to a retry
	// destination and moves on, at the cost of order. See docs/retries.md.
	Retries Retries
	// PanicsArePermanent dead-letters a message whose handler panicked at
	// once (recording the failure) instead of retrying it; default false:
	// a panic is a failed attempt like a returned error. Either way the
	// panic's stack is logged at ERROR.
	PanicsArePermanent bool

	// DrainTimeout is how long Run drains when its context ends: it stops
	// fetching, finishes the batches in flight and the messages queued, and
	// acknowledges them, then cancels what is left. Default 0: cancelling
	// the context is a hard stop (in-flight transactions roll back, their
	// messages are released, and delivered again later). Set it, and
	// signal.NotifyContext is all a graceful shutdown needs.
	DrainTimeout time.Duration

	// Observer sees the engine's events: consumer/otelconsumer makes
	// OpenTelemetry metrics and traces of them. Default none.
	Observer Observer

	// Logger receives the consumer's logs; default slog.Default().
	Logger *slog.Logger
	// Clock is used for retry delays and the ages of duplicates; default
	// the system clock.
	Clock Clock
}

const maxNameLen = 64

func (c *Config[TTx]) validate() error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf("consumer: Config."+format, args...)) }
	if c.Name == "" {
		add("Name is empty: it scopes the dedup keys")
	} else if len(c.Name) > maxNameLen {
		add("Name is %d bytes, the limit is %d", len(c.Name), maxNameLen)
	} else if err := (dedup.Key{Scope: c.Name, ID: "x"}).Validate(); err != nil {
		add("Name: %v", err)
	} else {
		for _, r := range c.Name {
			if r == '/' {
				add("Name %q contains '/', which separates the tenant in a scope", c.Name)
				break
			}
		}
	}
	if c.Source == nil {
		add("Source is nil")
	} else {
		for _, m := range undeclared(c.Source) {
			add("Source (%T) has the method %s: a Source declares it in its Describe's source.Description, and the consumer does not call the method", c.Source, m)
		}
		for _, scope := range c.Source.Describe().ReadsScopes {
			if scope != c.Name {
				add("Source reads the store's state of scope %q (kafka.StoreOffsets), but Name is %q: pass the consumer's Name", scope, c.Name)
			}
		}
	}
	if c.Key == nil && c.Offsets == nil {
		add("Key is nil: choose how a duplicate is recognised — ByMessageID() (broker redeliveries only), " +
			"ByRecordKey(), ByHeader(name) or ByJSONField(path) (a business key: also producer retries and re-sends), or your own KeyFunc")
	}
	if c.Store == nil {
		add("Store is nil")
	}
	switch {
	case c.Handler == nil && c.BatchHandler == nil:
		add("Handler is nil (set Handler or BatchHandler)")
	case c.Handler != nil && c.BatchHandler != nil:
		add("Handler and BatchHandler are both set; set one")
	case c.BatchHandler != nil && len(c.Middleware) > 0:
		add("Middleware wraps Handler; with BatchHandler, wrap it yourself")
	}
	if c.DeadLetter == nil {
		add("DeadLetter is nil: a message that cannot be processed must go somewhere")
	}
	if c.BatchSize < 0 || c.BatchSize > 10000 {
		add("BatchSize is %d, want 1..10000 (0 for the default 100)", c.BatchSize)
	}
	if c.MaxPayloadBytes < 0 {
		add("MaxPayloadBytes is negative (%d)", c.MaxPayloadBytes)
	}
	if c.BatchWait < 0 {
		add("BatchWait is negative (%v)", c.BatchWait)
	}
	if c.DrainTimeout < 0 {
		add("DrainTimeout is negative (%v)", c.DrainTimeout)
	}
	if c.LaneBuffer < 0 {
		add("LaneBuffer is negative (%d)", c.LaneBuffer)
	}
	if c.Offsets != nil && c.Source != nil {
		if !c.Source.Describe().OffsetOrdered {
			add("Offsets with a Source (%T) that does not deliver each partition in offset order (source.Description.OffsetOrdered): "+
				"a message below the stored offset could still be outstanding and would be skipped; use a key row per message (Key) for this broker", c.Source)
		}
	}
	if c.Offsets != nil && c.KeyLanes > 1 {
		add("KeyLanes is %d with Offsets: a partition's next offset moves in one order, and key lanes commit a partition out of order", c.KeyLanes)
	}
	if c.Offsets != nil && c.Key == nil && c.OnMissingKey == FallBackToMessageID {
		add("OnMissingKey is FallBackToMessageID with Offsets and no Key: there is no key to miss")
	}
	if c.KeyLanes < 0 || c.KeyLanes > 256 {
		add("KeyLanes is %d, want 0..256 (0 or 1: one lane per partition)", c.KeyLanes)
	}
	r := c.Retry
	if r.Initial < 0 || r.Max < 0 || r.MaxElapsed < 0 || r.MaxAttempts < 0 || r.Multiplier < 0 {
		add("Retry has a negative field: %+v", r)
	}
	if r.Multiplier != 0 && r.Multiplier < 1 {
		add("Retry.Multiplier is %v, want >= 1", r.Multiplier)
	}
	if r.Jitter < 0 || r.Jitter > 1 {
		add("Retry.Jitter is %v, want 0..1", r.Jitter)
	}
	if c.OnMissingKey > FallBackToMessageID {
		add("OnMissingKey is %d, not a known policy", c.OnMissingKey)
	}
	if c.OnExhausted > StopLaneOnExhausted {
		add("OnExhausted is %d, not a known policy", c.OnExhausted)
	}
	if c.Entity != nil && c.Store != nil {
		if _, ok := c.Store.(dedup.Watermarks[TTx]); !ok {
			add("Entity is set, but Store (%T) keeps no entity watermarks (it does not implement dedup.Watermarks): use a store that does, such as pgstore, or leave Entity nil", c.Store)
		}
	}
	if c.Stale > StaleDeadLetter {
		add("Stale is %d, not a known policy", c.Stale)
	}
	if c.Stale != StaleSkip && c.Entity == nil {
		add("Stale is set without Entity: no event is ever stale")
	}
	c.validateRetries(add)
	return errors.Join(errs...)
}

func (c *Config[TTx]) setDefaults() {
	if c.Fingerprint == nil {
		c.Fingerprint = WholePayload()
	}
	c.BatchSize = cmp.Or(c.BatchSize, 100)
	c.LaneBuffer = cmp.Or(c.LaneBuffer, 2*c.BatchSize)
	c.Logger = cmp.Or(c.Logger, slog.Default())
	if c.Observer == nil {
		c.Observer = NopObserver{}
	}
	if c.Clock == nil {
		c.Clock = retry.SystemClock{}
	}
	r := &c.Retry
	r.Initial = cmp.Or(r.Initial, 100*time.Millisecond)
	r.Max = cmp.Or(r.Max, 10*time.Second)
	r.Multiplier = cmp.Or(r.Multiplier, 2)
	r.Jitter = cmp.Or(r.Jitter, 0.5)
	r.MaxAttempts = cmp.Or(r.MaxAttempts, 10)
	r.MaxElapsed = cmp.Or(r.MaxElapsed, 2*time.Minute)
}

// undeclared names the methods by which a Source said what it could do
// before source.Description, with the field that replaces each: a source
// written for them would otherwise lose them silently.
func undeclared(s source.Source) []string {
	var out []string
	for _, c := range []struct {
		has  bool
		name string
	}{
		{is[interface{ InOffsetOrder() bool }](s), "InOffsetOrder (Description.OffsetOrdered)"},
		{is[interface{ ProducerChosenIDs() bool }](s), "ProducerChosenIDs (Description.ProducerChosenIDs)"},
		{is[interface{ ReadsScopes() []string }](s), "ReadsScopes (Description.ReadsScopes)"},
		{is[interface{ SourceInfo() SourceInfo }](s), "SourceInfo (Description.System and Group)"},
		{is[interface {
			RetryOf(string) (string, bool)
		}](s), "RetryOf (Description.RetryOf)"},
		{is[interface{ RetryDelays() []time.Duration }](s), "RetryDelays (Description.RetryDelays)"},
		{is[interface{ Assigned(*Message) bool }](s), "Assigned (Description.Assigned)"},
		{is[interface{ Lanes() []source.LaneStatus }](s), "Lanes (Description.Lanes)"},
		{is[interface{ Unwrap() source.Source }](s), "Unwrap (forward Describe instead)"},
	} {
		if c.has {
			out = append(out, c.name)
		}
	}
	return out
}

func is[T any](v any) bool { _, ok := v.(T); return ok }
