package dedup

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Key parking keeps the order of a record key's messages while one of them
// waits in a retry destination (consumer.NonBlocking.KeyOrdered): the key is
// parked, the message in retry is its head, and the key's later messages
// follow the head into retry untried, each behind the ones before it, until
// they are the head. A Parking store keeps the parked keys, so that a
// restart, a deploy or a rebalance does not forget them: whichever member
// reads a message of a parked key next sees the key parked.
//
// The discipline, which every Parking keeps:
//   - A key is parked by its first Park and released when its last message
//     is unparked. Its messages keep the order of their first Park or
//     CheckParked; the first is the head.
//   - A message is named by its original's identity (ParkRef.ID), which
//     every copy of it carries: a retry copy, a follower's copy, the
//     original redelivered after a crash. Park, CheckParked and Unpark of a
//     message already in its place change nothing but what they say they
//     change: they may be repeated (at-least-once).
//   - CheckParked decides every message of one call in order, against
//     what the earlier ones of the call did; concurrent calls on one key
//     are serialized (a row lock, a mutex).
//   - A key outlives its limits when its head has held it longer than
//     ParkLimits.Wait (since it became the head), or when a message would
//     make it deeper than ParkLimits.Depth: it is expired then, and every
//     message of it a CheckParked meets, the head's included, is
//     ParkExpired (the consumer dead-letters it with cause parked_too_long
//     and unparks it), until the last is unparked and the key is released.
//     Messages a CheckParked meets on an expired key are not added to it:
//     they are dead-lettered in hand.
//   - A key whose head has held it longer than twice ParkLimits.Wait
//     (HeadSince + 2×Wait; a Wait of 0 never) is released by the
//     CheckParked that meets it, expired or not: its head is taken for
//     lost (its retry copy never written, or deleted by the retry
//     topic's retention), and so are the messages still in its list. The
//     message that met it is ParkTry, not a head, and so are the call's
//     later messages of the key; one of the lost that comes back later
//     meets a key not parked, or parked anew, as any message does. A
//     key's damage is so bounded: after Wait its messages are
//     dead-lettered, after twice Wait they are tried again.

// ParkKey names a record key ordered by KeyOrdered: the key scope of its
// messages' dedup keys (Key.Scope, decided at first delivery and carried by
// every copy), the topic of the originals, and the record key's bytes.
type ParkKey struct {
	Scope string
	Topic string
	Key   string
}

// ParkRef names one message of a parked key by its original's identity:
// the lane and offset of the original (consumer's heldKeyOf), the same for
// the original and every copy of it.
type ParkRef struct {
	ParkKey
	ID string
}

// Validate reports whether r names a message: a scope of at most MaxScopeLen
// bytes, a topic and a record key of 1 to 1000 bytes each, an ID of 1 to
// 400 bytes.
func (r ParkRef) Validate() error {
	switch {
	case len(r.Scope) > MaxScopeLen:
		return fmt.Errorf("dedup: a parked key's scope must be at most %d bytes", MaxScopeLen)
	case r.Topic == "" || len(r.Topic) > 1000:
		return errors.New("dedup: a parked key's topic must be 1 to 1000 bytes")
	case r.Key == "" || len(r.Key) > 1000:
		return errors.New("dedup: a parked record key must be 1 to 1000 bytes")
	case r.ID == "" || len(r.ID) > 400:
		return errors.New("dedup: a parked message's ID must be 1 to 400 bytes")
	}
	return nil
}

// ParkAction is what CheckParked decided for a message.
type ParkAction uint8

const (
	// ParkTry: the message's key is not parked, or the message is its
	// head: try it.
	ParkTry ParkAction = iota
	// ParkFollow: the key is parked with another head; the message is in
	// the key's list now (at its tail, or where it was) and goes to retry
	// untried, to the head's destination (ParkDecision.Delay).
	ParkFollow
	// ParkExpired: the key outlived its limits; dead-letter the message
	// (cause parked_too_long), then Unpark it.
	ParkExpired
)

func (a ParkAction) String() string {
	switch a {
	case ParkTry:
		return "try"
	case ParkFollow:
		return "follow"
	case ParkExpired:
		return "expired"
	}
	return "unknown"
}

// ParkDecision is what CheckParked decided for one message.
type ParkDecision struct {
	Action ParkAction
	// Delay is, for ParkFollow, the delay the head was last sent to retry
	// with: the follower goes to the same destination, behind it.
	Delay time.Duration
	// Head is, for ParkTry, that the message is its parked key's head.
	// A ParkTry message that is not a head is in no key's list (only Park
	// and CheckParked add one), so settling it needs no Unpark.
	Head bool
}

// ParkLimits bound a parked key. Zero fields do not bound.
type ParkLimits struct {
	// Depth is the most messages a parked key holds, its head included.
	Depth int
	// Wait is the longest a head holds its key, from when it became the
	// head.
	Wait time.Duration
}

// ParkedKey is a parked key, as Parked lists it.
type ParkedKey struct {
	ParkKey
	Head      string        // the head's ParkRef.ID
	HeadDelay time.Duration // the delay the head was last sent to retry with
	Depth     int           // the messages it holds, the head included
	ParkedAt  time.Time     // when the key was parked (its first Park)
	HeadSince time.Time     // when the head became the head
	Expired   bool          // it outlived its limits: its messages are dead-lettered as they come
}

// ParkFilter selects parked keys; zero fields select all.
type ParkFilter struct {
	Scope string
	Topic string
	Key   string
	// Limit is the most keys returned, oldest ParkedAt first; 0: 100.
	Limit int
}

// ParkStats sums up the parked keys: how many, and when the oldest was
// parked (zero when none is).
type ParkStats struct {
	Keys   int
	Oldest time.Time
}

// Parking is a Store that keeps parked keys (consumer.NonBlocking.KeyOrdered).
// Its calls are not in the claim's transaction: the consumer calls Park
// before a message's retry copy is written, and Unpark after the message is
// settled for good and before its offset is acknowledged, so a crash in
// between leaves a message parked that a redelivery settles again.
type Parking interface {
	// CheckParked decides each ref in order (see ParkAction), adding
	// followers to their keys; it writes one decision per ref into out
	// (len(out) must be at least len(refs)). now is the consumer's clock,
	// against which Wait is measured.
	//
	// It is not named Check: a Store's Check (the migration check) has
	// that name, and one type is both.
	CheckParked(ctx context.Context, refs []ParkRef, limits ParkLimits, now time.Time, out []ParkDecision) error

	// Park records that ref went to retry with delay: its key is parked
	// (ParkedAt now when it was not), ref is in the key's list (at its
	// tail when it was not in it), and when ref is the head, the key's
	// HeadDelay is delay.
	Park(ctx context.Context, ref ParkRef, delay time.Duration, now time.Time) error

	// Unpark removes ref from its key, settled for good (applied, a
	// duplicate, stale, skipped, dead-lettered). When it was the head, the
	// next message is the head (HeadSince now); a key with no message
	// left is released. Unparking a ref that is not parked does nothing.
	Unpark(ctx context.Context, ref ParkRef, now time.Time) error

	// Parked lists the parked keys f selects, oldest ParkedAt first.
	Parked(ctx context.Context, f ParkFilter) ([]ParkedKey, error)

	// ParkStats counts the parked keys and finds the oldest.
	ParkStats(ctx context.Context) (ParkStats, error)
}
