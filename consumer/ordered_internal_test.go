package consumer

import (
	"testing"
	"time"
)

// TestHoldsKeepAKeysOrder: the holds of KeyOrdered on their own — the head
// of a key in retry is tried, the messages behind it follow to the head's
// destination, the next one is tried once the head is settled, and a head
// that does not come back lets its key go.
func TestHoldsKeepAKeysOrder(t *testing.T) {
	h := holdsOf(&NonBlocking{KeyOrdered: true, Delays: []time.Duration{time.Second, 10 * time.Second}})
	now := time.Unix(1000, 0)
	msg := func(off int64, key string) *Message {
		return &Message{Topic: "pay", Partition: 0, Offset: off, Key: []byte(key)}
	}
	copyOf := func(m *Message) *Message {
		c := *m
		c.Topic, c.Offset = "pay.retry.1s", 77
		c.origin, c.hasOrigin = Origin{Topic: m.Topic, Partition: m.Partition, Offset: m.Offset, Retry: true}, true
		return &c
	}
	a1, a2, a3, b1 := msg(1, "a"), msg(2, "a"), msg(3, "a"), msg(4, "b")
	if _, ok := h.follows(a1, now); ok {
		t.Fatal("a message of a key not in retry follows")
	}
	h.sentToRetry(a1, time.Second, now)
	if d, ok := h.follows(a2, now); !ok || d != time.Second {
		t.Fatalf("a2 behind a1 in retry: follows %v, %v; want 1s, true", d, ok)
	}
	if _, ok := h.follows(b1, now); ok {
		t.Fatal("another key follows")
	}
	if _, ok := h.follows(&Message{Topic: "pay", Offset: 5}, now); ok {
		t.Fatal("a message without a record key follows")
	}
	// a1 comes back, fails again: to the next delay; a2 comes back and
	// follows it there, a3 from the topic too.
	if _, ok := h.follows(copyOf(a1), now); ok {
		t.Fatal("the head's copy follows")
	}
	h.sentToRetry(copyOf(a1), 10*time.Second, now)
	if d, ok := h.follows(copyOf(a2), now); !ok || d != 10*time.Second {
		t.Fatalf("a2's copy: follows %v, %v; want the head's 10s", d, ok)
	}
	if _, ok := h.follows(a3, now); !ok {
		t.Fatal("a3 does not follow")
	}
	// a1 applied: a2 is the head, a3 still follows.
	h.settled(copyOf(a1), now)
	if _, ok := h.follows(copyOf(a2), now); ok {
		t.Fatal("a2 follows though a1 was settled")
	}
	if _, ok := h.follows(a3, now); !ok {
		t.Fatal("a3 overtakes a2")
	}
	h.settled(copyOf(a2), now)
	h.settled(a3, now)
	if len(h.keys) != 0 {
		t.Fatalf("keys left held: %v", h.keys)
	}
	// A head that never comes back: its key is let go after holdFor.
	h.sentToRetry(a1, time.Second, now)
	if _, ok := h.follows(a2, now.Add(holdFor(time.Second))); !ok {
		t.Fatal("a2 does not follow within holdFor")
	}
	if _, ok := h.follows(a3, now.Add(holdFor(time.Second)+time.Millisecond)); ok {
		t.Fatal("a key whose head was lost stays held")
	}
}
