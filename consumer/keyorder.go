package consumer

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/idemkit/idem/consumer/source"
	"github.com/idemkit/idem/consumer/wire"
	"github.com/idemkit/idem/dedup"
)

// Key order under NonBlocking (NonBlocking.KeyOrdered): while a record key
// has a message in retry, the later messages of that key follow it there
// instead of overtaking it. See docs/retries.md.
//
// The key is parked (dedup.Parking): for each record key (scoped by its
// messages' key scope and the original's topic), the messages of the key
// in retry, in the order they went there. Only the first, the head, is
// tried; the others go back to retry untried, to the retry destination
// the head was last sent to (where they land behind it), until they are
// the head. The consumer
//
//   - checks a batch's messages in one call before it tries them
//     (checkParked): a follower goes to retry, a message of a key that
//     outlived NonBlocking's MaxParkedDepth or MaxParkedWait is
//     dead-lettered (CauseParkedTooLong);
//   - parks a message before its retry copy is written (retryLater);
//   - unparks a message once it is settled for good — applied, a
//     duplicate, stale, dead-lettered — and before its offset is
//     acknowledged (unpark).
//
// A Store that is a dedup.Parking keeps the parked keys, so that a
// restart, a deploy or a rebalance does not forget them. Any other store
// leaves them to the consumer's memory (memParking), where a restart
// forgets them.

// parking is where KeyOrdered parks its keys: the Store when it is a
// dedup.Parking, else the consumer's memory (memParking).
type parking interface {
	CheckParked(ctx context.Context, refs []dedup.ParkRef, limits dedup.ParkLimits, now time.Time, out []dedup.ParkDecision) error
	Park(ctx context.Context, ref dedup.ParkRef, delay time.Duration, now time.Time) error
	Unpark(ctx context.Context, ref dedup.ParkRef, now time.Time) error
	ParkStats(ctx context.Context) (dedup.ParkStats, error)
}

// parkingOf returns where a KeyOrdered NonBlocking parks its keys, else
// nil.
func parkingOf(nb *NonBlocking, store any) parking {
	if nb == nil || !nb.KeyOrdered {
		return nil
	}
	if p, ok := store.(dedup.Parking); ok {
		return p
	}
	return &memParking{keys: map[dedup.ParkKey]*heldKey{}, max: slices.Max(nb.Delays)}
}

// parkLimitsOf returns nb's bounds of a parked key (zero for nil).
func parkLimitsOf(nb *NonBlocking) dedup.ParkLimits {
	if nb == nil {
		return dedup.ParkLimits{}
	}
	return dedup.ParkLimits{Depth: nb.MaxParkedDepth, Wait: nb.MaxParkedWait}
}

// maxParkedKeyLen is the longest record key parked as it is; a longer one
// is parked by its SHA-256 (dedup.ParkRef.Validate).
const maxParkedKeyLen = 1000

// heldKeyOf returns the record key m is ordered by, scoped by its
// original's topic, and the original's identity: its lane and offset —
// the lane names the broker on RocketMQ (topic/broker/queueId), where two
// brokers each have a queue of one number, and so two messages of one key
// may share a topic, queue ID and offset — or its topic, partition and
// offset when the lane is not known. False when m has no record key (it
// is not ordered).
func heldKeyOf(m *Message) (topic, key, id string, ok bool) {
	if len(m.Key) == 0 {
		return "", "", "", false
	}
	o, ok := m.Origin()
	if !ok {
		o = source.Origin{Topic: m.Topic, Partition: m.Partition, Offset: m.Offset, Lane: m.Lane}
	}
	key = string(m.Key)
	if len(key) > maxParkedKeyLen {
		sum := sha256.Sum256(m.Key)
		key = "sha256:" + hex.EncodeToString(sum[:])
	}
	return o.Topic, key, o.HeldLane() + "/" + strconv.FormatInt(o.Offset, 10), true
}

// parkRefOf names it in its key's parking: the key scope its dedup key was
// given at first delivery (a copy's is the one it carries, never one
// derived from a retry topic), its original's topic and record key, and
// its original's identity. False when it is not ordered: no record key,
// no dedup key derived (bad input, dead-lettered in its place), or no
// topic.
func parkRefOf(it *item) (dedup.ParkRef, bool) {
	topic, key, id, ok := heldKeyOf(it.msg)
	if !ok || it.claim.Key.Scope == "" {
		return dedup.ParkRef{}, false
	}
	ref := dedup.ParkRef{ParkKey: dedup.ParkKey{Scope: it.claim.Key.Scope, Topic: topic, Key: key}, ID: id}
	if ref.Validate() != nil {
		return dedup.ParkRef{}, false
	}
	return ref, true
}

// checkParked checks its against the parked keys in one call (KeyOrdered)
// and returns the items to try: a follower goes to retry behind its key's
// head, untried (sendFollower), and a message of a key that outlived its
// limits is dead-lettered (CauseParkedTooLong), in their order.
func (s *settler[TTx]) checkParked(ctx context.Context, its []*item) ([]*item, error) {
	c := s.c
	refs, at := s.parkRefs[:0], s.parkAt[:0]
	for i, it := range its {
		if ref, ok := parkRefOf(it); ok {
			refs, at = append(refs, ref), append(at, i)
		}
	}
	s.parkRefs, s.parkAt = refs, at
	if len(refs) == 0 {
		return its, nil
	}
	if cap(s.parkOut) < len(refs) {
		s.parkOut = make([]dedup.ParkDecision, len(refs))
	}
	out := s.parkOut[:len(refs)]
	err := c.untilDone(ctx, s.l, "check the parked keys", func() error {
		clear(out)
		return c.parking.CheckParked(ctx, refs, c.parkLimits, c.cfg.Clock.Now(), out)
	}, func(err error) (error, bool) {
		// The parking tables are gone (an old dump restored, a migration
		// undone): no retry mends that. Stop, as Run refuses to start on
		// such a schema, the batch released unsettled.
		if errors.Is(err, dedup.ErrNotMigrated) {
			return c.fatal(s.l, fmt.Errorf("check the parked keys: %w", err)), true
		}
		return nil, false
	})
	if err != nil {
		return nil, err
	}
	decided := false
	for j, i := range at {
		it, d := its[i], out[j]
		it.unlisted = d.Action == dedup.ParkTry && !d.Head // of this check: a follower is in the list
		switch d.Action {
		case dedup.ParkTry:
			continue
		case dedup.ParkFollow:
			err = c.sendFollower(ctx, it, d.Delay)
		case dedup.ParkExpired:
			err = c.deadLetter(ctx, it, fmt.Errorf("%w (MaxParkedDepth %d, MaxParkedWait %v)",
				ErrParkedTooLong, c.parkLimits.Depth, c.parkLimits.Wait), CauseParkedTooLong)
		default:
			err = fmt.Errorf("%w: CheckParked decided %v for %s", dedup.ErrContract, d.Action, refs[j].ID)
		}
		if err != nil {
			return nil, err
		}
		decided = true
	}
	if !decided {
		return its, nil
	}
	kept := its[:0:0]
	for _, it := range its {
		if !it.settled {
			kept = append(kept, it)
		}
	}
	return kept, nil
}

// ErrParkedTooLong is what the Reason of a letter with cause
// CauseParkedTooLong wraps: its record key was parked (KeyOrdered) longer
// than NonBlocking.MaxParkedWait, or deeper than MaxParkedDepth.
var ErrParkedTooLong = errors.New("its record key outlived the limits of a parked key (KeyOrdered)")

// park parks it, on its way to retry with delay (KeyOrdered), before its
// copy is written: a later message of its key follows it from now. A
// failing Park is retried until it succeeds or ctx ends.
func (c *Consumer[TTx]) park(ctx context.Context, it *item, delay time.Duration) error {
	ref, ok := parkRefOf(it)
	if !ok {
		return nil
	}
	it.unlisted = false // in its key's list from the call on, whatever it returns
	return c.untilDone(ctx, nil, "park a record key", func() error {
		return c.parking.Park(ctx, ref, delay, c.cfg.Clock.Now())
	}, nil)
}

// unpark removes it, settled for good, from its key's parking
// (KeyOrdered): the key's next message is tried once it comes back. An
// item CheckParked found in no list (it.unlisted) is not unparked: the
// consumer's keyed messages are in no list but while their key is parked,
// and a store transaction for each of them would cost more than the
// claim. It is called before it.settled is set, so that its offset is
// acknowledged only once the key let it go: a failing Unpark is retried
// with the consumer's backoff until it succeeds or ctx ends, when it is
// released for a redelivery to settle (a duplicate) and unpark again.
func (c *Consumer[TTx]) unpark(ctx context.Context, it *item) error {
	if c.parking == nil {
		return nil
	}
	if it.unlisted {
		return nil
	}
	ref, ok := parkRefOf(it)
	if !ok {
		return nil
	}
	return c.untilDone(ctx, nil, "unpark a record key", func() error {
		return c.parking.Unpark(ctx, ref, c.cfg.Clock.Now())
	}, nil)
}

// sendFollower writes it to the retry destination of delay untried
// (wire.MetaRetryFollowing): its next trip stays the one it was to be on, so
// following spends none of its trips. CheckParked put it in its key's parking.
func (c *Consumer[TTx]) sendFollower(ctx context.Context, it *item, delay time.Duration) error {
	done, first := c.retryAttempt(it.msg)
	now := c.cfg.Clock.Now()
	if first.IsZero() {
		first = now
	}
	reason := errFollowing
	r := RetryLetter{
		Letter: Letter{Message: it.msg, Key: it.claim.Key, Fingerprint: it.claim.Fingerprint, Cause: CauseExhausted, Reason: reason, Attempts: it.attempts, Entity: it.entity},
		Retry:  wire.Retry{Attempt: done + 1, Delay: delay, Due: now.Add(delay), FirstFailure: first, Following: true},
	}
	tooLarge, err := c.writeRetry(ctx, r)
	if err != nil {
		return err
	}
	if tooLarge != nil {
		return c.fail(ctx, it, fmt.Errorf("%w; it followed its key to retry: %w", tooLarge, reason), false)
	}
	c.stats.retriedLater.Add(1)
	c.settled(ctx, Settlement{Message: it.msg, Key: it.claim.Key, Outcome: OutcomeRetryLater, Reason: reason, Attempts: it.attempts, RetryDelay: delay})
	it.settled = true
	c.cfg.Logger.Debug("idem: message follows its key to retry", append(refAttrs(it.msg, it.claim.Key), slog.Duration("delay", delay))...)
	return nil
}

// errFollowing is the reason of a message that followed its key to retry.
var errFollowing = errors.New("a message of its key is in retry (KeyOrdered)")

// parkStatsEvery is how often Health reads the parked keys' ParkStats at
// most: a scrape every second must not query the store every second.
const parkStatsEvery = 5 * time.Second

// parkStats caches the parked keys' ParkStats for Health.
type parkStats struct {
	mu   sync.Mutex
	at   time.Time // when stats were read; zero: never
	last dedup.ParkStats
	err  error
}

// parkedStats returns the parked keys' ParkStats, read from the parking at
// most every parkStatsEvery.
func (c *Consumer[TTx]) parkedStats(ctx context.Context) (dedup.ParkStats, error) {
	p := &c.parkStats
	p.mu.Lock()
	defer p.mu.Unlock()
	now := c.cfg.Clock.Now()
	if !p.at.IsZero() && now.Sub(p.at) < parkStatsEvery && now.After(p.at) {
		return p.last, p.err
	}
	p.last, p.err = c.parking.ParkStats(ctx)
	p.at = now
	return p.last, p.err
}

// memParking keeps the parked keys in the consumer's memory, for a Store
// that is no dedup.Parking. A restart forgets the keys: the copies then
// come back and are tried as unordered ones, and a later message of their
// key can overtake them. So does a rebalance that gives the head's retry
// partition to another member: the key is let go once its head has not
// come back for twice its delay and a minute (holdFor), so that its
// followers do not wait for ever. It keeps no ParkLimits.
type memParking struct {
	mu   sync.Mutex
	keys map[dedup.ParkKey]*heldKey
	max  time.Duration // the longest of NonBlocking.Delays
}

// heldKey is one record key in retry.
type heldKey struct {
	ids      []string      // the messages in retry, the head first (heldKeyOf's id)
	dest     time.Duration // the delay the head was last sent with
	parkedAt time.Time
	// expires: past it the head is taken for lost to this consumer (its
	// retry partition went to another member, or it was never written)
	// and the key is let go: its next message is tried.
	expires time.Time
}

// holdFor is how long a key stays held after its head went to retry with
// delay d without being seen again: twice the delay and a minute, room for
// a retry partition's lag.
func holdFor(d time.Duration) time.Duration { return 2*d + time.Minute }

// Park records that ref went to retry with delay: its key is held, ref at
// the tail of the key's messages (or where it was), and the delay is the
// head's destination when it is the head.
func (h *memParking) Park(_ context.Context, ref dedup.ParkRef, delay time.Duration, now time.Time) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	hk := h.keys[ref.ParkKey]
	if hk == nil {
		hk = &heldKey{parkedAt: now}
		h.keys[ref.ParkKey] = hk
	}
	if !slices.Contains(hk.ids, ref.ID) {
		hk.ids = append(hk.ids, ref.ID)
	}
	if hk.ids[0] == ref.ID {
		hk.dest, hk.expires = delay, now.Add(holdFor(delay))
	}
	return nil
}

// Unpark releases ref: when it was the head, the next message of the key
// is tried when it comes back.
func (h *memParking) Unpark(_ context.Context, ref dedup.ParkRef, now time.Time) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	hk := h.keys[ref.ParkKey]
	if hk == nil {
		return nil
	}
	i := slices.Index(hk.ids, ref.ID)
	if i < 0 {
		return nil
	}
	hk.ids = slices.Delete(hk.ids, i, i+1)
	switch {
	case len(hk.ids) == 0:
		delete(h.keys, ref.ParkKey)
	case i == 0:
		// A new head, somewhere on the retry destinations: it is given
		// the longest delay to come back in.
		hk.expires = now.Add(holdFor(h.max))
	}
	return nil
}

// CheckParked decides whether each ref must follow its key into retry: its key
// has a message in retry other than it at the head. It is then added
// behind the key's messages. A key whose head has not come back within
// holdFor its delay is let go. limits are not kept.
func (h *memParking) CheckParked(_ context.Context, refs []dedup.ParkRef, _ dedup.ParkLimits, now time.Time, out []dedup.ParkDecision) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	for i, ref := range refs {
		out[i] = dedup.ParkDecision{}
		hk := h.keys[ref.ParkKey]
		if hk != nil && now.After(hk.expires) {
			delete(h.keys, ref.ParkKey) // the head is lost to this consumer: the order of the key with it
			hk = nil
		}
		if hk == nil || len(hk.ids) == 0 {
			continue
		}
		if hk.ids[0] == ref.ID {
			out[i].Head = true
			continue
		}
		if !slices.Contains(hk.ids, ref.ID) {
			hk.ids = append(hk.ids, ref.ID)
		}
		out[i] = dedup.ParkDecision{Action: dedup.ParkFollow, Delay: hk.dest}
	}
	return nil
}

// ParkStats counts the keys held and finds the oldest.
func (h *memParking) ParkStats(context.Context) (dedup.ParkStats, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	var s dedup.ParkStats
	for _, hk := range h.keys {
		s.Keys++
		if s.Oldest.IsZero() || hk.parkedAt.Before(s.Oldest) {
			s.Oldest = hk.parkedAt
		}
	}
	return s, nil
}
