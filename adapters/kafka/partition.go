package kafka

import (
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/source"
)

// partition is one assignment of one partition in one generation: its
// fetcher delivers messages, the consumer's lane acks or releases them, and
// the generation's committer commits the watermark, the offset after the
// longest acked prefix of what was delivered. Offsets the fetcher passed
// over without delivering anything (transaction markers, records of aborted
// transactions, compacted records) count as acked, so the watermark reaches
// the end of a partition whose last record is a marker.
//
// A message is matched to its assignment by pointer: acks of messages
// delivered by an earlier assignment of the same partition (the lane may
// still hold some after a rebalance) find no entry here and are dropped.
//
// Epochs: when the fetcher resets below what it delivered (the topic was
// deleted and created again, the log truncated), the offsets start over in
// a new log. The partition starts a new epoch at the reset offset: the
// entries delivered before are kept apart (stale) until the lane settles
// them, their acks commit nothing, and the watermark restarts at the reset
// offset. Within an epoch offsets only grow, which the binary search of
// find relies on.
type partition struct {
	topic    string
	id       int
	lane     string // topic/partition, the message's Lane
	idPrefix string // topic/partition/, the message ID without the offset
	start    int64  // the group's offset at assignment; kafka-go's FirstOffset/LastOffset when none
	gen      *generation

	mu        sync.Mutex
	epoch     int                            // resets of the offsets to below what was delivered
	pending   []entry                        // delivered (or passed over) in this epoch, not below the watermark, offsets ascending
	stale     map[*consumer.Message]struct{} // delivered in an earlier epoch, neither acked nor released
	unsettled int                            // pending and stale messages neither acked nor released
	next      int64                          // watermark: the offset to commit; -1 when nothing was acked
	committed int64                          // highest offset committed in this epoch (or found at assignment); -1 when none
	ended     bool                           // the generation ended: pushes are refused, acks dropped, nothing is committed
	settledAt time.Time                      // a message was last settled, or the assignment began

	fetchAt atomic.Int64 // unix nanoseconds: the fetcher last sent a fetch
}

type entryState uint8

const (
	delivered entryState = iota
	acked
	released
)

// entry is a delivered message, or (msg nil, acked) the offsets up to
// offset that the fetcher passed over without delivering anything.
type entry struct {
	offset int64
	msg    *consumer.Message
	state  entryState
}

func newPartition(g *generation, topic string, a kafkago.PartitionAssignment) *partition {
	lane := topic + "/" + strconv.Itoa(a.ID)
	p := &partition{
		topic:     topic,
		id:        a.ID,
		lane:      lane,
		idPrefix:  lane + "/",
		start:     a.Offset,
		gen:       g,
		next:      -1,
		committed: -1,
	}
	if a.Offset >= 0 {
		p.committed = a.Offset
	}
	p.settledAt = time.Now()
	return p
}

// record holds a delivered message and the kafka-go message it came from in
// one allocation.
type record struct {
	msg consumer.Message
	raw kafkago.Message
}

// message wraps a fetched kafka-go message for delivery.
func (p *partition) message(km *kafkago.Message) *consumer.Message {
	r := &record{raw: *km}
	m := &r.msg
	*m = consumer.Message{
		Topic:     p.topic,
		Partition: int32(p.id),
		Offset:    km.Offset,
		LogEnd:    km.HighWaterMark,
		ID:        p.idPrefix + strconv.FormatInt(km.Offset, 10),
		Key:       km.Key,
		Value:     km.Value,
		Time:      km.Time,
		Attempt:   1,
		Lane:      p.lane,
		Raw:       &r.raw,
	}
	if len(km.Headers) > 0 {
		m.Headers = make([]consumer.Header, len(km.Headers))
		for i, h := range km.Headers {
			m.Headers[i] = consumer.Header{Key: h.Key, Value: h.Value}
		}
	}
	return m
}

// push records m as delivered. It is called before deliver, since the lane
// may ack m before deliver returns. An offset below what this epoch
// delivered or acked starts a new epoch at it (the fetcher says so first,
// with restart; this keeps pending ascending whatever happens).
//
// Once the generation ended push refuses m and reports false: m must not be
// delivered. The fetcher's context ends a moment after the generation does,
// so it may still push; counted, m would stay unsettled for ever (its ack
// is dropped), and Run's drain would never end.
func (p *partition) push(m *consumer.Message) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ended {
		return false
	}
	if n := len(p.pending); (n > 0 && m.Offset <= p.pending[n-1].offset) || (n == 0 && m.Offset < p.next) {
		p.newEpoch(m.Offset)
	}
	p.pending = append(p.pending, entry{offset: m.Offset, msg: m})
	p.unsettled++
	return true
}

// restart starts a new epoch at offset, where the fetcher resumes after
// resetting below what it delivered. It reports whether there is something
// to commit: the reset offset, so that a restart does not resume at an
// offset of the old log, which the new one may reach one day.
func (p *partition) restart(offset int64) (commit bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ended {
		return false
	}
	p.newEpoch(offset)
	return true
}

func (p *partition) newEpoch(offset int64) {
	for _, e := range p.pending {
		if e.msg != nil && e.state == delivered {
			if p.stale == nil {
				p.stale = make(map[*consumer.Message]struct{})
			}
			p.stale[e.msg] = struct{}{}
		}
	}
	clear(p.pending)
	p.pending = p.pending[:0]
	p.epoch++
	p.next = offset
	p.committed = -1
}

// passed records that the fetcher moved on to offset: the offsets below it
// that were not delivered (markers, aborted or compacted records) count as
// acked. It reports whether the watermark moved past the committed offset.
func (p *partition) passed(offset int64) (commit bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ended {
		return false
	}
	n := len(p.pending)
	switch {
	case n == 0:
		p.next = max(p.next, offset)
	case offset-1 <= p.pending[n-1].offset:
	case p.pending[n-1].msg == nil:
		p.pending[n-1].offset = offset - 1
	default:
		p.pending = append(p.pending, entry{offset: offset - 1, state: acked})
	}
	return p.next > p.committed
}

// unpush forgets m, the last message pushed, which deliver refused. It
// reports whether nothing is unsettled any more.
func (p *partition) unpush(m *consumer.Message) (idle bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if n := len(p.pending); n > 0 && p.pending[n-1].msg == m {
		if p.pending[n-1].state == delivered {
			p.unsettled--
		}
		p.pending[n-1] = entry{}
		p.pending = p.pending[:n-1]
	}
	return p.unsettled == 0
}

// find returns the index of m's entry, or -1.
func (p *partition) find(m *consumer.Message) int {
	i := sort.Search(len(p.pending), func(i int) bool { return p.pending[i].offset >= m.Offset })
	if i < len(p.pending) && p.pending[i].msg == m {
		return i
	}
	return -1
}

// settle marks m acked or released. It reports whether the watermark moved
// past the committed offset and whether nothing is unsettled any more.
func (p *partition) settle(m *consumer.Message, to entryState) (commit, idle bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ended {
		return false, false
	}
	i := p.find(m)
	if i < 0 {
		if _, ok := p.stale[m]; ok { // an earlier epoch's: commits nothing
			delete(p.stale, m)
			p.unsettled--
			p.settledAt = time.Now()
			return false, p.unsettled == 0
		}
		return false, false
	}
	if p.pending[i].state != delivered {
		return false, false
	}
	p.pending[i].state = to
	p.unsettled--
	p.settledAt = time.Now()
	if to == acked && i == 0 {
		n := 0
		for n < len(p.pending) && p.pending[n].state == acked {
			p.next = p.pending[n].offset + 1
			p.pending[n] = entry{} // let the message go
			n++
		}
		p.pending = p.pending[n:]
	}
	return p.next > p.committed, p.unsettled == 0
}

// status is the partition's source.LaneStatus, false once its generation
// ended; a fetch the broker may still hold (maxWait) counts as fetching.
func (p *partition) status(maxWait time.Duration) (source.LaneStatus, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ended {
		return source.LaneStatus{}, false
	}
	st := source.LaneStatus{Lane: p.lane, Waiting: int64(p.unsettled), LastSettled: p.settledAt}
	if ns := p.fetchAt.Load(); ns != 0 {
		st.LastFetch = time.Unix(0, ns).Add(maxWait)
		if now := time.Now(); st.LastFetch.After(now) {
			st.LastFetch = now
		}
	}
	return st, true
}

// toCommit returns the offset to commit and its epoch, if the watermark is
// past the committed offset.
func (p *partition) toCommit() (off int64, epoch int, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.next, p.epoch, p.next > p.committed
}

// committedTo records a successful commit of off, taken from toCommit in
// epoch. Offsets only grow within an epoch; a commit of an earlier epoch
// that completes late changes nothing.
func (p *partition) committedTo(off int64, epoch int) {
	p.mu.Lock()
	if epoch == p.epoch && off > p.committed {
		p.committed = off
	}
	p.mu.Unlock()
}

// end stops the assignment: later acks are dropped.
func (p *partition) end() {
	p.mu.Lock()
	p.ended = true
	clear(p.pending)
	p.pending = nil
	p.stale = nil
	p.unsettled = 0
	p.mu.Unlock()
}

// holds reports whether m was delivered by this assignment, which has not
// ended, and is neither acked nor released yet.
func (p *partition) holds(m *consumer.Message) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ended {
		return false
	}
	if i := p.find(m); i >= 0 {
		return p.pending[i].state == delivered
	}
	_, ok := p.stale[m]
	return ok
}

// busy reports whether delivered messages wait for an ack or a release.
func (p *partition) busy() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.unsettled > 0
}
