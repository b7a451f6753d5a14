package seams_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/source"
	"github.com/idemkit/idem/consumer/wire"
)

// The broker is a fake Kafka with the guarantees the real one gives and no
// more: one topic of a few partitions, each a log of records at growing
// offsets; a consumer group whose committed offsets say where a new owner
// of a partition starts; assignments with generations, so that a member
// whose assignment ended (a zombie) can still deliver what it fetched
// before, but commits nothing. Within a partition a member delivers in
// offset order; across partitions in any order.

const topic = "pay"

// recID names a record: its partition and offset.
type recID struct {
	part int32
	off  int64
}

func (r recID) String() string { return fmt.Sprintf("%s/%d/%d", topic, r.part, r.off) }

// record is one record of a partition's log, with what the model needs to
// know of it.
type record struct {
	id      recID
	key     []byte
	value   []byte
	headers []consumer.Header
	pay     string // the payment it carries
	copy    bool   // sent by a redrive
	// lastAck is the delivery sequence number of the latest delivery of
	// the record that a consumer acknowledged (0: never acknowledged).
	lastAck int64
}

type broker struct {
	parts int32
	seq   *atomic.Int64 // the run's sequence: deliveries, releases

	mu        sync.Mutex
	logs      [][]*record
	committed []int64 // the group's committed offsets
	gens      []int   // the generation of each partition's current assignment
}

func newBroker(parts int32, seq *atomic.Int64) *broker {
	return &broker{parts: parts, seq: seq, logs: make([][]*record, parts), committed: make([]int64, parts), gens: make([]int, parts)}
}

// append adds a record to partition p and returns it.
func (b *broker) append(p int32, key, value []byte, headers []consumer.Header, pay string, copy bool) *record {
	b.mu.Lock()
	defer b.mu.Unlock()
	r := &record{id: recID{p, int64(len(b.logs[p]))}, key: key, value: value, headers: headers, pay: pay, copy: copy}
	b.logs[p] = append(b.logs[p], r)
	return r
}

func (b *broker) end(p int32) int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return int64(len(b.logs[p]))
}

// records returns every record, partition by partition.
func (b *broker) records() []record {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []record
	for _, log := range b.logs {
		for _, r := range log {
			out = append(out, *r)
		}
	}
	return out
}

// assign starts a new generation of partition p and returns it with the
// offset its new owner starts at.
func (b *broker) assign(p int32) (gen int, start int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.gens[p]++
	return b.gens[p], b.committed[p]
}

// fetched is what a delivered message carries in Message.Raw.
type fetched struct {
	gen int   // the assignment it was fetched in
	seq int64 // the delivery's sequence number
}

// assignment is a member's hold on one partition.
type assignment struct {
	gen   int
	pos   int64          // the next offset to fetch
	start int64          // where the watermark of acknowledged offsets starts
	acked map[int64]bool // acknowledged offsets at or above start
}

// member is one consumer process's Source: it delivers what the runner
// tells it to fetch, and commits the group's offsets up to the longest
// acknowledged prefix of what it delivered, as the Kafka adapter does.
type member struct {
	b    *broker
	name string
	cmds chan []*consumer.Message
	// pending counts messages handed to the member and not yet
	// acknowledged or released: zero when the member is settled.
	pending atomic.Int64

	mu       sync.Mutex
	parts    map[int32]*assignment
	loseAcks bool // the process "died" after its commits: acks reach no one
}

func newMember(b *broker, name string) *member {
	return &member{b: b, name: name, cmds: make(chan []*consumer.Message, 256), parts: map[int32]*assignment{}}
}

// take gives the member partition p in a new generation.
func (m *member) take(p int32) {
	gen, start := m.b.assign(p)
	m.mu.Lock()
	defer m.mu.Unlock()
	m.parts[p] = &assignment{gen: gen, pos: start, start: start, acked: map[int64]bool{}}
}

// drop ends the member's assignment of p (a rebalance moved it away).
func (m *member) drop(p int32) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.parts, p)
}

func (m *member) owns(p int32) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.parts[p] != nil
}

// fetch takes up to n records of p from the member's position.
func (m *member) fetch(p int32, n int) []*consumer.Message {
	m.mu.Lock()
	a := m.parts[p]
	m.mu.Unlock()
	if a == nil {
		return nil
	}
	m.b.mu.Lock()
	defer m.b.mu.Unlock()
	log := m.b.logs[p]
	var out []*consumer.Message
	for ; n > 0 && a.pos < int64(len(log)); n-- {
		r := log[a.pos]
		a.pos++
		msg := &consumer.Message{
			Topic: topic, Partition: p, Offset: r.id.off, ID: r.id.String(),
			Key: r.key, Value: r.value, Headers: r.headers, LogEnd: int64(len(log)),
			Attempt: 1, Lane: topic + "/" + strconv.Itoa(int(p)),
			Raw: fetched{gen: a.gen, seq: m.b.seq.Add(1)},
		}
		out = append(out, msg)
	}
	return out
}

// rewind moves the member's position in p back by k offsets: a seek, after
// which it delivers settled messages again.
func (m *member) rewind(p int32, k int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	a := m.parts[p]
	if a == nil {
		return
	}
	a.pos = max(0, a.pos-k)
	a.start, a.acked = a.pos, map[int64]bool{}
}

// send hands msgs to the member's Run, to deliver in that order.
func (m *member) send(msgs []*consumer.Message) {
	if len(msgs) == 0 {
		return
	}
	m.pending.Add(int64(len(msgs)))
	m.cmds <- msgs
}

// abandon forgets what was sent and never delivered (the process died).
func (m *member) abandon() {
	for {
		select {
		case msgs := <-m.cmds:
			m.pending.Add(-int64(len(msgs)))
		default:
			return
		}
	}
}

// Run delivers what send hands it until ctx ends.
func (m *member) Run(ctx context.Context, deliver source.DeliverFunc) error {
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case msgs := <-m.cmds:
			for i, msg := range msgs {
				if err := deliver(ctx, msg); err != nil {
					if ctx.Err() != nil {
						m.pending.Add(-int64(len(msgs) - i))
						return ctx.Err()
					}
					m.pending.Add(-1) // a stopped lane: the next owner gets it
				}
			}
		}
	}
}

// Ack records the acknowledgements and commits the watermark of the
// partitions the member still holds in the messages' generation.
func (m *member) Ack(_ context.Context, msgs []*consumer.Message) error {
	m.mu.Lock()
	lose := m.loseAcks
	m.b.mu.Lock()
	for _, msg := range msgs {
		f := msg.Raw.(fetched)
		r := m.b.logs[msg.Partition][msg.Offset]
		r.lastAck = max(r.lastAck, f.seq)
		a := m.parts[msg.Partition]
		if lose || a == nil || a.gen != f.gen || m.b.gens[msg.Partition] != f.gen || msg.Offset < a.start {
			continue // a zombie's, or a dead process's: the commit is refused
		}
		a.acked[msg.Offset] = true
		w := a.start
		for a.acked[w] {
			w++
		}
		m.b.committed[msg.Partition] = max(m.b.committed[msg.Partition], w)
	}
	m.b.mu.Unlock()
	m.mu.Unlock()
	m.pending.Add(-int64(len(msgs)))
	return nil
}

// Release forgets the messages: the partition's next owner fetches them
// from the committed offset.
func (m *member) Release(msgs []*consumer.Message, _ error) {
	m.pending.Add(-int64(len(msgs)))
}

// Describe declares the member OffsetOrdered, and whether a message was
// fetched in an assignment it still holds.
func (m *member) Describe() source.Description {
	return source.Description{OffsetOrdered: true, Assigned: m.assigned}
}

// assigned reports whether msg was fetched in an assignment the member
// still holds.
func (m *member) assigned(msg *consumer.Message) bool {
	f, ok := msg.Raw.(fetched)
	if !ok {
		return false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	a := m.parts[msg.Partition]
	return a != nil && a.gen == f.gen
}

var _ source.Source = (*member)(nil)

// letter is a dead letter as an adapter writes it (wire.Letter.Record)
// to the dead-letter topic, partition for partition.
type letter struct {
	at   recID // its own coordinates in the dead-letter topic
	from recID // the message it holds
	key  []byte
	// headers and value are the letter as Letter.Record lays it out
	headers []consumer.Header
	value   []byte
	reason  string
}

// dlq is the dead-letter topic.
type dlq struct {
	mu      sync.Mutex
	letters []*letter
	ends    map[int32]int64
}

// DeadLetter writes l as the Kafka adapter does.
func (d *dlq) DeadLetter(_ context.Context, l consumer.Letter) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.ends == nil {
		d.ends = map[int32]int64{}
	}
	m := l.Message
	at := recID{m.Partition, d.ends[m.Partition]}
	d.ends[m.Partition]++
	headers, value := wire.Letter(l).Record(1 << 20)
	d.letters = append(d.letters, &letter{at: at, from: recID{m.Partition, m.Offset}, key: m.Key, headers: headers, value: value, reason: l.Reason.Error()})
	return nil
}

// all returns the letters written so far.
func (d *dlq) all() []*letter {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]*letter(nil), d.letters...)
}

// dead reports which records were dead-lettered.
func (d *dlq) dead() map[recID]bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := map[recID]bool{}
	for _, l := range d.letters {
		out[l.from] = true
	}
	return out
}
