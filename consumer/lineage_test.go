package consumer_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/consumer/source"
	"github.com/idemkit/idem/consumer/wire"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/memstore"
)

// redriven is a copy of orig sent back to its partition at offset, as
// `idem redrive` sends it: orig's key, value and headers, its dead
// letter's Meta*Original* coordinates and key, and the lineage.
func redriven(orig *consumer.Message, offset int64, count int) *consumer.Message {
	c := consumertest.Message(orig.Topic, orig.Partition, offset, string(orig.Key), string(orig.Value))
	c.Headers = append(lineage(orig.Topic, orig.Partition, orig.Offset, orig.ID), consumer.Header{Key: wire.MetaRedriveCount, Value: []byte(strconv.Itoa(count))})
	return c
}

// lineage is the Meta*Original* headers naming a message; the redrive count is the caller's.
func lineage(topic string, partition int32, offset int64, id string) []consumer.Header {
	h := func(k, v string) consumer.Header { return consumer.Header{Key: k, Value: []byte(v)} }
	return []consumer.Header{h(wire.MetaTopic, topic), h(wire.MetaPartition, strconv.Itoa(int(partition))),
		h(wire.MetaOffset, strconv.FormatInt(offset, 10)), h(wire.MetaMessageID, id),
		h(wire.MetaKeyScope, "payments"), h(wire.MetaKey, id)}
}

// byValue counts committed effects by the message's value.
func byValue(e *effects) consumer.HandlerFunc[*memstore.Tx] {
	return func(_ context.Context, tx *memstore.Tx, m *consumer.Message) error {
		e.add(tx, string(m.Value))
		return nil
	}
}

// TestRedrivenCopiesKeyedByTheirOriginal: keyed by message ID, a payment
// whose letter was redriven twice (or written twice) comes back as two
// copies at new offsets, each delivered several times with lost acks: it
// is applied once, and the copies carry the original's dedup key.
func TestRedrivenCopiesKeyedByTheirOriginal(t *testing.T) {
	var msgs []*consumer.Message
	for i := range 4 {
		msgs = append(msgs, consumertest.Message("payments", 0, int64(i), "", payment(i)))
	}
	msgs = append(msgs, redriven(msgs[2], 4, 1), redriven(msgs[2], 5, 2))
	e := newEffects()
	var mu sync.Mutex
	keys := map[int64]dedup.Key{} // by offset: the key each delivery was settled under
	res := consumertest.Run(t, consumer.Config[*memstore.Tx]{
		Name: "payments", Store: memstore.New(memstore.Config{}), Key: consumer.ByMessageID(), Handler: byValue(e), Logger: quiet,
		OnDuplicate: func(_ context.Context, d consumer.Duplicate) {
			mu.Lock()
			keys[d.Message.Offset] = d.Key
			mu.Unlock()
		},
	}, consumertest.Script{MinDeliveries: 1, MaxDeliveries: 3, CrashAfterCommitEvery: 2, Seed: 3}, msgs...)
	e.check(t, []string{payment(0), payment(1), payment(2), payment(3)})
	if res.Stats.Applied != 4 || len(res.DeadLetters) != 0 {
		t.Errorf("stats %+v, %d dead letters", res.Stats, len(res.DeadLetters))
	}
	want := dedup.Key{Scope: "payments", ID: "payments/0/2"}
	for _, off := range []int64{4, 5} {
		if keys[off] != want {
			t.Errorf("the copy at offset %d was skipped under %v, want %v", off, keys[off], want)
		}
	}
}

// TestRedrivenCopyFirst: the original was dead-lettered (its failed row
// released), so the first copy is applied, under the original's key, and
// the second copy is a duplicate of it.
func TestRedrivenCopyFirst(t *testing.T) {
	orig := consumertest.Message("payments", 0, 0, "", payment(0))
	e := newEffects()
	res := consumertest.Run(t, consumer.Config[*memstore.Tx]{
		Name: "payments", Store: memstore.New(memstore.Config{}), Key: consumer.ByMessageID(), Handler: byValue(e), Logger: quiet,
	}, consumertest.Script{}, redriven(orig, 7, 1), redriven(orig, 9, 1))
	if n := e.count(payment(0)); n != 1 || res.Stats.Applied != 1 || res.Stats.Duplicates != 1 {
		t.Errorf("%d effects, stats %+v; want one applied, one duplicate", n, res.Stats)
	}
}

// TestForgedLineageNeverSkipsAGenuineMessage: anyone who can produce can
// write lineage headers. A copy whose lineage names a later offset (a
// message not seen yet), another partition, another topic, an ID that is
// not the position it names, or that has no redrive count, is keyed as a
// message of its own: the genuine message it names is applied, and so is
// the copy.
func TestForgedLineageNeverSkipsAGenuineMessage(t *testing.T) {
	count := func(v string) consumer.Header {
		return consumer.Header{Key: wire.MetaRedriveCount, Value: []byte(v)}
	}
	forged := func(offset int64, value string, h ...consumer.Header) *consumer.Message {
		m := consumertest.Message("payments", 0, offset, "", value)
		m.Headers = h
		return m
	}
	msgs := []*consumer.Message{
		consumertest.Message("payments", 0, 0, "", payment(0)),
		consumertest.Message("payments", 1, 0, "", payment(1)),
		forged(1, "later", append(lineage("payments", 0, 9, "payments/0/9"), count("1"))...),
		forged(2, "same offset", append(lineage("payments", 0, 2, "payments/0/2"), count("1"))...),
		forged(3, "other partition", append(lineage("payments", 1, 0, "payments/1/0"), count("1"))...),
		forged(4, "other topic", append(lineage("orders", 0, 0, "orders/0/0"), count("1"))...),
		forged(5, "id not the position", append(lineage("payments", 0, 0, "payments/0/9"), count("1"))...),
		forged(6, "no count", lineage("payments", 0, 0, "payments/0/0")...),
		forged(7, "count zero", append(lineage("payments", 0, 0, "payments/0/0"), count("0"))...),
		forged(8, "no offset", consumer.Header{Key: wire.MetaTopic, Value: []byte("payments")}, count("1")),
		consumertest.Message("payments", 0, 9, "", payment(9)), // the genuine message the first forgery names
	}
	e := newEffects()
	res := consumertest.Run(t, consumer.Config[*memstore.Tx]{
		Name: "payments", Store: memstore.New(memstore.Config{}), Key: consumer.ByMessageID(), Logger: quiet,
		Handler: consumer.HandlerFunc[*memstore.Tx](func(ctx context.Context, tx *memstore.Tx, m *consumer.Message) error {
			if o, ok := m.Origin(); ok {
				t.Errorf("%s: lineage %+v honoured", m.Value, o)
			}
			return byValue(e)(ctx, tx, m)
		}),
	}, consumertest.Script{}, msgs...)
	var want []string
	for _, m := range msgs {
		want = append(want, string(m.Value))
	}
	e.check(t, want)
	if res.Stats.Duplicates != 0 {
		t.Errorf("stats %+v: nothing is a duplicate", res.Stats)
	}
}

// TestLineageWithProducerChosenIDs: on a source whose message IDs the
// producer chooses (RocketMQ's UNIQ_KEY), a redriven copy has a new ID of
// its own and lies in whichever queue the producer picked; it is keyed by
// the original's ID wherever it lies. A source that does not say so is
// taken to assign IDs by position, and the same copy is a message of its
// own there.
func TestLineageWithProducerChosenIDs(t *testing.T) {
	msgs := func() []*consumer.Message {
		orig := consumertest.Message("payments", 3, 40, "", payment(0))
		orig.ID = "AC11000100002A9F00000001"
		c := consumertest.Message("payments", 1, 7, "", payment(0)) // another queue, a lower offset
		c.ID = "AC1100010000B33100000009"
		c.Headers = append(lineage(orig.Topic, orig.Partition, orig.Offset, orig.ID), consumer.Header{Key: wire.MetaRedriveCount, Value: []byte("1")})
		return []*consumer.Message{orig, c}
	}
	for _, tc := range []struct {
		producerIDs bool
		applied     int
	}{{true, 1}, {false, 2}} {
		e := newEffects()
		ms := msgs()
		var o source.Origin
		var ok bool
		origin := func(m *consumer.Message) {
			if m.Offset == 7 {
				o, ok = m.Origin()
			}
		}
		res := consumertest.Run(t, consumer.Config[*memstore.Tx]{
			Name: "payments", Store: memstore.New(memstore.Config{}), Key: consumer.ByMessageID(), Logger: quiet,
			Handler: consumer.HandlerFunc[*memstore.Tx](func(ctx context.Context, tx *memstore.Tx, m *consumer.Message) error {
				origin(m)
				return byValue(e)(ctx, tx, m)
			}),
			OnDuplicate: func(_ context.Context, d consumer.Duplicate) { origin(d.Message) },
		}, consumertest.Script{ProducerChosenIDs: tc.producerIDs}, ms...)
		if n := e.count(payment(0)); n != tc.applied {
			t.Errorf("ProducerChosenIDs %v: applied %d times, want %d (stats %+v)", tc.producerIDs, n, tc.applied, res.Stats)
		}
		if want := (source.Origin{Topic: "payments", Partition: 3, Offset: 40, ID: ms[0].ID, Redrives: 1}); ok != tc.producerIDs || ok && o != want {
			t.Errorf("ProducerChosenIDs %v: Origin %+v %v, want %+v", tc.producerIDs, o, ok, want)
		}
	}
}

// TestLetterOfARedrivenCopyNamesTheOriginal: a redriven copy that fails
// again is dead-lettered under the original's key and coordinates, with
// its lineage, so that the next redrive sends it, and `idem redrive`
// looks for the done row, as the original again.
func TestLetterOfARedrivenCopyNamesTheOriginal(t *testing.T) {
	orig := consumertest.Message("payments", 0, 2, "", payment(2))
	res := consumertest.Run(t, consumer.Config[*memstore.Tx]{
		Name: "payments", Store: memstore.New(memstore.Config{}), Key: consumer.ByMessageID(), Logger: quiet,
		Handler: consumer.HandlerFunc[*memstore.Tx](func(context.Context, *memstore.Tx, *consumer.Message) error {
			return consumer.Permanent(errors.New("account blocked"))
		}),
	}, consumertest.Script{}, redriven(orig, 11, 2))
	if len(res.DeadLetters) != 1 {
		t.Fatalf("%d dead letters", len(res.DeadLetters))
	}
	headers, _ := wire.Letter(res.DeadLetters[0]).Record(1 << 20)
	got := map[string]string{}
	for _, h := range headers {
		got[h.Key] = string(h.Value)
	}
	for k, v := range map[string]string{
		wire.MetaTopic: "payments", wire.MetaPartition: "0", wire.MetaOffset: "2",
		wire.MetaMessageID: "payments/0/2", wire.MetaKeyScope: "payments", wire.MetaKey: "payments/0/2",
		wire.MetaRedriveCount: "2",
	} {
		if got[k] != v {
			t.Errorf("letter header %s = %q, want %q", k, got[k], v)
		}
	}
}
