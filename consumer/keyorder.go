package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/idemkit/idem/consumer/source"
	"github.com/idemkit/idem/consumer/wire"
)

// Key order under NonBlocking (NonBlocking.KeyOrdered): while a record key
// has a message in retry, the later messages of that key follow it there
// instead of overtaking it. See docs/retries.md.
//
// The keys in retry are held in memory, per consumer: for each record key
// (scoped by the original's topic), the messages of the key in retry, in
// the order they went there. Only the first, the head, is tried; the
// others go back to retry untried, to the retry destination the head was
// last sent to (where they land behind it), until they are the head. A
// restart forgets the keys: the copies then come back and are tried as
// unordered ones, and a later message of their key can overtake them. So
// does a rebalance that gives the head's retry partition to another
// member: the key is let go once its head has not come back for twice its
// delay and a minute (holdFor), so that its followers do not wait for ever.

// heldKey is one record key in retry.
type heldKey struct {
	ids  []string      // the messages in retry, the head first (heldKeyOf's id)
	dest time.Duration // the delay the head was last sent with
	// expires: past it the head is taken for lost to this consumer (its
	// retry partition went to another member, or it was never written)
	// and the key is let go: its next message is tried.
	expires time.Time
}

// holdFor is how long a key stays held after its head went to retry with
// delay d without being seen again: twice the delay and a minute, room for
// a retry partition's lag.
func holdFor(d time.Duration) time.Duration { return 2*d + time.Minute }

// holds is the consumer's keys in retry (KeyOrdered).
type holds struct {
	mu   sync.Mutex
	keys map[string]*heldKey
	max  time.Duration // the longest of NonBlocking.Delays
}

// holdsOf returns the holds of a KeyOrdered NonBlocking, else nil.
func holdsOf(nb *NonBlocking) *holds {
	if nb == nil || !nb.KeyOrdered {
		return nil
	}
	return &holds{keys: map[string]*heldKey{}, max: slices.Max(nb.Delays)}
}

// heldKeyOf returns the record key m is ordered by, scoped by its
// original's topic, and the original's identity: its lane and offset —
// the lane names the broker on RocketMQ (topic/broker/queueId), where two
// brokers each have a queue of one number, and so two messages of one key
// may share a topic, queue ID and offset — or its topic, partition and
// offset when the lane is not known. False when m has no record key (it
// is not ordered).
func heldKeyOf(m *Message) (key, id string, ok bool) {
	if len(m.Key) == 0 {
		return "", "", false
	}
	o, ok := m.Origin()
	if !ok {
		o = source.Origin{Topic: m.Topic, Partition: m.Partition, Offset: m.Offset, Lane: m.Lane}
	}
	return o.Topic + "\x00" + string(m.Key), o.HeldLane() + "/" + strconv.FormatInt(o.Offset, 10), true
}

// sentToRetry records that it went to retry with delay: its key is held,
// it at the tail of the key's messages (or where it was), and the delay is
// the head's destination when it is the head.
func (h *holds) sentToRetry(m *Message, delay time.Duration, now time.Time) {
	k, id, ok := heldKeyOf(m)
	if !ok {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	hk := h.keys[k]
	if hk == nil {
		hk = &heldKey{}
		h.keys[k] = hk
	}
	if !slices.Contains(hk.ids, id) {
		hk.ids = append(hk.ids, id)
	}
	if hk.ids[0] == id {
		hk.dest, hk.expires = delay, now.Add(holdFor(delay))
	}
}

// settled releases m when it is the head of its key: the next message of
// the key is then tried when it comes back. Settled for good (applied,
// skipped, dead-lettered), not sent to retry.
func (h *holds) settled(m *Message, now time.Time) {
	k, id, ok := heldKeyOf(m)
	if !ok {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	hk := h.keys[k]
	if hk == nil {
		return
	}
	i := slices.Index(hk.ids, id)
	if i < 0 {
		return
	}
	hk.ids = slices.Delete(hk.ids, i, i+1)
	switch {
	case len(hk.ids) == 0:
		delete(h.keys, k)
	case i == 0:
		// A new head, somewhere on the retry destinations: it is given
		// the longest delay to come back in.
		hk.expires = now.Add(holdFor(h.max))
	}
}

// follows reports whether m must follow its key into retry, and with which
// delay: its key has a message in retry other than m at the head. m is then
// added behind the key's messages. A key whose head has not come back
// within holdFor its delay is let go.
func (h *holds) follows(m *Message, now time.Time) (time.Duration, bool) {
	k, id, ok := heldKeyOf(m)
	if !ok {
		return 0, false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	hk := h.keys[k]
	if hk != nil && now.After(hk.expires) {
		delete(h.keys, k) // the head is lost to this consumer: the order of the key with it
		hk = nil
	}
	if hk == nil || len(hk.ids) == 0 || hk.ids[0] == id {
		return 0, false
	}
	if !slices.Contains(hk.ids, id) {
		hk.ids = append(hk.ids, id)
	}
	return hk.dest, true
}

// follow sends the items of its whose keys are in retry behind the head
// (KeyOrdered), untried, and returns the others.
func (c *Consumer[TTx]) follow(ctx context.Context, its []*item) ([]*item, error) {
	var kept []*item
	for i, it := range its {
		delay, ok := c.holds.follows(it.msg, c.cfg.Clock.Now())
		if !ok {
			if kept != nil {
				kept = append(kept, it)
			}
			continue
		}
		if kept == nil {
			kept = append(make([]*item, 0, len(its)), its[:i]...)
		}
		if err := c.sendFollower(ctx, it, delay); err != nil {
			return nil, err
		}
	}
	if kept == nil {
		return its, nil
	}
	return kept, nil
}

// sendFollower writes it to the retry destination of delay untried
// (wire.MetaRetryFollowing): its next trip stays the one it was to be on, so
// following spends none of its trips.
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
