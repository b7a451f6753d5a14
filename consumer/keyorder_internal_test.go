package consumer

import (
	"context"
	"testing"
	"time"

	"github.com/idemkit/idem/consumer/internal/envelope"
	"github.com/idemkit/idem/consumer/source"
	"github.com/idemkit/idem/consumer/wire"
	"github.com/idemkit/idem/dedup"
)

// TestHoldsKeepAKeysOrder: the holds of KeyOrdered on their own — the head
// of a key in retry is tried, the messages behind it follow to the head's
// destination, the next one is tried once the head is settled, and a head
// that does not come back lets its key go.
func TestHoldsKeepAKeysOrder(t *testing.T) {
	h := parkingOf(&NonBlocking{KeyOrdered: true, Delays: []time.Duration{time.Second, 10 * time.Second}}, nil).(*memParking)
	ctx := context.Background()
	now := time.Unix(1000, 0)
	ref := func(m *Message) dedup.ParkRef {
		r, _ := parkRefOf(&item{msg: m, claim: dedup.Claim{Key: dedup.Key{Scope: "pay", ID: "k"}}})
		return r
	}
	var out [1]dedup.ParkDecision
	follows := func(m *Message, now time.Time) (time.Duration, bool) {
		if len(m.Key) == 0 {
			return 0, false // not ordered: parkRefOf says so, and nothing is checked
		}
		if err := h.CheckParked(ctx, []dedup.ParkRef{ref(m)}, dedup.ParkLimits{}, now, out[:]); err != nil {
			t.Fatal(err)
		}
		return out[0].Delay, out[0].Action == dedup.ParkFollow
	}
	sentToRetry := func(m *Message, d time.Duration, now time.Time) {
		if err := h.Park(ctx, ref(m), d, now); err != nil {
			t.Fatal(err)
		}
	}
	settled := func(m *Message, now time.Time) {
		if err := h.Unpark(ctx, ref(m), now); err != nil {
			t.Fatal(err)
		}
	}
	msg := func(off int64, key string) *Message {
		return &Message{Topic: "pay", Partition: 0, Offset: off, Key: []byte(key)}
	}
	copyOf := func(m *Message) *Message {
		c := *m
		c.Topic, c.Offset = "pay.retry.1s", 77
		envelope.SetOrigin(&c, source.Origin{Topic: m.Topic, Partition: m.Partition, Offset: m.Offset, Retry: true})
		return &c
	}
	a1, a2, a3, b1 := msg(1, "a"), msg(2, "a"), msg(3, "a"), msg(4, "b")
	if _, ok := follows(a1, now); ok {
		t.Fatal("a message of a key not in retry follows")
	}
	sentToRetry(a1, time.Second, now)
	if d, ok := follows(a2, now); !ok || d != time.Second {
		t.Fatalf("a2 behind a1 in retry: follows %v, %v; want 1s, true", d, ok)
	}
	if _, ok := follows(b1, now); ok {
		t.Fatal("another key follows")
	}
	if _, ok := follows(&Message{Topic: "pay", Offset: 5}, now); ok {
		t.Fatal("a message without a record key follows")
	}
	// a1 comes back, fails again: to the next delay; a2 comes back and
	// follows it there, a3 from the topic too.
	if _, ok := follows(copyOf(a1), now); ok {
		t.Fatal("the head's copy follows")
	}
	sentToRetry(copyOf(a1), 10*time.Second, now)
	if d, ok := follows(copyOf(a2), now); !ok || d != 10*time.Second {
		t.Fatalf("a2's copy: follows %v, %v; want the head's 10s", d, ok)
	}
	if _, ok := follows(a3, now); !ok {
		t.Fatal("a3 does not follow")
	}
	// a1 applied: a2 is the head, a3 still follows.
	settled(copyOf(a1), now)
	if _, ok := follows(copyOf(a2), now); ok {
		t.Fatal("a2 follows though a1 was settled")
	}
	if _, ok := follows(a3, now); !ok {
		t.Fatal("a3 overtakes a2")
	}
	settled(copyOf(a2), now)
	settled(a3, now)
	if len(h.keys) != 0 {
		t.Fatalf("keys left held: %v", h.keys)
	}
	// A head that never comes back: its key is let go after holdFor.
	sentToRetry(a1, time.Second, now)
	if _, ok := follows(a2, now.Add(holdFor(time.Second))); !ok {
		t.Fatal("a2 does not follow within holdFor")
	}
	if _, ok := follows(a3, now.Add(holdFor(time.Second)+time.Millisecond)); ok {
		t.Fatal("a key whose head was lost stays held")
	}
}

// TestHeldMessagesOfTwoBrokers: on RocketMQ two brokers each have a queue
// 0, so two messages of one key can share topic, queue ID and offset; the
// held ids tell them apart by their lanes, and a retry copy (which
// carries its original's lane on every trip) is its original again.
func TestHeldMessagesOfTwoBrokers(t *testing.T) {
	a := &Message{Topic: "pay", Partition: 0, Offset: 5, Key: []byte("k"), Lane: "pay/broker-a/0", ID: "A"}
	b := &Message{Topic: "pay", Partition: 0, Offset: 5, Key: []byte("k"), Lane: "pay/broker-b/0"}
	_, _, ida, _ := heldKeyOf(a)
	_, _, idb, _ := heldKeyOf(b)
	if ida == idb {
		t.Fatalf("two messages of two brokers share the held id %q", ida)
	}
	// The copy of a's first trip, then the copy written on its second.
	r := wire.Letter{Message: a}
	trip1 := &Message{Topic: "pay_RETRY", Partition: 0, Offset: 9, Key: a.Key, Lane: "pay_RETRY/broker-b/0"}
	trip1.Headers, _ = r.RetryRecord(wire.Retry{Attempt: 1, Delay: time.Second})
	o, why := lineageOf(trip1, true, retryOf{"pay_RETRY": "pay"}.of)
	if why != "" {
		t.Fatal(why)
	}
	envelope.SetOrigin(trip1, o)
	r2 := wire.Letter{Message: trip1}
	trip2 := &Message{Topic: "pay_RETRY", Partition: 0, Offset: 10, Key: a.Key, Lane: "pay_RETRY/broker-a/0"}
	trip2.Headers, _ = r2.RetryRecord(wire.Retry{Attempt: 2, Delay: time.Second})
	o2, why := lineageOf(trip2, true, retryOf{"pay_RETRY": "pay"}.of)
	if why != "" {
		t.Fatal(why)
	}
	envelope.SetOrigin(trip2, o2)
	for i, c := range []*Message{trip1, trip2} {
		if _, _, id, _ := heldKeyOf(c); id != ida {
			t.Errorf("the copy of trip %d is held as %q, want its original's %q", i+1, id, ida)
		}
	}
}

// retryOf is a fixed map: retry topic -> its topic; of is its
// source.Description.RetryOf.
type retryOf map[string]string

func (r retryOf) of(topic string) (string, bool) { t, ok := r[topic]; return t, ok }

// TestHeldRedrivenCopyIsItsCopyAgain: KeyOrdered × a redriven copy on
// RocketMQ. A redriven copy's origin has no lane (Origin.Lane is "" for a
// redriven copy), so when it goes to retry its key is held under
// "pay/0/5" (topic, queue ID, offset: the lane-less form). Its retry copy
// carries wire.MetaLane, which wire.Letter.RetryRecord left as the lane the
// redriven copy was delivered on ("pay/broker-b/0"), and comes back held
// as "pay/broker-b/0/5": not the id its key is held under. It is then not
// the key's head but a message behind it: it follows its own hold into
// retry, untried, trip after trip, until the hold expires (holdFor), and
// then the key's order is let go.
func TestHeldRedrivenCopyIsItsCopyAgain(t *testing.T) {
	red := &Message{Topic: "pay", Partition: 0, Offset: 12, Key: []byte("k"), Lane: "pay/broker-b/0", ID: "R",
		Headers: []Header{{Key: wire.MetaTopic, Value: []byte("pay")}, {Key: wire.MetaPartition, Value: []byte("0")},
			{Key: wire.MetaOffset, Value: []byte("5")}, {Key: wire.MetaMessageID, Value: []byte("A")}, {Key: wire.MetaRedriveCount, Value: []byte("1")}}}
	o, why := lineageOf(red, true, retryOf{"pay_RETRY": "pay"}.of)
	if why != "" {
		t.Fatal(why)
	}
	envelope.SetOrigin(red, o)
	_, _, held, _ := heldKeyOf(red) // the id sentToRetry holds its key under
	r := wire.Letter{Message: red}
	trip1 := &Message{Topic: "pay_RETRY", Partition: 0, Offset: 9, Key: red.Key, Lane: "pay_RETRY/broker-a/0"}
	trip1.Headers, _ = r.RetryRecord(wire.Retry{Attempt: 1, Delay: time.Second})
	o1, why := lineageOf(trip1, true, retryOf{"pay_RETRY": "pay"}.of)
	if why != "" {
		t.Fatal(why)
	}
	envelope.SetOrigin(trip1, o1)
	if _, _, id, _ := heldKeyOf(trip1); id != held {
		t.Errorf("the retry copy of a redriven copy is held as %q, its key was held under %q: it follows itself into retry until the hold expires", id, held)
	}
}

// TestParkRefOfALongRecordKey: a record key longer than a parked key may
// be is parked by its SHA-256, not left unordered; a message with no key
// derived (bad input) is not parked at all.
func TestParkRefOfALongRecordKey(t *testing.T) {
	long := make([]byte, 2000)
	for i := range long {
		long[i] = byte('a' + i%26)
	}
	m := &Message{Topic: "pay", Partition: 1, Offset: 7, Key: long}
	ref, ok := parkRefOf(&item{msg: m, claim: dedup.Claim{Key: dedup.Key{Scope: "payments", ID: "T1"}}})
	if !ok || len(ref.Key) != len("sha256:")+64 || ref.Validate() != nil {
		t.Fatalf("parkRefOf a 2000-byte record key: %q (%d bytes), %v; want it parked by its SHA-256", ref.Key[:min(len(ref.Key), 20)], len(ref.Key), ok)
	}
	other := *m
	other.Key = append([]byte(nil), long...)
	other.Key[1999] = 'z'
	if ref2, _ := parkRefOf(&item{msg: &other, claim: dedup.Claim{Key: dedup.Key{Scope: "payments", ID: "T2"}}}); ref2.Key == ref.Key {
		t.Error("two long record keys that differ in their last byte are parked as one")
	}
	if _, ok := parkRefOf(&item{msg: m}); ok {
		t.Error("a message with no dedup key derived is parked")
	}
}
