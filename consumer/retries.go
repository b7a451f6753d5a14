package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/idem/consumer/source"
	"github.com/idemkit/idem/consumer/wire"
)

// Retries says what a transient failure does to the lane of its message:
// Blocking (the default) or NonBlocking. See docs/retries.md.
type Retries interface{ retries() }

// Blocking (the default, also a nil Config.Retries) retries a failing
// message in its lane, on Config.Retry's delays, for up to its bounds (10
// attempts, 2 minutes), and then applies Config.OnExhausted. Nothing of
// the message's partition or queue behind it is processed meanwhile: order
// is kept, progress is not.
type Blocking struct{}

// NonBlocking retries a failing message in its lane a few times
// (Attempts), then writes it to Sink, a retry destination, and moves on:
// the messages behind it are processed at once. The copy comes back after
// Delays[0] (the Source delivers it once it is due), is tried Attempts
// times again, goes to the retry destination of Delays[1], and so on; past
// the last delay it is dead-lettered (CauseExhausted).
//
// A copy carries its original's identity (the wire.Meta*Original* lineage
// headers, as a redriven letter does): its dedup key is its original's,
// so a copy of a message that was in fact applied — its COMMIT's outcome
// was unknown — is skipped as a duplicate, never applied twice.
//
// What is lost is order: a later message of the same key can overtake a
// retried one. Choose NonBlocking when messages are independent (payments
// of many orders) and a stalled partition costs more than a reordering.
//
// With Config.Offsets alone (no Key) New refuses NonBlocking: the copy is
// claimed in the key table under its original's identity, but an original
// applied through the offsets leaves no row there, so an original
// redelivered after a crash, and applied, would not stop its copy. With a
// Key (ByMessageID, a business key) beside Offsets it works. New refuses
// it with StopLaneOnExhausted too.
type NonBlocking struct {
	// Attempts is how many times the message is tried in its lane (the
	// first included) before it goes to the retry destination, each time
	// it comes back too; default 3, at most 10. Config.Retry's delays
	// space them.
	Attempts int
	// Delays are the waits of the retry destinations, one per trip:
	// Delays[k] is the wait before the k+1-th return. Required, each
	// positive, whole milliseconds, at most 32 of them.
	Delays []time.Duration
	// Sink writes a copy to the retry destination of its delay. Required;
	// kafka.Source and rocketmq.Source are.
	Sink RetrySink
	// KeyOrdered keeps the order of a record key's messages: while a
	// message of a key is in retry, the key is parked, and the later
	// messages of that key follow it into retry, untried, instead of
	// overtaking it, and are tried once the ones before them are settled.
	// When Config.Store is a dedup.Parking (pgstore, sqlitestore,
	// mysqlstore, memstore) the store keeps the parked keys: a restart, a
	// deploy or a rebalance does not forget them, and every member of the
	// group sees them. Any other store leaves them to the consumer's
	// memory: a restart or a rebalance forgets them, and then a later
	// message can overtake after all; so can messages whose retry
	// partitions another member of the group reads. Messages without a
	// record key are not ordered. See docs/retries.md.
	KeyOrdered bool
	// MaxParkedDepth is the most messages a parked key holds, the one in
	// retry included (KeyOrdered, with a Store that is a dedup.Parking):
	// the message that would make it deeper, and every message of the key
	// after it until the key is released, the parked ones included, is
	// dead-lettered with CauseParkedTooLong. Default 1000, at most
	// 1,000,000.
	MaxParkedDepth int
	// MaxParkedWait is the longest the message at the head of a parked
	// key holds it (KeyOrdered, with a Store that is a dedup.Parking), from
	// when it became the head; past it, the key's messages are
	// dead-lettered with CauseParkedTooLong as they come, the head's
	// included, and once the head has held the key for twice
	// MaxParkedWait the key is released (see dedup.Parking). Default twice
	// the sum of Delays plus RetryMargin: a head that comes back on time
	// settles within the sum of the delays (its last trip ends it), twice
	// that leaves room for the retry topics' lag, and RetryMargin for
	// the time no consumer runs — the wait is measured on the consumer's
	// clock, a deploy or an outage included — as the store's retention
	// leaves it for a copy that comes back late (RetryHorizon). A head
	// past it is taken for lost (its copy never written, or deleted by the
	// retry topic's retention). At least the sum of Delays; a wait shorter
	// than the default can dead-letter a head that waited out an outage.
	MaxParkedWait time.Duration
}

func (Blocking) retries()    {}
func (NonBlocking) retries() {}

// RetrySink writes a message to the retry destination of its delay. Like
// DeadLetter, it returns only once the copy is durable: the consumer
// acknowledges the original only then, and retries a failing Retry with
// backoff until it succeeds or the consumer stops. It may be called more
// than once for one message (at-least-once): the copies share one key.
type RetrySink interface {
	Retry(ctx context.Context, r RetryLetter) error
}

// RetryLetter is a message on its way to a retry destination. An adapter
// writes it as wire.Letter(r.Letter).RetryRecord(r.Retry).
type RetryLetter struct {
	// Letter is the message, its key and the failure it is retried for
	// (Cause is CauseExhausted: its in-lane attempts ran out).
	Letter
	// Retry is the trip: Attempt, from 1; Delay, the wait of the
	// destination, NonBlocking.Delays[Attempt-1]; Due, when the copy is to
	// be processed; FirstFailure, when the message first went to retry;
	// Following, the message was not tried, it follows a message of its
	// record key that is in retry (NonBlocking.KeyOrdered) — Attempt is
	// then the trip it will be on once tried: following spends none of
	// its trips.
	wire.Retry
}

const (
	maxNonBlockingAttempts = 10
	maxRetryDelays         = 32
	maxParkedDepth         = 1_000_000
	defaultParkedDepth     = 1000
)

// sumOf is the sum of delays.
func sumOf(delays []time.Duration) time.Duration {
	var sum time.Duration
	for _, d := range delays {
		sum += d
	}
	return sum
}

// validateRetries checks Config.Retries.
func (c *Config[TTx]) validateRetries(add func(format string, args ...any)) {
	switch r := c.Retries.(type) {
	case nil, Blocking, *Blocking:
	case NonBlocking:
		r.validate(c, add)
	case *NonBlocking:
		if r == nil {
			add("Retries is a nil *NonBlocking")
			return
		}
		r.validate(c, add)
	default:
		add("Retries is %T, want Blocking or NonBlocking", r)
	}
}

func (nb NonBlocking) validate(c interface{ nonBlockingConflicts(NonBlocking) []string }, add func(format string, args ...any)) {
	if nb.Sink == nil {
		add("Retries.Sink is nil: a message going to retry must be written somewhere")
	}
	if nb.Attempts < 0 || nb.Attempts > maxNonBlockingAttempts {
		add("Retries.Attempts is %d, want 0..%d (0 for the default 3)", nb.Attempts, maxNonBlockingAttempts)
	}
	if len(nb.Delays) == 0 || len(nb.Delays) > maxRetryDelays {
		add("Retries.Delays has %d delays, want 1..%d", len(nb.Delays), maxRetryDelays)
	}
	for i, d := range nb.Delays {
		if d <= 0 || d%time.Millisecond != 0 {
			add("Retries.Delays[%d] is %v, want a positive number of whole milliseconds", i, d)
		}
	}
	if src, ok := nb.Sink.(source.Source); ok && src.Describe().RetryDelays != nil {
		have := src.Describe().RetryDelays
		for i, d := range nb.Delays {
			if !slices.Contains(have, d) {
				add("Retries.Delays[%d] is %v, but the Sink (%T) has retry destinations for %v only", i, d, nb.Sink, have)
			}
		}
	}
	if nb.MaxParkedDepth < 0 || nb.MaxParkedDepth > maxParkedDepth {
		add("Retries.MaxParkedDepth is %d, want 0..%d (0 for the default %d)", nb.MaxParkedDepth, maxParkedDepth, defaultParkedDepth)
	}
	if sum := sumOf(nb.Delays); nb.MaxParkedWait < 0 || (nb.MaxParkedWait > 0 && nb.MaxParkedWait < sum) {
		add("Retries.MaxParkedWait is %v, want 0 (the default, twice the sum of Delays plus RetryMargin) or at least the sum of Delays, %v: "+
			"a head still on its retry trips would be dead-lettered", nb.MaxParkedWait, sum)
	}
	for _, msg := range c.nonBlockingConflicts(nb) {
		add("%s", msg)
	}
}

func (c *Config[TTx]) nonBlockingConflicts(nb NonBlocking) []string {
	var out []string
	out = append(out, c.retentionConflicts(nb)...)
	if c.Offsets != nil && c.Key == nil {
		out = append(out, "Retries is NonBlocking with Offsets and no Key: a retry copy is deduplicated by a key row, "+
			"which an original applied through the offsets does not leave; set Key (ByMessageID() will do)")
	}
	if nb.KeyOrdered && c.Source != nil {
		if d := c.Source.Describe(); !d.OffsetOrdered && !d.LaneOrdered {
			msg := fmt.Sprintf("Retries.KeyOrdered with a Source (%T) that does not deliver each lane's messages in order "+
				"(source.Description.LaneOrdered): a key's later message could be tried before its earlier one fails and parks the key", c.Source)
			if d.System == "rocketmq" {
				msg += "; set rocketmq.Config.Orderly (concurrent mode does not keep a queue's order)"
			}
			out = append(out, msg)
		}
	}
	if c.OnExhausted == StopLaneOnExhausted {
		out = append(out, "Retries is NonBlocking with OnExhausted StopLaneOnExhausted: a lane that must stop rather than "+
			"pass a message cannot let it go to retry either")
	}
	return out
}

// RetryMargin is what RetryHorizon adds to the sum of the delays: the time
// a copy may wait beyond its delay — behind other copies of its retry
// partition, through a deploy or a rebalance — and its attempts take.
const RetryMargin = 15 * time.Minute

// RetryHorizon is how long after its first failure a message may still
// come back from retry with delays: the sum of the delays plus
// RetryMargin. Its original's key must outlive it: a copy that comes back
// after the key row of its applied original was purged is applied again.
func RetryHorizon(delays []time.Duration) time.Duration {
	return RetryMargin + sumOf(delays)
}

// retentionConflicts names each scope of the consumer's (Name, Name/tenant)
// whose keys the store keeps (dedup.Store.Retention) for less than nb's
// horizon.
func (c *Config[TTx]) retentionConflicts(nb NonBlocking) []string {
	if len(nb.Delays) == 0 {
		return nil
	}
	horizon := RetryHorizon(nb.Delays)
	def, perScope := c.Store.Retention()
	var out []string
	check := func(what string, d time.Duration) {
		if d > 0 && d < horizon {
			out = append(out, fmt.Sprintf("Retries is NonBlocking with delays %v, a horizon of %v (their sum plus %v), "+
				"but the store keeps the keys of %s for %v: a copy of an applied message that comes back after its key was purged "+
				"is applied again; keep keys longer or shorten the delays", nb.Delays, horizon, RetryMargin, what, d))
		}
	}
	if c.Tenant == nil {
		own, ok := perScope[c.Name]
		if !ok {
			own = def
		}
		check("scope "+strconv.Quote(c.Name), own)
		return out
	}
	check("scope "+strconv.Quote(c.Name+"/<tenant>")+" (Retention)", def)
	for _, scope := range slices.Sorted(maps.Keys(perScope)) {
		if strings.HasPrefix(scope, c.Name+"/") {
			check("scope "+strconv.Quote(scope), perScope[scope])
		}
	}
	return out
}

// ErrRetryExpired is what the Reason of a retry copy's dead letter wraps
// when the copy came back later after its first failure than the store
// keeps its key (dedup.Store.Retention): its original's key row may have been
// purged, so an applied original would not stop it. It is dead-lettered
// (CauseExhausted) for an operator to decide, never applied blind.
var ErrRetryExpired = errors.New("the retry copy came back after the store's retention of its key")

// pastRetention returns an error wrapping ErrRetryExpired when it is a
// retry copy whose first failure (MetaRetryFirstFailure) is older than the
// store keeps the keys of its scope. New checks that the retries' horizon
// fits in the retention, but a copy may come back later: retry topics
// start at their first unread record, after a long stop or lost offsets.
func (c *Consumer[TTx]) pastRetention(it *item) error {
	trip, first := c.retryAttempt(it.msg)
	if trip == 0 || first.IsZero() {
		return nil
	}
	keep, perScope := c.cfg.Store.Retention()
	if d, ok := perScope[it.claim.Key.Scope]; ok {
		keep = d
	}
	now := c.cfg.Clock.Now()
	if keep <= 0 || now.Sub(first) <= keep {
		return nil
	}
	return fmt.Errorf("%w: it first failed at %s and came back at %s, %v later; the store keeps the keys of scope %q for %v",
		ErrRetryExpired, first.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339), now.Sub(first).Round(time.Second), it.claim.Key.Scope, keep)
}

// nonBlocking returns Config.Retries when it is NonBlocking, defaults set.
func nonBlockingOf(r Retries) *NonBlocking {
	var nb NonBlocking
	switch r := r.(type) {
	case NonBlocking:
		nb = r
	case *NonBlocking:
		nb = *r
	default:
		return nil
	}
	if nb.Attempts == 0 {
		nb.Attempts = 3
	}
	if nb.MaxParkedDepth == 0 {
		nb.MaxParkedDepth = defaultParkedDepth
	}
	if nb.MaxParkedWait == 0 {
		nb.MaxParkedWait = 2*sumOf(nb.Delays) + RetryMargin
	}
	nb.Delays = slices.Clone(nb.Delays)
	return &nb
}

// retryAttempt is the trip a retry copy is on (0: the message has not been
// to retry), read from its headers when it lies on a retry topic — its
// lineage honoured or not: a copy keyed as a message of its own still runs
// out of trips.
func (c *Consumer[TTx]) retryAttempt(m *Message) (int, time.Time) {
	o, ok := m.Origin()
	onRetryTopic := ok && o.Retry
	if !onRetryTopic && c.desc.RetryOf != nil {
		_, onRetryTopic = c.desc.RetryOf(m.Topic)
	}
	if !onRetryTopic {
		return 0, time.Time{}
	}
	v, _ := m.Header(wire.MetaRetryAttempt)
	n, err := strconv.Atoi(string(v))
	if err != nil || n < 1 {
		return 0, time.Time{}
	}
	if f, ok := m.Header(wire.MetaRetryFollowing); ok && string(f) == "true" {
		n-- // untried: the trip it is on is still to come
	}
	var first time.Time
	if f, ok := m.Header(wire.MetaRetryFirstFailure); ok {
		first, _ = time.Parse(time.RFC3339Nano, string(f))
	}
	return n, first
}

// retryLater settles an item whose in-lane attempts ran out (NonBlocking):
// it goes to the retry destination of its next delay, or, past the last
// one, to the dead-letter sink (CauseExhausted).
func (c *Consumer[TTx]) retryLater(ctx context.Context, it *item, reason error) error {
	nb := c.nonBlocking
	done, first := c.retryAttempt(it.msg)
	if done >= len(nb.Delays) {
		return c.fail(ctx, it, fmt.Errorf("after %d trips to retry: %w", done, reason), false)
	}
	now := c.cfg.Clock.Now()
	if first.IsZero() {
		first = now
	}
	delay := nb.Delays[done]
	if c.parking != nil {
		if err := c.park(ctx, it, delay); err != nil { // before the write: a later message of the key follows it from now
			return err
		}
	}
	r := RetryLetter{
		Letter: Letter{Message: it.msg, Key: it.claim.Key, Fingerprint: it.claim.Fingerprint, Cause: CauseExhausted, Reason: reason, Attempts: it.attempts, Entity: it.entity},
		Retry:  wire.Retry{Attempt: done + 1, Delay: delay, Due: now.Add(delay), FirstFailure: first},
	}
	tooLarge, err := c.writeRetry(ctx, r)
	if err != nil {
		return err
	}
	if tooLarge != nil {
		return c.fail(ctx, it, fmt.Errorf("%w; it went to retry after: %w", tooLarge, reason), false)
	}
	c.stats.retriedLater.Add(1)
	c.settled(ctx, Settlement{Message: it.msg, Key: it.claim.Key, Outcome: OutcomeRetryLater, Reason: reason, Attempts: it.attempts, RetryDelay: delay})
	it.settled = true
	c.cfg.Logger.Info("idem: message sent to retry", append(refAttrs(it.msg, it.claim.Key),
		slog.Int("trip", r.Attempt), slog.Duration("delay", delay), slog.Int("attempts", it.attempts), slog.String("reason", reason.Error()))...)
	return nil
}

// ErrRetryTooLarge is what a RetrySink's error wraps when the broker (or
// its client) refuses a copy for its size, which no retry of the write can
// change. The consumer then dead-letters the message (CauseExhausted, its
// Reason wrapping the sink's error) instead of retrying the write for
// ever: a dead letter leaves out a value past the adapter's limit, so it
// fits where the copy did not.
var ErrRetryTooLarge = errors.New("the retry copy is too large for the broker")

// writeRetry writes r to the retry sink, retrying a failed write until it
// succeeds or ctx ends (err), except one the sink says is too large
// (ErrRetryTooLarge), which it returns as tooLarge.
func (c *Consumer[TTx]) writeRetry(ctx context.Context, r RetryLetter) (tooLarge, err error) {
	err = c.untilDone(ctx, nil, "retry sink", func() error { return c.nonBlocking.Sink.Retry(ctx, r) }, func(err error) (error, bool) {
		if errors.Is(err, ErrRetryTooLarge) {
			tooLarge = err
			return nil, true
		}
		return nil, false
	})
	return tooLarge, err
}

// returnedFrom is the wait of the retry trip m came back from (its
// wire.MetaRetryDelay; for a copy written before that header, the delay of its
// trip's number), or 0 when m is not a retry copy.
func (c *Consumer[TTx]) returnedFrom(m *Message) time.Duration {
	if c.desc.RetryOf == nil {
		return 0
	}
	o, ok := m.Origin()
	onRetryTopic := ok && o.Retry
	if !onRetryTopic {
		_, onRetryTopic = c.desc.RetryOf(m.Topic)
	}
	if !onRetryTopic {
		return 0
	}
	if v, ok := m.Header(wire.MetaRetryDelay); ok {
		if d, err := time.ParseDuration(string(v)); err == nil && d > 0 {
			return d
		}
	}
	v, _ := m.Header(wire.MetaRetryAttempt)
	n, err := strconv.Atoi(string(v))
	if nb := c.nonBlocking; err == nil && nb != nil && n >= 1 && n <= len(nb.Delays) {
		return nb.Delays[n-1]
	}
	return 0
}

// settled tells the Observer that a message is settled, with the trip it
// came back from when it is a retry copy (Settlement.ReturnedFrom).
func (c *Consumer[TTx]) settled(ctx context.Context, s Settlement) {
	s.ReturnedFrom = c.returnedFrom(s.Message)
	c.cfg.Observer.Settled(ctx, s)
}
