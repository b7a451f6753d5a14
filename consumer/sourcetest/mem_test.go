package sourcetest

// An in-memory broker with Kafka's semantics (partitions, one consumer
// group, generations, committed offsets as watermarks of acked prefixes)
// and optionally RocketMQ's retry topic, and a Source on it. The suite runs
// against it here, fast and without a broker, and against broken variants
// of it (mutants) to show that each of its tests can fail.

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"sync"
	"testing"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/source"
	"github.com/idemkit/idem/consumer/wire"
)

// mutant names a way the source breaks the contract.
type mutant string

const (
	sound           mutant = ""
	commitOnDeliver mutant = "commit-on-deliver" // commits an offset when it delivers the message
	noDrain         mutant = "no-drain"          // Run returns as its context ends; later acks are lost
	unfenced        mutant = "unfenced"          // acks of an earlier assignment commit
	dropAcks        mutant = "drop-acks"         // Ack commits nothing
	newIDs          mutant = "new-ids"           // a redelivered message gets another ID
	noMetadata      mutant = "no-metadata"       // letters lack idem-attempts
	keepOldMetadata mutant = "keep-old-metadata" // letters keep the original's idem-* headers
	reorder         mutant = "reorder"           // a lane's messages come out of offset order
)

const retryPartition = -1

type record struct {
	id      string // the message ID, which a retry copy keeps
	key     []byte
	value   []byte
	headers []consumer.Header
	attempt int
}

// memBroker is one topic, its group and its dead-letter topic.
type memBroker struct {
	topic     string
	retry     bool // released messages go to a retry partition (RocketMQ)
	mut       mutant
	mu        sync.Mutex
	changed   chan struct{} // closed and replaced on every change
	parts     [][]record    // the partitions, then (retry) the retry partition
	committed []int64
	members   []*memSource
	gen       int
	letters   []*consumer.Message
}

func newMemBroker(topic string, partitions int, retry bool, mut mutant) *memBroker {
	n := partitions
	if retry {
		n++
	}
	return &memBroker{topic: topic, retry: retry, mut: mut, changed: make(chan struct{}),
		parts: make([][]record, n), committed: make([]int64, n)}
}

// changedLocked wakes everything waiting for a change. b.mu is held.
func (b *memBroker) changedLocked() {
	close(b.changed)
	b.changed = make(chan struct{})
}

// await releases b.mu, which the caller holds, and waits for the next
// change; false when ctx ended first.
func (b *memBroker) await(ctx context.Context) bool {
	changed := b.changed
	b.mu.Unlock()
	select {
	case <-changed:
		return true
	case <-ctx.Done():
		return false
	}
}

func (b *memBroker) produce(p int, r record) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if r.id == "" {
		r.id = b.topic + "/" + strconv.Itoa(p) + "/" + strconv.Itoa(len(b.parts[p]))
	}
	b.parts[p] = append(b.parts[p], r)
	b.changedLocked()
}

// rebalanceLocked assigns the partitions round-robin to the members, in a
// new generation. b.mu is held.
func (b *memBroker) rebalanceLocked() {
	b.gen++
	for i, s := range b.members {
		var mine []int
		for p := range b.parts {
			if p%len(b.members) == i {
				mine = append(mine, p)
			}
		}
		s.assigned = mine
	}
	b.changedLocked()
}

func (b *memBroker) join(s *memSource) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.members = append(b.members, s)
	b.rebalanceLocked()
}

func (b *memBroker) leave(s *memSource) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.members = slices.DeleteFunc(b.members, func(m *memSource) bool { return m == s })
	if len(b.members) > 0 {
		b.rebalanceLocked()
	}
}

// memSource is a source.Source and consumer.DeadLetter on a memBroker.
type memSource struct {
	b        *memBroker
	maxBytes int

	// Under b.mu:
	assigned []int            // set by rebalances
	gen      int              // the generation of parts
	parts    map[int]*memPart // the current assignment
	running  bool
	stopping bool // Run's context ended
}

// memPart is one partition in one generation of a member.
type memPart struct {
	id      int
	gen     int
	next    int64                       // watermark: the offset to commit
	entries map[*consumer.Message]int64 // delivered, not settled
	done    map[int64]bool              // acked offsets at or past next
	fetched int64
}

func (b *memBroker) newSource(maxBytes int) *memSource {
	return &memSource{b: b, maxBytes: maxBytes}
}

func (s *memSource) Run(ctx context.Context, deliver source.DeliverFunc) error {
	b := s.b
	b.mu.Lock()
	s.running = true
	b.mu.Unlock()
	b.join(s)
	var fetchers sync.WaitGroup
	var stopGen context.CancelFunc = func() {}
	for {
		b.mu.Lock()
		if s.gen != b.gen {
			// A new generation: its fetchers start from the committed
			// offsets; acks of the old one find no entry.
			stopGen()
			b.mu.Unlock()
			fetchers.Wait()
			b.mu.Lock()
			s.gen = b.gen
			s.parts = map[int]*memPart{}
			gctx, cancel := context.WithCancel(ctx)
			stopGen = cancel
			for _, p := range s.assigned {
				mp := &memPart{id: p, gen: s.gen, next: b.committed[p], fetched: b.committed[p],
					entries: map[*consumer.Message]int64{}, done: map[int64]bool{}}
				s.parts[p] = mp
				fetchers.Add(1)
				go func() {
					defer fetchers.Done()
					s.fetch(gctx, mp, deliver)
				}()
			}
		}
		if b.await(ctx) {
			continue
		}
		break
	}
	b.mu.Lock()
	s.stopping = true
	b.mu.Unlock()
	stopGen()
	fetchers.Wait()
	if b.mut != noDrain {
		for {
			b.mu.Lock()
			busy := 0
			for _, p := range s.parts {
				busy += len(p.entries)
			}
			changed := b.changed
			b.mu.Unlock()
			if busy == 0 {
				break
			}
			<-changed
		}
	}
	b.mu.Lock()
	s.running, s.stopping = false, false
	s.parts = nil
	b.mu.Unlock()
	b.leave(s)
	return nil
}

// fetch delivers partition p's records from its committed offset on.
func (s *memSource) fetch(ctx context.Context, p *memPart, deliver source.DeliverFunc) {
	b := s.b
	for {
		b.mu.Lock()
		avail := int64(len(b.parts[p.id]))
		if p.fetched >= avail {
			if b.await(ctx) {
				continue
			}
			return
		}
		offs := []int64{p.fetched}
		if b.mut == reorder && p.fetched+1 < avail {
			offs = []int64{p.fetched + 1, p.fetched}
		}
		msgs := make([]*consumer.Message, len(offs))
		for i, off := range offs {
			msgs[i] = s.message(p.id, off, b.parts[p.id][off], p.gen)
			p.entries[msgs[i]] = off
			if b.mut == commitOnDeliver {
				b.committed[p.id] = max(b.committed[p.id], off+1)
			}
		}
		b.mu.Unlock()
		for i, m := range msgs {
			if err := deliver(ctx, m); err != nil {
				b.mu.Lock()
				for _, u := range msgs[i:] {
					delete(p.entries, u)
				}
				b.changedLocked()
				b.mu.Unlock()
				return
			}
		}
		b.mu.Lock()
		p.fetched += int64(len(offs))
		b.mu.Unlock()
	}
}

func (s *memSource) message(p int, off int64, r record, gen int) *consumer.Message {
	lane := s.b.topic + "/" + strconv.Itoa(p)
	if p == len(s.b.parts)-1 && s.b.retry {
		lane = "%RETRY%/" + s.b.topic
	}
	id := r.id
	if s.b.mut == newIDs {
		id += "@" + strconv.Itoa(p) + "/" + strconv.Itoa(gen)
	}
	return &consumer.Message{Topic: s.b.topic, Partition: int32(p), Offset: off, ID: id, Key: r.key, Value: r.value,
		Headers: slices.Clone(r.headers), Attempt: r.attempt + 1, Lane: lane}
}

// part returns the current assignment's partition of m, nil when m was not
// delivered by it. b.mu is held.
func (s *memSource) part(m *consumer.Message) *memPart {
	p := s.parts[int(m.Partition)]
	if p == nil {
		return nil
	}
	if _, ok := p.entries[m]; !ok {
		return nil
	}
	return p
}

func (s *memSource) Ack(_ context.Context, msgs []*consumer.Message) error {
	b := s.b
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, m := range msgs {
		p := s.part(m)
		if p == nil {
			if b.mut == unfenced {
				b.committed[m.Partition] = max(b.committed[m.Partition], m.Offset+1)
			}
			continue
		}
		delete(p.entries, m)
		if b.mut == dropAcks {
			continue
		}
		p.done[m.Offset] = true
		for p.done[p.next] {
			delete(p.done, p.next)
			p.next++
		}
		if p.gen == b.gen {
			b.committed[p.id] = max(b.committed[p.id], p.next)
		}
	}
	b.changedLocked()
	return nil
}

func (s *memSource) Describe() source.Description { return source.Description{} }

func (s *memSource) Release(msgs []*consumer.Message, _ error) {
	b := s.b
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, m := range msgs {
		p := s.part(m)
		if p == nil {
			continue
		}
		delete(p.entries, m)
		if !b.retry || s.stopping || m.Partition == int32(len(b.parts)-1) {
			continue // held: the partition resumes here after a restart
		}
		// RocketMQ: a copy goes to the retry partition and the offset moves
		// on past the original.
		r := b.parts[p.id][m.Offset]
		r.attempt++
		rp := len(b.parts) - 1
		b.parts[rp] = append(b.parts[rp], r)
		p.done[m.Offset] = true
		for p.done[p.next] {
			delete(p.done, p.next)
			p.next++
		}
		b.committed[p.id] = max(b.committed[p.id], p.next)
	}
	b.changedLocked()
}

func (s *memSource) DeadLetter(_ context.Context, l consumer.Letter) error {
	b := s.b
	b.mu.Lock()
	defer b.mu.Unlock()
	if !s.running {
		return errors.New("memsource: not running")
	}
	headers, value := wire.Letter(l).Record(s.maxBytes)
	switch b.mut {
	case noMetadata:
		headers = slices.DeleteFunc(slices.Clone(headers), func(h consumer.Header) bool { return h.Key == wire.MetaAttempts })
	case keepOldMetadata:
		headers = append(slices.Clone(l.Message.Headers), headers...)
	}
	b.letters = append(b.letters, &consumer.Message{Topic: b.topic + ".dlq", Key: l.Message.Key, Value: value, Headers: headers})
	return nil
}

// memTopic is the suite's factory on a fresh memBroker.
func memTopic(retry bool, mut mutant) Factory {
	return func(t *testing.T) Topic {
		b := newMemBroker("orders", 4, retry, mut)
		n := 0
		return Topic{
			Name: b.topic,
			Produce: func(t *testing.T, msgs []Message) {
				for _, m := range msgs {
					b.produce(n%4, record{key: m.Key, value: m.Value, headers: m.Headers})
					n++
				}
			},
			NewSource: func(t *testing.T, cfg SourceConfig) source.Source {
				max := cfg.DeadLetterMaxBytes
				if max == 0 {
					max = 1 << 20
				}
				return b.newSource(max)
			},
			DeadLetters: func(t *testing.T, n int) []*consumer.Message {
				b.mu.Lock()
				defer b.mu.Unlock()
				if len(b.letters) != n {
					t.Fatalf("%d letters, want %d", len(b.letters), n)
				}
				return slices.Clone(b.letters)
			},
		}
	}
}

var _ consumer.DeadLetter = (*memSource)(nil)
