package deduptest

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/dedup"
)

// ParkingFactory returns a fresh, empty, migrated store's dedup.Parking for
// one test, cleaned up by t.Cleanup; cfg.LockTimeout bounds its waits on a
// key another call holds.
type ParkingFactory func(t *testing.T, cfg Config) dedup.Parking

// RunParking runs the conformance suite of dedup.Parking: every bullet of
// its discipline — only Park parks; the order of first Park or
// CheckParked, the head first; Head said of the head alone; the head's
// delay; repeated calls that keep a message's place; Unpark of the head,
// of a follower, of the last, of a message not parked; the Depth and Wait
// limits that expire a key, Wait measured from HeadSince on the caller's
// clock; the release of a key past twice Wait; keys apart by scope, topic
// and record key bytes; the listing and its filter, the stats; concurrent
// calls on one key from many goroutines, in crossed key orders; refs
// refused.
func RunParking(t *testing.T, newParking ParkingFactory) {
	s := parkingSuite{newParking: newParking}
	t.Run("OnlyParkParks", s.onlyParkParks)
	t.Run("FirstParkOrCheckOrders", s.order)
	t.Run("HeadDelay", s.headDelay)
	t.Run("RepeatKeepsPlace", s.repeat)
	t.Run("TryTellsHead", s.tryTellsHead)
	t.Run("UnparkMovesHead", s.unparkHead)
	t.Run("UnparkNotParked", s.unparkNotParked)
	t.Run("DepthExpires", s.depth)
	t.Run("DepthWithinCall", s.depthWithinCall)
	t.Run("WaitFromHeadSince", s.wait)
	t.Run("ReleasedPastTwiceWait", s.release)
	t.Run("KeysApart", s.keysApart)
	t.Run("ParkedAndStats", s.listing)
	t.Run("ConcurrentCalls", s.concurrent)
	t.Run("RefsValidated", s.validated)
}

type parkingSuite struct{ newParking ParkingFactory }

func (s parkingSuite) parking(t *testing.T) dedup.Parking {
	t.Helper()
	p := s.newParking(t, Config{LockTimeout: 5 * time.Second})
	if p == nil {
		t.Fatal("deduptest: the factory returned no Parking")
	}
	return p
}

// parkT0 is the suite's clock's start: far from the wall clock, so that a
// store that measures Wait on its own clock expires every key.
var parkT0 = time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)

func parkAt(d time.Duration) time.Time { return parkT0.Add(d) }

// Ref names message id of record key key of topic in scope.
func Ref(scope, topic, key, id string) dedup.ParkRef {
	return dedup.ParkRef{ParkKey: dedup.ParkKey{Scope: scope, Topic: topic, Key: key}, ID: id}
}

func refsOf(k dedup.ParkKey, ids ...string) []dedup.ParkRef {
	refs := make([]dedup.ParkRef, len(ids))
	for i, id := range ids {
		refs[i] = dedup.ParkRef{ParkKey: k, ID: id}
	}
	return refs
}

func decisionString(d dedup.ParkDecision) string {
	if d.Action == dedup.ParkFollow {
		return "follow " + d.Delay.String()
	}
	return d.Action.String()
}

// mustCheck checks refs at now under limits and wants the decisions,
// written "try", "follow 5s", "expired".
func mustCheck(t *testing.T, p dedup.Parking, refs []dedup.ParkRef, limits dedup.ParkLimits, now time.Time, want ...string) {
	t.Helper()
	out := make([]dedup.ParkDecision, len(refs))
	if err := p.CheckParked(ctxFor(t), refs, limits, now, out); err != nil {
		t.Fatalf("CheckParked %v: %v", refs, err)
	}
	for i, w := range want {
		if got := decisionString(out[i]); got != w {
			t.Fatalf("CheckParked: ref %d of %d (%s of key %q): %q, want %q (all: %v)", i+1, len(refs), refs[i].ID, refs[i].Key, got, w, out[:len(refs)])
		}
	}
}

func mustPark(t *testing.T, p dedup.Parking, r dedup.ParkRef, delay time.Duration, now time.Time) {
	t.Helper()
	if err := p.Park(ctxFor(t), r, delay, now); err != nil {
		t.Fatalf("Park %s of key %q: %v", r.ID, r.Key, err)
	}
}

func mustUnpark(t *testing.T, p dedup.Parking, r dedup.ParkRef, now time.Time) {
	t.Helper()
	if err := p.Unpark(ctxFor(t), r, now); err != nil {
		t.Fatalf("Unpark %s of key %q: %v", r.ID, r.Key, err)
	}
}

func mustParked(t *testing.T, p dedup.Parking, f dedup.ParkFilter) []dedup.ParkedKey {
	t.Helper()
	keys, err := p.Parked(ctxFor(t), f)
	if err != nil {
		t.Fatalf("Parked %+v: %v", f, err)
	}
	return keys
}

// parkedKey returns k as Parked lists it, ok false when it is not parked.
// The filter selects k but for an empty scope, which selects all.
func parkedKey(t *testing.T, p dedup.Parking, k dedup.ParkKey) (dedup.ParkedKey, bool) {
	t.Helper()
	var found []dedup.ParkedKey
	for _, pk := range mustParked(t, p, dedup.ParkFilter{Scope: k.Scope, Topic: k.Topic, Key: k.Key, Limit: 1000}) {
		switch {
		case pk.ParkKey == k:
			found = append(found, pk)
		case k.Scope != "" && pk.Scope != k.Scope || pk.Topic != k.Topic || pk.Key != k.Key:
			t.Fatalf("Parked of key %q (scope %q, topic %q) listed key %q (scope %q, topic %q)", k.Key, k.Scope, k.Topic, pk.Key, pk.Scope, pk.Topic)
		}
	}
	if len(found) > 1 {
		t.Fatalf("Parked of key %q listed it %d times", k.Key, len(found))
	}
	if len(found) == 0 {
		return dedup.ParkedKey{}, false
	}
	return found[0], true
}

// wantParked wants k parked as want says (its ParkKey is k's); times are
// compared with Equal.
func wantParked(t *testing.T, p dedup.Parking, k dedup.ParkKey, want dedup.ParkedKey) {
	t.Helper()
	got, ok := parkedKey(t, p, k)
	if !ok {
		t.Fatalf("key %q is not parked, want it parked with head %s", k.Key, want.Head)
	}
	want.ParkKey = k
	if !sameParked(got, want) {
		t.Fatalf("parked key %q:\n got %s\nwant %s", k.Key, parkedString(got), parkedString(want))
	}
}

func wantReleased(t *testing.T, p dedup.Parking, k dedup.ParkKey) {
	t.Helper()
	if got, ok := parkedKey(t, p, k); ok {
		t.Fatalf("key %q is parked (%s), want it released", k.Key, parkedString(got))
	}
}

func sameParked(a, b dedup.ParkedKey) bool {
	return a.ParkKey == b.ParkKey && a.Head == b.Head && a.HeadDelay == b.HeadDelay && a.Depth == b.Depth &&
		a.ParkedAt.Equal(b.ParkedAt) && a.HeadSince.Equal(b.HeadSince) && a.Expired == b.Expired
}

func parkedString(k dedup.ParkedKey) string {
	return fmt.Sprintf("{scope %q topic %q key %q head %s delay %v depth %d parked %v head since %v expired %v}",
		k.Scope, k.Topic, k.Key, k.Head, k.HeadDelay, k.Depth, k.ParkedAt.UTC(), k.HeadSince.UTC(), k.Expired)
}

// walk unparks k's heads one by one until it is released and returns
// them: the key's messages in their order.
func walk(t *testing.T, p dedup.Parking, k dedup.ParkKey, now time.Time) []string {
	t.Helper()
	var heads []string
	for {
		pk, ok := parkedKey(t, p, k)
		if !ok {
			return heads
		}
		if len(heads) > 10_000 {
			t.Fatalf("key %q: still parked after unparking %d heads", k.Key, len(heads))
		}
		heads = append(heads, pk.Head)
		mustUnpark(t, p, dedup.ParkRef{ParkKey: k, ID: pk.Head}, now)
	}
}

var noLimits dedup.ParkLimits

// onlyParkParks: CheckParked of a key not parked tries every message, two
// of one call included, and parks nothing; Park parks.
func (s parkingSuite) onlyParkParks(t *testing.T) {
	p := s.parking(t)
	k := dedup.ParkKey{Scope: "orders", Topic: "payments", Key: "cust-1"}
	mustCheck(t, p, refsOf(k, "p0/1", "p0/2"), noLimits, parkT0, "try", "try")
	mustCheck(t, p, refsOf(k, "p0/2"), noLimits, parkT0, "try")
	if keys := mustParked(t, p, dedup.ParkFilter{}); len(keys) != 0 {
		t.Fatalf("Parked after CheckParked alone: %d keys, want none (only Park parks)", len(keys))
	}
	if st, err := p.ParkStats(ctxFor(t)); err != nil || st.Keys != 0 || !st.Oldest.IsZero() {
		t.Fatalf("ParkStats of no parked key: %+v, %v; want 0 keys and a zero Oldest", st, err)
	}
	mustPark(t, p, Ref("orders", "payments", "cust-1", "p0/1"), 5*time.Second, parkT0)
	wantParked(t, p, k, dedup.ParkedKey{Head: "p0/1", HeadDelay: 5 * time.Second, Depth: 1, ParkedAt: parkT0, HeadSince: parkT0})
	mustCheck(t, p, refsOf(k, "p0/1", "p0/2"), noLimits, parkAt(time.Second), "try", "follow 5s")
}

// order: a key's messages keep the order of their first Park or
// CheckParked, whichever came first, the first Park's the head.
func (s parkingSuite) order(t *testing.T) {
	p := s.parking(t)
	k := dedup.ParkKey{Scope: "orders", Topic: "payments", Key: "cust-1"}
	mustPark(t, p, dedup.ParkRef{ParkKey: k, ID: "h"}, 5*time.Second, parkT0)
	mustCheck(t, p, refsOf(k, "a", "b"), noLimits, parkAt(time.Second), "follow 5s", "follow 5s")
	mustPark(t, p, dedup.ParkRef{ParkKey: k, ID: "c"}, 5*time.Second, parkAt(2*time.Second))
	mustCheck(t, p, refsOf(k, "c", "d"), noLimits, parkAt(3*time.Second), "follow 5s", "follow 5s")
	wantParked(t, p, k, dedup.ParkedKey{Head: "h", HeadDelay: 5 * time.Second, Depth: 5, ParkedAt: parkT0, HeadSince: parkT0})
	if got, want := walk(t, p, k, parkAt(4*time.Second)), []string{"h", "a", "b", "c", "d"}; !slices.Equal(got, want) {
		t.Fatalf("the key's heads, one after another: %v, want %v", got, want)
	}
}

// tryTellsHead: a ParkTry says Head for its parked key's head only: not
// for a message of a key not parked, nor for one after its key's head was
// unparked and the key released (the consumer unparks only heads, and a
// message it tried that is in no list needs no Unpark); a new head says
// Head once the old one is unparked.
func (s parkingSuite) tryTellsHead(t *testing.T) {
	p := s.parking(t)
	k := dedup.ParkKey{Scope: "orders", Topic: "payments", Key: "cust-1"}
	heads := func(now time.Time, refs []dedup.ParkRef, want ...bool) {
		t.Helper()
		out := make([]dedup.ParkDecision, len(refs))
		if err := p.CheckParked(ctxFor(t), refs, noLimits, now, out); err != nil {
			t.Fatalf("CheckParked %v: %v", refs, err)
		}
		for i, w := range want {
			if got := out[i].Head; got != w || (w && out[i].Action != dedup.ParkTry) {
				t.Fatalf("CheckParked: ref %d of %d (%s): %s with Head %v, want Head %v (all: %+v)", i+1, len(refs), refs[i].ID, out[i].Action, got, w, out[:len(refs)])
			}
		}
	}
	heads(parkT0, refsOf(k, "h", "a"), false, false)
	mustPark(t, p, dedup.ParkRef{ParkKey: k, ID: "h"}, 5*time.Second, parkT0)
	heads(parkT0, refsOf(k, "a", "h", "a"), false, true, false)
	mustUnpark(t, p, dedup.ParkRef{ParkKey: k, ID: "h"}, parkAt(time.Second))
	heads(parkAt(time.Second), refsOf(k, "a"), true)
	mustUnpark(t, p, dedup.ParkRef{ParkKey: k, ID: "a"}, parkAt(2*time.Second))
	wantReleased(t, p, k)
	heads(parkAt(2*time.Second), refsOf(k, "a", "b"), false, false)
}

// headDelay: Park of the head sets the key's HeadDelay, repeated or not;
// Park of a follower does not; a follower follows with the head's delay.
func (s parkingSuite) headDelay(t *testing.T) {
	p := s.parking(t)
	k := dedup.ParkKey{Scope: "orders", Topic: "payments", Key: "cust-1"}
	h, f := dedup.ParkRef{ParkKey: k, ID: "h"}, dedup.ParkRef{ParkKey: k, ID: "f"}
	mustPark(t, p, h, time.Second, parkT0)
	mustPark(t, p, h, 30*time.Second, parkAt(time.Second))
	mustCheck(t, p, []dedup.ParkRef{f}, noLimits, parkAt(2*time.Second), "follow 30s")
	mustPark(t, p, f, 7*time.Second, parkAt(2*time.Second))
	wantParked(t, p, k, dedup.ParkedKey{Head: "h", HeadDelay: 30 * time.Second, Depth: 2, ParkedAt: parkT0, HeadSince: parkT0})
	mustCheck(t, p, []dedup.ParkRef{h, f}, noLimits, parkAt(3*time.Second), "try", "follow 30s")
	mustUnpark(t, p, h, parkAt(4*time.Second))
	mustCheck(t, p, []dedup.ParkRef{f}, noLimits, parkAt(5*time.Second), "try")
	mustPark(t, p, f, time.Minute, parkAt(5*time.Second))
	wantParked(t, p, k, dedup.ParkedKey{Head: "f", HeadDelay: time.Minute, Depth: 1, ParkedAt: parkT0, HeadSince: parkAt(4 * time.Second)})
}

// repeat: Park and CheckParked of a message already in its key's list,
// the same ref twice in one call included, keep its place and add nothing.
func (s parkingSuite) repeat(t *testing.T) {
	p := s.parking(t)
	k := dedup.ParkKey{Scope: "orders", Topic: "payments", Key: "cust-1"}
	mustPark(t, p, dedup.ParkRef{ParkKey: k, ID: "h"}, 5*time.Second, parkT0)
	mustCheck(t, p, refsOf(k, "a", "b"), noLimits, parkT0, "follow 5s", "follow 5s")
	mustCheck(t, p, refsOf(k, "b", "a", "b", "c", "h", "c"), noLimits, parkT0, "follow 5s", "follow 5s", "follow 5s", "follow 5s", "try", "follow 5s")
	mustPark(t, p, dedup.ParkRef{ParkKey: k, ID: "a"}, 5*time.Second, parkT0)
	mustPark(t, p, dedup.ParkRef{ParkKey: k, ID: "h"}, 5*time.Second, parkT0)
	wantParked(t, p, k, dedup.ParkedKey{Head: "h", HeadDelay: 5 * time.Second, Depth: 4, ParkedAt: parkT0, HeadSince: parkT0})
	if got, want := walk(t, p, k, parkT0), []string{"h", "a", "b", "c"}; !slices.Equal(got, want) {
		t.Fatalf("the key's heads after repeated calls: %v, want %v", got, want)
	}
}

// unparkHead: Unpark of a follower leaves the head and HeadSince; Unpark
// of the head makes the next message the head, HeadSince the Unpark's
// now; Unpark of the last releases the key, whose next message is tried
// and whose next Park parks it anew.
func (s parkingSuite) unparkHead(t *testing.T) {
	p := s.parking(t)
	k := dedup.ParkKey{Scope: "orders", Topic: "payments", Key: "cust-1"}
	mustPark(t, p, dedup.ParkRef{ParkKey: k, ID: "h"}, 5*time.Second, parkT0)
	mustCheck(t, p, refsOf(k, "a", "b"), noLimits, parkT0, "follow 5s", "follow 5s")
	mustUnpark(t, p, dedup.ParkRef{ParkKey: k, ID: "b"}, parkAt(5*time.Second))
	wantParked(t, p, k, dedup.ParkedKey{Head: "h", HeadDelay: 5 * time.Second, Depth: 2, ParkedAt: parkT0, HeadSince: parkT0})
	mustUnpark(t, p, dedup.ParkRef{ParkKey: k, ID: "h"}, parkAt(10*time.Second))
	got, ok := parkedKey(t, p, k)
	if !ok || got.Head != "a" || got.Depth != 1 || !got.HeadSince.Equal(parkAt(10*time.Second)) || !got.ParkedAt.Equal(parkT0) {
		t.Fatalf("after Unpark of the head: %s (parked %v), want head a, depth 1, head since %v, parked at %v", parkedString(got), ok, parkAt(10*time.Second), parkT0)
	}
	mustCheck(t, p, refsOf(k, "a", "n"), noLimits, parkAt(11*time.Second), "try", "follow 5s")
	mustUnpark(t, p, dedup.ParkRef{ParkKey: k, ID: "n"}, parkAt(12*time.Second))
	mustUnpark(t, p, dedup.ParkRef{ParkKey: k, ID: "a"}, parkAt(12*time.Second))
	wantReleased(t, p, k)
	if st, err := p.ParkStats(ctxFor(t)); err != nil || st.Keys != 0 {
		t.Fatalf("ParkStats after the last Unpark: %+v, %v; want 0 keys", st, err)
	}
	mustCheck(t, p, refsOf(k, "m", "a"), noLimits, parkAt(13*time.Second), "try", "try")
	mustPark(t, p, dedup.ParkRef{ParkKey: k, ID: "m"}, time.Second, parkAt(14*time.Second))
	wantParked(t, p, k, dedup.ParkedKey{Head: "m", HeadDelay: time.Second, Depth: 1, ParkedAt: parkAt(14 * time.Second), HeadSince: parkAt(14 * time.Second)})
}

// unparkNotParked: Unpark of a message not parked — of a key not parked,
// of another key, or unparked already — does nothing.
func (s parkingSuite) unparkNotParked(t *testing.T) {
	p := s.parking(t)
	k := dedup.ParkKey{Scope: "orders", Topic: "payments", Key: "cust-1"}
	mustUnpark(t, p, dedup.ParkRef{ParkKey: k, ID: "h"}, parkT0)
	wantReleased(t, p, k)
	mustPark(t, p, dedup.ParkRef{ParkKey: k, ID: "h"}, 5*time.Second, parkT0)
	mustCheck(t, p, refsOf(k, "a"), noLimits, parkT0, "follow 5s")
	mustUnpark(t, p, dedup.ParkRef{ParkKey: k, ID: "x"}, parkAt(time.Second))
	mustUnpark(t, p, Ref("orders", "payments", "cust-2", "h"), parkAt(time.Second))
	mustUnpark(t, p, Ref("orders", "refunds", "cust-1", "h"), parkAt(time.Second))
	mustUnpark(t, p, Ref("other", "payments", "cust-1", "h"), parkAt(time.Second))
	wantParked(t, p, k, dedup.ParkedKey{Head: "h", HeadDelay: 5 * time.Second, Depth: 2, ParkedAt: parkT0, HeadSince: parkT0})
	mustUnpark(t, p, dedup.ParkRef{ParkKey: k, ID: "a"}, parkAt(2*time.Second))
	mustUnpark(t, p, dedup.ParkRef{ParkKey: k, ID: "a"}, parkAt(3*time.Second))
	wantParked(t, p, k, dedup.ParkedKey{Head: "h", HeadDelay: 5 * time.Second, Depth: 1, ParkedAt: parkT0, HeadSince: parkT0})
}

// depth: a message that would make a key deeper than Depth is expired and
// not added, and the key with it, for good: every message CheckParked
// meets then is expired, the head's included, new ones not added, under
// any limits, until the last is unparked; the key's next message is then
// tried, and its next Park parks it anew, not expired.
func (s parkingSuite) depth(t *testing.T) {
	p := s.parking(t)
	k := dedup.ParkKey{Scope: "orders", Topic: "payments", Key: "cust-1"}
	lim := dedup.ParkLimits{Depth: 3}
	mustPark(t, p, dedup.ParkRef{ParkKey: k, ID: "h"}, 5*time.Second, parkT0)
	mustCheck(t, p, refsOf(k, "a", "b"), lim, parkT0, "follow 5s", "follow 5s")
	mustCheck(t, p, refsOf(k, "h", "b"), lim, parkT0, "try", "follow 5s")
	wantParked(t, p, k, dedup.ParkedKey{Head: "h", HeadDelay: 5 * time.Second, Depth: 3, ParkedAt: parkT0, HeadSince: parkT0})
	mustCheck(t, p, refsOf(k, "c"), lim, parkAt(time.Second), "expired")
	wantParked(t, p, k, dedup.ParkedKey{Head: "h", HeadDelay: 5 * time.Second, Depth: 3, ParkedAt: parkT0, HeadSince: parkT0, Expired: true})
	mustCheck(t, p, refsOf(k, "h", "a", "b", "d"), lim, parkAt(2*time.Second), "expired", "expired", "expired", "expired")
	mustCheck(t, p, refsOf(k, "h", "e"), noLimits, parkAt(2*time.Second), "expired", "expired")
	mustUnpark(t, p, dedup.ParkRef{ParkKey: k, ID: "c"}, parkAt(3*time.Second))
	mustUnpark(t, p, dedup.ParkRef{ParkKey: k, ID: "h"}, parkAt(3*time.Second))
	wantParked(t, p, k, dedup.ParkedKey{Head: "a", HeadDelay: 5 * time.Second, Depth: 2, ParkedAt: parkT0, HeadSince: parkAt(3 * time.Second), Expired: true})
	mustCheck(t, p, refsOf(k, "a"), lim, parkAt(3*time.Second), "expired")
	mustUnpark(t, p, dedup.ParkRef{ParkKey: k, ID: "a"}, parkAt(4*time.Second))
	mustUnpark(t, p, dedup.ParkRef{ParkKey: k, ID: "b"}, parkAt(4*time.Second))
	wantReleased(t, p, k)
	mustCheck(t, p, refsOf(k, "f"), lim, parkAt(5*time.Second), "try")
	mustPark(t, p, dedup.ParkRef{ParkKey: k, ID: "f"}, time.Second, parkAt(5*time.Second))
	mustCheck(t, p, refsOf(k, "f", "g"), lim, parkAt(5*time.Second), "try", "follow 1s")
	wantParked(t, p, k, dedup.ParkedKey{Head: "f", HeadDelay: time.Second, Depth: 2, ParkedAt: parkAt(5 * time.Second), HeadSince: parkAt(5 * time.Second)})
}

// depthWithinCall: the messages of one call are decided in order, each
// against what the earlier ones did: the one the key has no room for
// expires it, and the ones after it are expired, those added before it
// included.
func (s parkingSuite) depthWithinCall(t *testing.T) {
	p := s.parking(t)
	k := dedup.ParkKey{Scope: "orders", Topic: "payments", Key: "cust-1"}
	other := dedup.ParkKey{Scope: "orders", Topic: "payments", Key: "cust-2"}
	mustPark(t, p, dedup.ParkRef{ParkKey: k, ID: "h"}, 5*time.Second, parkT0)
	mustPark(t, p, dedup.ParkRef{ParkKey: other, ID: "h"}, 5*time.Second, parkT0)
	refs := []dedup.ParkRef{{ParkKey: k, ID: "a"}, {ParkKey: other, ID: "a"}, {ParkKey: k, ID: "b"}, {ParkKey: k, ID: "a"}, {ParkKey: other, ID: "b"}}
	mustCheck(t, p, refs, dedup.ParkLimits{Depth: 2}, parkT0, "follow 5s", "follow 5s", "expired", "expired", "expired")
	wantParked(t, p, k, dedup.ParkedKey{Head: "h", HeadDelay: 5 * time.Second, Depth: 2, ParkedAt: parkT0, HeadSince: parkT0, Expired: true})
	wantParked(t, p, other, dedup.ParkedKey{Head: "h", HeadDelay: 5 * time.Second, Depth: 2, ParkedAt: parkT0, HeadSince: parkT0, Expired: true})
}

// wait: a key whose head has held it longer than Wait, by the now the
// caller passes, is expired for good, the head included; the time counts
// from HeadSince, not from ParkedAt.
func (s parkingSuite) wait(t *testing.T) {
	p := s.parking(t)
	lim := dedup.ParkLimits{Wait: time.Minute}
	k := dedup.ParkKey{Scope: "orders", Topic: "payments", Key: "cust-1"}
	mustPark(t, p, dedup.ParkRef{ParkKey: k, ID: "h"}, 5*time.Second, parkT0)
	mustCheck(t, p, refsOf(k, "a"), lim, parkAt(time.Minute), "follow 5s")
	mustCheck(t, p, refsOf(k, "h"), lim, parkAt(time.Minute), "try")
	mustCheck(t, p, refsOf(k, "b"), lim, parkAt(time.Minute+time.Millisecond), "expired")
	wantParked(t, p, k, dedup.ParkedKey{Head: "h", HeadDelay: 5 * time.Second, Depth: 2, ParkedAt: parkT0, HeadSince: parkT0, Expired: true})
	mustCheck(t, p, refsOf(k, "h", "a"), noLimits, parkAt(time.Minute+time.Millisecond), "expired", "expired")

	k2 := dedup.ParkKey{Scope: "orders", Topic: "payments", Key: "cust-2"}
	mustPark(t, p, dedup.ParkRef{ParkKey: k2, ID: "h"}, 5*time.Second, parkT0)
	mustCheck(t, p, refsOf(k2, "a"), lim, parkT0, "follow 5s")
	mustUnpark(t, p, dedup.ParkRef{ParkKey: k2, ID: "h"}, parkAt(50*time.Second))
	// 110s parked, 60s the head: in time.
	mustCheck(t, p, refsOf(k2, "a", "b"), lim, parkAt(110*time.Second), "try", "follow 5s")
	mustCheck(t, p, refsOf(k2, "b"), lim, parkAt(110*time.Second+time.Millisecond), "expired")
	wantParked(t, p, k2, dedup.ParkedKey{Head: "a", HeadDelay: 5 * time.Second, Depth: 2, ParkedAt: parkT0, HeadSince: parkAt(50 * time.Second), Expired: true})
}

// release: a key whose head has held it longer than twice Wait is
// released, expired or not, with the messages still in its list (taken
// for lost): the message that meets it and the call's later ones are
// tried as messages of a key not parked, and added to no list; a Park
// parks the key anew. Twice Wait counts from HeadSince: a head unparked
// from an expired key gives the next one its own time.
func (s parkingSuite) release(t *testing.T) {
	p := s.parking(t)
	lim := dedup.ParkLimits{Wait: time.Minute}
	k := dedup.ParkKey{Scope: "orders", Topic: "payments", Key: "cust-1"}
	mustPark(t, p, dedup.ParkRef{ParkKey: k, ID: "h"}, 5*time.Second, parkT0)
	mustCheck(t, p, refsOf(k, "a"), lim, parkAt(time.Second), "follow 5s")
	mustCheck(t, p, refsOf(k, "a", "b"), lim, parkAt(2*time.Minute), "expired", "expired")
	wantParked(t, p, k, dedup.ParkedKey{Head: "h", HeadDelay: 5 * time.Second, Depth: 2, ParkedAt: parkT0, HeadSince: parkT0, Expired: true})
	mustCheck(t, p, refsOf(k, "c", "h", "c"), lim, parkAt(2*time.Minute+time.Millisecond), "try", "try", "try")
	wantReleased(t, p, k)
	mustPark(t, p, dedup.ParkRef{ParkKey: k, ID: "c"}, time.Second, parkAt(3*time.Minute))
	mustCheck(t, p, refsOf(k, "a", "c"), lim, parkAt(3*time.Minute), "follow 1s", "try")
	wantParked(t, p, k, dedup.ParkedKey{Head: "c", HeadDelay: time.Second, Depth: 2, ParkedAt: parkAt(3 * time.Minute), HeadSince: parkAt(3 * time.Minute)})

	k2 := dedup.ParkKey{Scope: "orders", Topic: "payments", Key: "cust-2"}
	mustPark(t, p, dedup.ParkRef{ParkKey: k2, ID: "h"}, 5*time.Second, parkT0)
	mustCheck(t, p, refsOf(k2, "a", "b"), lim, parkT0, "follow 5s", "follow 5s")
	mustCheck(t, p, refsOf(k2, "h"), lim, parkAt(90*time.Second), "expired")
	mustUnpark(t, p, dedup.ParkRef{ParkKey: k2, ID: "h"}, parkAt(90*time.Second))
	// 2m1s since the key was parked, 31s since a became the head.
	mustCheck(t, p, refsOf(k2, "b"), lim, parkAt(121*time.Second), "expired")
	wantParked(t, p, k2, dedup.ParkedKey{Head: "a", HeadDelay: 5 * time.Second, Depth: 2, ParkedAt: parkT0, HeadSince: parkAt(90 * time.Second), Expired: true})
	mustCheck(t, p, refsOf(k2, "b"), lim, parkAt(210*time.Second+time.Millisecond), "try")
	wantReleased(t, p, k2)
	if keys := mustParked(t, p, dedup.ParkFilter{Key: "cust-2"}); len(keys) != 0 {
		t.Fatalf("Parked after cust-2 was released: %+v, want none", keys)
	}
}

// keysApart: keys of one record key in two scopes or two topics, and
// record keys that differ in bytes no text holds, are parked apart, and
// listed with their bytes.
func (s parkingSuite) keysApart(t *testing.T) {
	p := s.parking(t)
	keys := []dedup.ParkKey{
		{Scope: "a", Topic: "payments", Key: "k"},
		{Scope: "b", Topic: "payments", Key: "k"},
		{Scope: "a", Topic: "refunds", Key: "k"},
		{Scope: "a", Topic: "payments", Key: "k\x00"},
		{Scope: "a", Topic: "payments", Key: "\x00\xff\xfe"},
		{Scope: "", Topic: "payments", Key: "k"},
	}
	for i, k := range keys {
		mustCheck(t, p, refsOf(k, "x"), noLimits, parkT0, "try")
		mustPark(t, p, dedup.ParkRef{ParkKey: k, ID: fmt.Sprint("h", i)}, time.Duration(i+1)*time.Second, parkAt(time.Duration(i)*time.Second))
	}
	for i, k := range keys {
		mustCheck(t, p, refsOf(k, fmt.Sprint("h", i), "x"), noLimits, parkAt(time.Minute), "try", fmt.Sprintf("follow %ds", i+1))
		wantParked(t, p, k, dedup.ParkedKey{Head: fmt.Sprint("h", i), HeadDelay: time.Duration(i+1) * time.Second, Depth: 2,
			ParkedAt: parkAt(time.Duration(i) * time.Second), HeadSince: parkAt(time.Duration(i) * time.Second)})
	}
	all := mustParked(t, p, dedup.ParkFilter{})
	if len(all) != len(keys) {
		t.Fatalf("Parked: %d keys, want %d", len(all), len(keys))
	}
	for i, pk := range all {
		if pk.ParkKey != keys[i] {
			t.Fatalf("Parked, oldest first: key %d is %q of scope %q, topic %q; want %q of scope %q, topic %q", i, pk.Key, pk.Scope, pk.Topic, keys[i].Key, keys[i].Scope, keys[i].Topic)
		}
	}
}

// listing: Parked lists the keys its filter selects, oldest ParkedAt
// first, at most Limit (100 when 0); ParkStats counts them all and finds
// the oldest.
func (s parkingSuite) listing(t *testing.T) {
	p := s.parking(t)
	type parked struct {
		k     dedup.ParkKey
		at    time.Duration
		depth int
	}
	// Parked out of order: the listing sorts.
	set := []parked{
		{dedup.ParkKey{Scope: "s2", Topic: "t1", Key: "k3"}, 3 * time.Second, 1},
		{dedup.ParkKey{Scope: "s1", Topic: "t1", Key: "k1"}, 1 * time.Second, 3},
		{dedup.ParkKey{Scope: "s1", Topic: "t2", Key: "k2"}, 2 * time.Second, 2},
		{dedup.ParkKey{Scope: "s1", Topic: "t1", Key: "k4"}, 4 * time.Second, 1},
	}
	for _, x := range set {
		mustPark(t, p, dedup.ParkRef{ParkKey: x.k, ID: "h"}, 5*time.Second, parkAt(x.at))
		for i := 1; i < x.depth; i++ {
			mustCheck(t, p, refsOf(x.k, fmt.Sprint("f", i)), noLimits, parkAt(x.at+time.Duration(i)*time.Millisecond), "follow 5s")
		}
	}
	names := func(keys []dedup.ParkedKey) string {
		var b strings.Builder
		for _, k := range keys {
			fmt.Fprintf(&b, "%s/%s/%s:%d ", k.Scope, k.Topic, k.Key, k.Depth)
		}
		return strings.TrimSpace(b.String())
	}
	for _, c := range []struct {
		f    dedup.ParkFilter
		want string
	}{
		{dedup.ParkFilter{}, "s1/t1/k1:3 s1/t2/k2:2 s2/t1/k3:1 s1/t1/k4:1"},
		{dedup.ParkFilter{Scope: "s1"}, "s1/t1/k1:3 s1/t2/k2:2 s1/t1/k4:1"},
		{dedup.ParkFilter{Topic: "t1"}, "s1/t1/k1:3 s2/t1/k3:1 s1/t1/k4:1"},
		{dedup.ParkFilter{Key: "k2"}, "s1/t2/k2:2"},
		{dedup.ParkFilter{Scope: "s1", Topic: "t1"}, "s1/t1/k1:3 s1/t1/k4:1"},
		{dedup.ParkFilter{Scope: "s2", Key: "k1"}, ""},
		{dedup.ParkFilter{Limit: 2}, "s1/t1/k1:3 s1/t2/k2:2"},
		{dedup.ParkFilter{Topic: "t1", Limit: 1}, "s1/t1/k1:3"},
	} {
		if got := names(mustParked(t, p, c.f)); got != c.want {
			t.Fatalf("Parked %+v: %q, want %q", c.f, got, c.want)
		}
	}
	wantParked(t, p, set[1].k, dedup.ParkedKey{Head: "h", HeadDelay: 5 * time.Second, Depth: 3, ParkedAt: parkAt(time.Second), HeadSince: parkAt(time.Second)})
	st, err := p.ParkStats(ctxFor(t))
	if err != nil || st.Keys != 4 || !st.Oldest.Equal(parkAt(time.Second)) {
		t.Fatalf("ParkStats: %+v, %v; want 4 keys, the oldest parked at %v", st, err, parkAt(time.Second))
	}
	walk(t, p, set[1].k, parkAt(time.Minute))
	st, err = p.ParkStats(ctxFor(t))
	if err != nil || st.Keys != 3 || !st.Oldest.Equal(parkAt(2*time.Second)) {
		t.Fatalf("ParkStats after the oldest was released: %+v, %v; want 3 keys, the oldest parked at %v", st, err, parkAt(2*time.Second))
	}
	for i := range 100 {
		mustPark(t, p, Ref("many", "t", fmt.Sprint("k", i), "h"), time.Second, parkAt(time.Hour+time.Duration(i)*time.Second))
	}
	if got := mustParked(t, p, dedup.ParkFilter{}); len(got) != 100 || got[0].Key != "k2" || got[99].Key != "k96" {
		t.Fatalf("Parked with no Limit: %d keys, first %q, last %q; want 100, the oldest first (k2 ... k96)", len(got), got[0].Key, got[len(got)-1].Key)
	}
}

// concurrent: goroutines call CheckParked, Park and Unpark on two parked
// keys at once, half of them taking the keys in the other order; none
// deadlocks, and each key holds its head and every message not unparked,
// once.
func (s parkingSuite) concurrent(t *testing.T) {
	p := s.parking(t)
	k1 := dedup.ParkKey{Scope: "orders", Topic: "payments", Key: "hot-1"}
	k2 := dedup.ParkKey{Scope: "orders", Topic: "payments", Key: "hot-2"}
	mustPark(t, p, dedup.ParkRef{ParkKey: k1, ID: "h"}, 5*time.Second, parkT0)
	mustPark(t, p, dedup.ParkRef{ParkKey: k2, ID: "h"}, 5*time.Second, parkT0)
	const n = 24
	ctx := ctxFor(t)
	// retry repeats a call the store refused as busy, as the consumer
	// does: every call may be repeated.
	retry := func(f func() error) error {
		for attempt := 0; ; attempt++ {
			err := f()
			if err == nil || attempt > 100 || !errors.Is(err, dedup.ErrInFlight) && !errors.Is(err, dedup.ErrStoreBusy) {
				return err
			}
			time.Sleep(time.Duration(attempt+1) * time.Millisecond)
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for g := range n {
		wg.Go(func() {
			id := fmt.Sprint("m", g)
			refs := []dedup.ParkRef{{ParkKey: k1, ID: id}, {ParkKey: k2, ID: id}}
			if g%2 == 1 {
				refs[0], refs[1] = refs[1], refs[0]
			}
			out := make([]dedup.ParkDecision, 2)
			check := func(step string) error {
				if err := retry(func() error { return p.CheckParked(ctx, refs, noLimits, parkT0, out) }); err != nil {
					return fmt.Errorf("goroutine %d: %s CheckParked: %w", g, step, err)
				}
				for _, d := range out {
					if d.Action != dedup.ParkFollow || d.Delay != 5*time.Second {
						return fmt.Errorf("goroutine %d: %s CheckParked: %v, want follow 5s for both", g, step, out)
					}
				}
				return nil
			}
			if err := check("first"); err != nil {
				errs <- err
				return
			}
			for _, r := range refs {
				if err := retry(func() error { return p.Park(ctx, r, 5*time.Second, parkT0) }); err != nil {
					errs <- fmt.Errorf("goroutine %d: Park: %w", g, err)
					return
				}
			}
			if err := check("second"); err != nil {
				errs <- err
				return
			}
			if g%3 != 0 {
				return
			}
			for _, r := range refs {
				if err := retry(func() error { return p.Unpark(ctx, r, parkT0) }); err != nil {
					errs <- fmt.Errorf("goroutine %d: Unpark: %w", g, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		return
	}
	want := []string{"h"}
	for g := range n {
		if g%3 != 0 {
			want = append(want, fmt.Sprint("m", g))
		}
	}
	slices.Sort(want[1:])
	for _, k := range []dedup.ParkKey{k1, k2} {
		pk, _ := parkedKey(t, p, k)
		got := walk(t, p, k, parkT0)
		if len(got) > 0 {
			slices.Sort(got[1:])
		}
		if pk.Depth != len(want) || !slices.Equal(got, want) {
			t.Fatalf("key %q after concurrent calls: depth %d, messages %v; want depth %d, %v (no follower lost, none twice)", k.Key, pk.Depth, got, len(want), want)
		}
	}
}

// validated: a ref that names no message (ParkRef.Validate) is refused by
// every call, and a CheckParked with a bad ref changes nothing; a
// CheckParked given fewer decisions than refs is refused.
func (s parkingSuite) validated(t *testing.T) {
	p := s.parking(t)
	k := dedup.ParkKey{Scope: "orders", Topic: "payments", Key: "cust-1"}
	mustPark(t, p, dedup.ParkRef{ParkKey: k, ID: "h"}, 5*time.Second, parkT0)
	long := func(n int) string { return strings.Repeat("x", n) }
	for _, bad := range []dedup.ParkRef{
		Ref(long(dedup.MaxScopeLen+1), "payments", "cust-1", "a"),
		Ref("orders", "", "cust-1", "a"),
		Ref("orders", long(1001), "cust-1", "a"),
		Ref("orders", "payments", "", "a"),
		Ref("orders", "payments", long(1001), "a"),
		Ref("orders", "payments", "cust-1", ""),
		Ref("orders", "payments", "cust-1", long(401)),
	} {
		if bad.Validate() == nil {
			t.Fatalf("deduptest: %+v should not be valid", bad)
		}
		out := make([]dedup.ParkDecision, 2)
		if err := p.CheckParked(ctxFor(t), []dedup.ParkRef{{ParkKey: k, ID: "a"}, bad}, noLimits, parkT0, out); err == nil {
			t.Fatalf("CheckParked of a bad ref (%d-byte scope, %d-byte topic, %d-byte key, %d-byte ID): no error", len(bad.Scope), len(bad.Topic), len(bad.Key), len(bad.ID))
		}
		if err := p.Park(ctxFor(t), bad, time.Second, parkT0); err == nil {
			t.Fatalf("Park of a bad ref (%d-byte scope, %d-byte topic, %d-byte key, %d-byte ID): no error", len(bad.Scope), len(bad.Topic), len(bad.Key), len(bad.ID))
		}
		if err := p.Unpark(ctxFor(t), bad, parkT0); err == nil {
			t.Fatalf("Unpark of a bad ref (%d-byte scope, %d-byte topic, %d-byte key, %d-byte ID): no error", len(bad.Scope), len(bad.Topic), len(bad.Key), len(bad.ID))
		}
	}
	if err := p.CheckParked(ctxFor(t), refsOf(k, "a", "b"), noLimits, parkT0, make([]dedup.ParkDecision, 1)); err == nil {
		t.Fatal("CheckParked of 2 refs with room for 1 decision: no error")
	}
	wantParked(t, p, k, dedup.ParkedKey{Head: "h", HeadDelay: 5 * time.Second, Depth: 1, ParkedAt: parkT0, HeadSince: parkT0})
	if keys := mustParked(t, p, dedup.ParkFilter{}); len(keys) != 1 {
		t.Fatalf("Parked after refused calls: %d keys, want 1", len(keys))
	}
}
