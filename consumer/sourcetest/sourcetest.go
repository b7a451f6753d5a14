// Package sourcetest is the conformance suite of source.Source: every
// broker adapter runs it against its real broker, as every dedup store runs
// dedup/deduptest. A source that passes keeps the part of idem's promise
// that is the broker's: nothing is acknowledged that the consumer did not
// ack, what it did not ack comes back, and stopping neither loses nor
// repeats what was settled.
//
//	func TestConformance(t *testing.T) {
//		sourcetest.Run(t, sourcetest.Features{OrderedLanes: true, DeadLetters: true},
//			func(t *testing.T) sourcetest.Topic {
//				// a fresh topic, its dead-letter topic and a group name on
//				// the broker, and how to produce, consume and read letters
//			})
//	}
//
// The suite plays the consumer: a Source under test delivers to it, and it
// acks or releases what was delivered the way consumer.Consumer does — from
// one goroutine at a time, each lane's messages in delivery order, never
// before the earlier messages of their lane — or holds a lane's messages, as
// a consumer does while their transaction runs, and settles them later:
// after another Source joined the group, or after the Source's context
// ended. What it checks is on the broker: which messages a new Source of
// the same group is delivered, and what the dead-letter topic holds.
//
// Features declares what a source does; the tests of what it does not are
// skipped. The tests wait on conditions, with deadlines of minutes that
// only bound a hang; none depends on timing.
package sourcetest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/source"
	"github.com/idemkit/idem/consumer/wire"
	"github.com/idemkit/idem/dedup"
)

// Features says what the source under test does.
type Features struct {
	// OrderedLanes: a lane's messages are delivered in offset order (Kafka;
	// RocketMQ in orderly mode).
	OrderedLanes bool
	// RedeliversReleased: a released message is delivered again to the
	// Source that released it, while it runs (RocketMQ: through the group's
	// retry topic). Without it, a released message comes back to the
	// group's next Source (Kafka: the partition resumes at the released
	// offset after a restart or rebalance); the suite checks either.
	RedeliversReleased bool
	// FencedAcks: an ack of a message delivered under an assignment that
	// has ended (its lane moved to another member of the group in a
	// rebalance) commits nothing; the lane's new owner is delivered the
	// message again. The suite forces the rebalance by starting a second
	// Source of the group; the topic needs at least two partitions (queues).
	FencedAcks bool
	// DeadLetters: the Source is also the consumer.DeadLetter for its
	// messages, and Topic.DeadLetters reads what it wrote.
	DeadLetters bool
	// DrainCommits: the acks made while Run drains are committed before Run
	// returns, so the group's next Source is not delivered those messages
	// again (Kafka, RocketMQ). Without it they may be delivered again —
	// at-least-once, which the dedup store absorbs.
	DrainCommits bool
}

// Message is a message the suite has the factory produce.
type Message struct {
	Key     []byte            // the record key (Kafka), KEYS (RocketMQ)
	Value   []byte            // the value or body
	Headers []consumer.Header // headers (Kafka), user properties (RocketMQ)
}

// SourceConfig is what the suite asks of a Source beyond the factory's own
// settings.
type SourceConfig struct {
	// DeadLetterMaxBytes is the largest value the Source copies into a dead
	// letter (the adapters' Config.DeadLetterMaxBytes); 0: the source's
	// default.
	DeadLetterMaxBytes int
}

// Topic is one test's topic, dead-letter topic and consumer group on the
// broker under test.
type Topic struct {
	// Name is the topic's name, as consumer.Message.Topic has it.
	Name string
	// Produce sends msgs to the topic, spread over its partitions (queues),
	// and returns once the broker stored them.
	Produce func(t *testing.T, msgs []Message)
	// NewSource returns a new Source of the test's group on the topic: a
	// new member of the group, which starts where the group's committed
	// offsets say (the first offset for a new group). The suite runs it and
	// ends its Run before the test ends.
	NewSource func(t *testing.T, cfg SourceConfig) source.Source
	// DeadLetters reads the dead-letter topic from its start until it holds
	// n letters and returns them as messages: Key, Value and Headers those
	// of the letter. Needed with Features.DeadLetters.
	DeadLetters func(t *testing.T, n int) []*consumer.Message
}

// Factory returns a fresh topic with nothing produced to it, a dead-letter
// topic and a group name, for one test; t.Cleanup removes them.
type Factory func(t *testing.T) Topic

// Run runs the conformance suite.
func Run(t *testing.T, f Features, newTopic Factory) {
	s := suite{f: f, newTopic: newTopic}
	t.Run("Delivery", s.delivery)
	t.Run("AckedNotRedelivered", s.ackedNotRedelivered)
	t.Run("UnackedRedelivered", s.unackedRedelivered)
	t.Run("StopDrains", s.stopDrains)
	t.Run("ReleaseRedelivers", s.releaseRedelivers)
	t.Run("NoAckFromEarlierAssignment", s.noAckFromEarlierAssignment)
	t.Run("DeadLetterShape", s.deadLetterShape)
}

// wait bounds every wait of the suite: it ends a hang, nothing asserts how
// long a wait took. Brokers rebalance, and redeliver through retry topics,
// in seconds to tens of seconds.
var wait = 3 * time.Minute

// drainGrace is how long StopDrains holds the delivered messages after
// Run's context ended, before it acks them.
const drainGrace = time.Second

type suite struct {
	f        Features
	newTopic Factory
}

// messages returns n messages with values unique to the test, keys and a
// header.
func messages(t *testing.T, prefix string, n int) []Message {
	msgs := make([]Message, n)
	for i := range msgs {
		msgs[i] = Message{
			Key:     fmt.Appendf(nil, "k-%s-%d", prefix, i),
			Value:   fmt.Appendf(nil, `{"test":%q,"batch":%q,"n":%d}`, t.Name(), prefix, i),
			Headers: []consumer.Header{{Key: "sourcetest-seq", Value: fmt.Appendf(nil, "%s-%d", prefix, i)}},
		}
	}
	return msgs
}

// values returns the set of msgs' values.
func values(msgs []Message) map[string]bool {
	out := make(map[string]bool, len(msgs))
	for _, m := range msgs {
		out[string(m.Value)] = true
	}
	return out
}

// delivery: every produced message is delivered, once, with its key,
// value and headers, the topic's name, a lane, an ID of its own and an
// attempt; a lane's deliveries do not overlap and, with OrderedLanes, come
// in offset order.
func (s suite) delivery(t *testing.T) {
	tp := s.newTopic(t)
	msgs := messages(t, "d", 20)
	tp.Produce(t, msgs)
	m := start(t, "source", tp.NewSource(t, SourceConfig{}), ackAll)
	m.waitValues(t, "every produced message delivered", values(msgs))
	m.stop(t, ack)

	byValue := map[string]Message{}
	for _, p := range msgs {
		byValue[string(p.Value)] = p
	}
	ids := map[string]string{}
	lastOffset := map[string]int64{}
	for _, d := range m.deliveries() {
		p, ok := byValue[string(d.Value)]
		if !ok {
			t.Errorf("delivered a message that was not produced: %q", d.Value)
			continue
		}
		if string(d.Key) != string(p.Key) {
			t.Errorf("%s: key %q, want %q", d.Value, d.Key, p.Key)
		}
		for _, h := range p.Headers {
			if v, ok := d.Header(h.Key); !ok || string(v) != string(h.Value) {
				t.Errorf("%s: header %s = %q (present %v), want %q", d.Value, h.Key, v, ok, h.Value)
			}
		}
		if d.Topic != tp.Name {
			t.Errorf("%s: topic %q, want %q", d.Value, d.Topic, tp.Name)
		}
		if d.Lane == "" || d.ID == "" || d.Attempt < 1 || d.Partition < 0 || d.Offset < 0 {
			t.Errorf("%s: lane %q, ID %q, attempt %d, partition %d, offset %d: want a lane, an ID, an attempt from 1",
				d.Value, d.Lane, d.ID, d.Attempt, d.Partition, d.Offset)
		}
		if other, ok := ids[d.ID]; ok && other != string(d.Value) {
			t.Errorf("messages %s and %s share the ID %q", other, d.Value, d.ID)
		}
		ids[d.ID] = string(d.Value)
		if s.f.OrderedLanes {
			if last, ok := lastOffset[d.Lane]; ok && d.Offset <= last {
				t.Errorf("lane %s: offset %d delivered after %d, want offset order", d.Lane, d.Offset, last)
			}
			lastOffset[d.Lane] = d.Offset
		}
	}
	if n := len(m.deliveries()); n != len(msgs) {
		t.Errorf("%d deliveries of %d messages, all acked at once: want each once", n, len(msgs))
	}
}

// ackedNotRedelivered: what a Source acked, and what was committed when it
// stopped, is not delivered to the group's next Source; what was produced
// after is.
func (s suite) ackedNotRedelivered(t *testing.T) {
	tp := s.newTopic(t)
	first := messages(t, "a", 20)
	tp.Produce(t, first)
	m1 := start(t, "first source", tp.NewSource(t, SourceConfig{}), ackAll)
	m1.waitValues(t, "every message of the first batch delivered", values(first))
	m1.waitSettled(t)
	m1.stop(t, ack)

	second := messages(t, "b", 10)
	tp.Produce(t, second)
	m2 := start(t, "second source", tp.NewSource(t, SourceConfig{}), ackAll)
	m2.waitValues(t, "every message of the second batch delivered to the next source", values(second))
	m2.stop(t, ack)
	again := m2.deliveredOf(values(first))
	if len(again) > 0 {
		t.Errorf("the next source of the group was delivered %d messages the first had acked before it stopped, the first %s",
			len(again), again[0])
	}
}

// unackedRedelivered: what a Source delivered and had not settled when its
// context ended is released, and the group's next Source is delivered it
// again, with the same ID; so is what it never delivered.
func (s suite) unackedRedelivered(t *testing.T) {
	tp := s.newTopic(t)
	msgs := messages(t, "u", 20)
	tp.Produce(t, msgs)
	m1 := start(t, "first source", tp.NewSource(t, SourceConfig{}), holdAll)
	m1.waitCount(t, "a first delivery", 1)
	m1.stop(t, release)
	held := m1.deliveries()

	m2 := start(t, "second source", tp.NewSource(t, SourceConfig{}), ackAll)
	m2.waitValues(t, "every message delivered to the next source (none was acked)", values(msgs))
	m2.stop(t, ack)
	requireSameIDs(t, held, m2.deliveries())
}

// stopDrains: when its context ends, Run goes on serving Ack and Release
// for what it delivered, returns only once all of it is settled, and
// commits what was acked then: the group's next Source is not delivered it
// again. deliver is not called once Run returned.
//
// The suite refuses deliveries once Run's context ended, as the consumer
// does. A source that acknowledges by batch (RocketMQ: a consume call's
// result covers all of its messages) gives back the batch of a refused
// message, acked messages and all; the lanes the suite refused a delivery
// on are therefore left out of the last check.
func (s suite) stopDrains(t *testing.T) {
	tp := s.newTopic(t)
	msgs := messages(t, "s", 20)
	tp.Produce(t, msgs)
	m1 := start(t, "first source", tp.NewSource(t, SourceConfig{}), holdAll)
	m1.waitCount(t, "a first delivery", 1)
	m1.cancelRun()
	// A source that does not drain returns as soon as its context ends; one
	// that does, only after the acks below. A consumer's acks come once its
	// transactions commit: the suite gives Run that long to show which kind
	// it is. (The one wait of the suite that passes by running out.)
	if m1.returnsWithin(drainGrace) {
		t.Errorf("Run returned as its context ended, with %d delivered messages unsettled", len(m1.deliveries()))
	}
	m1.stop(t, ack) // the acks come after the context ended
	acked := m1.deliveries()

	marker := messages(t, "m", 5)
	tp.Produce(t, marker)
	want := values(marker)
	for v := range values(msgs) {
		want[v] = true
	}
	for _, d := range acked {
		delete(want, string(d.Value))
	}
	m2 := start(t, "second source", tp.NewSource(t, SourceConfig{}), ackAll)
	m2.waitValues(t, "the messages the first source had not delivered, and those produced after it stopped", want)
	m2.stop(t, ack)
	refused := m1.refusedLanes()
	byValue := map[string]bool{}
	for _, d := range acked {
		if !refused[d.Lane] {
			byValue[string(d.Value)] = true
		}
	}
	if again := m2.deliveredOf(byValue); len(again) > 0 && s.f.DrainCommits {
		t.Errorf("%d of the %d messages acked while Run drained were delivered again to the next source, the first %s: the acks after the context ended were not committed",
			len(again), len(byValue), again[0])
	}
	t.Logf("%d messages acked while Run drained, %d of them on lanes without a refused delivery", len(acked), len(byValue))
}

// releaseRedelivers: a message released while the Source runs is
// delivered again, with the same ID: to the same Source with
// RedeliversReleased, else to the group's next Source.
func (s suite) releaseRedelivers(t *testing.T) {
	tp := s.newTopic(t)
	msgs := messages(t, "r", 10)
	tp.Produce(t, msgs)
	want := values(msgs)
	m1 := start(t, "first source", tp.NewSource(t, SourceConfig{}), releaseFirst)
	var again []*consumer.Message
	if s.f.RedeliversReleased {
		m1.waitAcked(t, "every released message delivered again and acked", want)
		m1.stop(t, ack)
		again = m1.deliveries()
	} else {
		m1.waitValues(t, "every message delivered (and released)", want)
		m1.stop(t, release)
		m2 := start(t, "second source", tp.NewSource(t, SourceConfig{}), ackAll)
		m2.waitValues(t, "every released message delivered again to the next source", want)
		m2.stop(t, ack)
		again = m2.deliveries()
	}
	requireSameIDs(t, m1.released(), again)
}

// noAckFromEarlierAssignment: a second Source joins the group and a lane
// moves to it while the first holds the lane's messages; the first then
// acks them. Those acks commit nothing: once the second released the
// messages, a third Source of the group is delivered them again.
func (s suite) noAckFromEarlierAssignment(t *testing.T) {
	if !s.f.FencedAcks {
		t.Skip("the source does not declare FencedAcks")
	}
	tp := s.newTopic(t)
	msgs := messages(t, "f", 40)
	tp.Produce(t, msgs)
	m1 := start(t, "first source", tp.NewSource(t, SourceConfig{}), holdAll)
	m1.waitFor(t, "deliveries from two lanes (the topic needs two partitions or queues)", func() (bool, string) {
		n := len(m1.lanes())
		return n >= 2, fmt.Sprintf("%d lanes", n)
	})
	m2 := start(t, "second source", tp.NewSource(t, SourceConfig{}), holdAll)
	var moved []*consumer.Message
	m2.waitFor(t, "a lane of the first source to move to the second (a rebalance)", func() (bool, string) {
		moved = common(m1.deliveries(), m2.deliveries())
		return len(moved) > 0, fmt.Sprintf("the second source has %d deliveries", len(m2.deliveries()))
	})
	// A lane settles late, after its partition moved: the consumer was
	// still committing the transaction.
	m1.settleHeld(t, ack)
	m1.stop(t, release)
	m2.stop(t, release)

	// The only acks were the first source's late ones: those of the lanes
	// that had moved must have committed nothing.
	m3 := start(t, "third source", tp.NewSource(t, SourceConfig{}), ackAll)
	want := map[string]bool{}
	for _, d := range moved {
		want[string(d.Value)] = true
	}
	m3.waitValues(t, fmt.Sprintf("the %d messages the first source acked after their lane had moved to the second, delivered again to a third", len(want)), want)
	m3.stop(t, ack)
	t.Logf("%d messages moved to the second source before the first acked them", len(want))
}

// deadLetterShape: a letter carries the consumer.Meta* metadata of
// Letter.Record, the original's key and headers (earlier idem-* headers
// replaced), and the value, or, past DeadLetterMaxBytes, its hash and size.
func (s suite) deadLetterShape(t *testing.T) {
	if !s.f.DeadLetters {
		t.Skip("the source does not declare DeadLetters")
	}
	const maxBytes = 100
	tp := s.newTopic(t)
	small := Message{Key: []byte("k-small"), Value: []byte(`{"txn_id":"small"}`), Headers: []consumer.Header{
		{Key: "trace-id", Value: []byte("abc")},
		{Key: wire.MetaReason, Value: []byte("an earlier dead letter's reason")},
	}}
	big := Message{Key: []byte("k-big"), Value: []byte(`{"txn_id":"big","pad":"` + strings.Repeat("x", 2*maxBytes) + `"}`)}
	tp.Produce(t, []Message{small, big})
	src := tp.NewSource(t, SourceConfig{DeadLetterMaxBytes: maxBytes})
	dl, ok := src.(consumer.DeadLetter)
	if !ok {
		t.Fatalf("Features.DeadLetters is set, but %T is not a consumer.DeadLetter", src)
	}
	m := start(t, "source", src, holdAll)
	m.waitValues(t, "both messages delivered", values([]Message{small, big}))
	want := map[string]letterLayout{}
	orig := map[string][]byte{}
	for _, d := range m.deliveries() {
		l := consumer.Letter{Message: d, Key: consumerKey(d), Reason: errors.New("sourcetest: rejected\nfor good"), Attempts: 2}
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		err := dl.DeadLetter(ctx, l)
		cancel()
		if err != nil {
			t.Fatalf("DeadLetter of %s while Run runs: %v", d.Coordinates(), err)
		}
		headers, value := wire.Letter(l).Record(maxBytes)
		want[string(d.Key)] = letterLayout{headers, value}
		orig[string(d.Key)] = d.Value
	}
	m.stop(t, ack)

	letters := tp.DeadLetters(t, len(want))
	for _, l := range letters {
		rec, ok := want[string(l.Key)]
		if !ok {
			t.Errorf("a letter with key %q, want the originals' keys %q and %q", l.Key, small.Key, big.Key)
			continue
		}
		delete(want, string(l.Key))
		requireLetter(t, l, rec, orig[string(l.Key)])
	}
	for k := range want {
		t.Errorf("no letter with key %q", k)
	}
}

// consumerKey is the dedup key the suite gives a dead-lettered message.
func consumerKey(m *consumer.Message) dedup.Key {
	return dedup.Key{Scope: "sourcetest", ID: string(m.Key)}
}

// letterLayout is a letter as Letter.Record lays it out.
type letterLayout struct {
	headers []consumer.Header
	value   []byte
}

// requireLetter fails unless l carries rec: every header of rec with its
// value, no other idem-* header, and rec's value; when rec left the value
// out, any value but the original (orig) will do: a broker that cannot
// store an empty value (RocketMQ) needs a placeholder.
func requireLetter(t *testing.T, l *consumer.Message, rec letterLayout, orig []byte) {
	t.Helper()
	own := map[string]bool{}
	for _, h := range rec.headers {
		own[h.Key] = true
		if v, ok := l.Header(h.Key); !ok || string(v) != string(h.Value) {
			t.Errorf("letter %q: header %s = %q (present %v), want %q", l.Key, h.Key, v, ok, h.Value)
		}
	}
	for _, h := range l.Headers {
		if strings.HasPrefix(h.Key, "idem-") && !own[h.Key] {
			t.Errorf("letter %q: header %s = %q, which Letter.Record does not have", l.Key, h.Key, h.Value)
		}
		if h.Key == wire.MetaReason && string(h.Value) != string(headerOf(rec, wire.MetaReason)) {
			t.Errorf("letter %q: a second %s header %q", l.Key, h.Key, h.Value)
		}
	}
	if headerOf(rec, wire.MetaValueSHA256) != nil {
		if string(l.Value) == string(orig) {
			t.Errorf("letter %q: the value, %d bytes, is copied although the limit is smaller", l.Key, len(orig))
		}
	} else if string(l.Value) != string(rec.value) {
		t.Errorf("letter %q: value of %d bytes, want %d bytes (%q)", l.Key, len(l.Value), len(rec.value), shorten(rec.value))
	}
}

func headerOf(rec letterLayout, k string) []byte {
	for _, h := range rec.headers {
		if h.Key == k {
			return h.Value
		}
	}
	return nil
}

func shorten(b []byte) string {
	if len(b) > 40 {
		return string(b[:40]) + "..."
	}
	return string(b)
}

// requireSameIDs fails unless every message of first that was delivered
// again in later has the same ID there.
func requireSameIDs(t *testing.T, first, later []*consumer.Message) {
	t.Helper()
	ids := map[string]string{}
	for _, m := range first {
		ids[string(m.Value)] = m.ID
	}
	for _, m := range later {
		if id, ok := ids[string(m.Value)]; ok && id != m.ID {
			t.Errorf("%s was delivered with ID %q and again with ID %q: the dedup key consumer.ByMessageID would differ",
				m.Value, id, m.ID)
		}
	}
}

// common returns the messages of b whose values a has too.
func common(a, b []*consumer.Message) []*consumer.Message {
	in := map[string]bool{}
	for _, m := range a {
		in[string(m.Value)] = true
	}
	var out []*consumer.Message
	for _, m := range b {
		if in[string(m.Value)] {
			out = append(out, m)
		}
	}
	return out
}

// --- the suite's consumer -------------------------------------------------

// action is what the suite does with a delivered message.
type action uint8

const (
	ack     action = iota + 1
	release        // as a consumer gives a message back
	hold           // keep the lane's messages unsettled until the test settles them
)

// policy decides, for a delivery of m that is its seen-th of m's value to
// this Source (0 for the first), what to do with it.
type policy func(m *consumer.Message, seen int) action

func ackAll(*consumer.Message, int) action  { return ack }
func holdAll(*consumer.Message, int) action { return hold }

func releaseFirst(_ *consumer.Message, seen int) action {
	if seen == 0 {
		return release
	}
	return ack
}

// errReleased is the reason the suite gives for what it releases.
var errReleased = errors.New("sourcetest: released")

// member runs one Source and plays its consumer.
type member struct {
	name   string
	src    source.Source
	policy policy
	cancel context.CancelFunc
	done   chan error
	kick   chan struct{}
	quit   chan struct{}

	settleMu sync.Mutex // Ack and Release run under it: one call at a time

	mu         sync.Mutex
	ctxDone    bool
	returned   bool
	stopped    bool
	delivered  []*consumer.Message
	seen       map[string]int // deliveries per value
	lanesOf    map[string]*lane
	acked      map[string]int // acks per value
	refused    map[string]int // refused deliveries per lane
	releasedMs []*consumer.Message
	problems   []string
}

// lane is a lane's delivered, unsettled messages, in delivery order.
type lane struct {
	queue    []entry
	inflight bool // a deliver call for the lane is running
	held     bool // the head is held: so is everything behind it
}

type entry struct {
	m *consumer.Message
	a action
}

// start runs src in the background with p deciding what happens to each
// delivery. The test stops it; a test that fails first has it stopped (its
// messages released) when it ends.
func start(t *testing.T, name string, src source.Source, p policy) *member {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	m := &member{name: name, src: src, policy: p, cancel: cancel, done: make(chan error, 1),
		kick: make(chan struct{}, 1), quit: make(chan struct{}),
		seen: map[string]int{}, lanesOf: map[string]*lane{}, acked: map[string]int{}, refused: map[string]int{}}
	go m.settler()
	go func() {
		err := src.Run(ctx, m.deliver)
		m.mu.Lock()
		m.returned = true
		m.mu.Unlock()
		m.done <- err
	}()
	t.Cleanup(func() {
		if !m.isStopped() {
			m.stop(t, release)
		}
		close(m.quit)
	})
	return m
}

// deliver is the DeliverFunc the Source gets.
func (m *member) deliver(ctx context.Context, msg *consumer.Message) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.returned {
		m.problems = append(m.problems, fmt.Sprintf("deliver called after Run returned (%s)", msg.Coordinates()))
		return consumer.ErrStopped
	}
	if ctx.Err() != nil || m.ctxDone {
		// As the consumer does once Run's context ended.
		m.refused[msg.Lane]++
		return consumer.ErrStopped
	}
	l := m.lanesOf[msg.Lane]
	if l == nil {
		l = &lane{}
		m.lanesOf[msg.Lane] = l
	}
	if l.inflight {
		m.problems = append(m.problems, fmt.Sprintf("two deliver calls for lane %s at once", msg.Lane))
	}
	l.inflight = true
	m.delivered = append(m.delivered, msg)
	a := m.policy(msg, m.seen[string(msg.Value)])
	m.seen[string(msg.Value)]++
	l.queue = append(l.queue, entry{msg, a})
	m.mu.Unlock()
	// A deliver call for the lane that overlapped this one would find it
	// in flight.
	runtime.Gosched()
	m.mu.Lock()
	l.inflight = false
	select {
	case m.kick <- struct{}{}:
	default:
	}
	return nil
}

// settler settles what the policy says to, lane by lane, as a consumer's
// lanes would, until the member's test ends.
func (m *member) settler() {
	for {
		select {
		case <-m.kick:
		case <-m.quit:
			return
		}
		m.settleMu.Lock()
		for {
			batch, a := m.next()
			if batch == nil {
				break
			}
			m.settle(batch, a)
		}
		m.settleMu.Unlock()
	}
}

// next takes the next run of messages of one lane with one action (ack or
// release) off the front of its queue; nil when every lane is empty or
// held.
func (m *member) next() ([]*consumer.Message, action) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, name := range slices.Sorted(maps.Keys(m.lanesOf)) {
		l := m.lanesOf[name]
		if l.held || len(l.queue) == 0 {
			continue
		}
		a := l.queue[0].a
		if a == hold {
			l.held = true
			continue
		}
		var batch []*consumer.Message
		for len(l.queue) > 0 && l.queue[0].a == a {
			batch = append(batch, l.queue[0].m)
			l.queue = l.queue[1:]
		}
		return batch, a
	}
	return nil, 0
}

// settle acks or releases batch (one lane's, in delivery order).
// settleMu is held.
func (m *member) settle(batch []*consumer.Message, a action) {
	if a == ack {
		err := m.src.Ack(context.Background(), batch)
		m.mu.Lock()
		if err != nil {
			m.problems = append(m.problems, fmt.Sprintf("Ack of %s: %v", batch[0].Coordinates(), err))
		}
		for _, msg := range batch {
			m.acked[string(msg.Value)]++
		}
		m.mu.Unlock()
		return
	}
	m.src.Release(batch, errReleased)
	m.mu.Lock()
	m.releasedMs = append(m.releasedMs, batch...)
	m.mu.Unlock()
}

// settleHeld settles every lane's unsettled messages with a (ack or
// release), lane by lane in delivery order, and lets the policy decide for
// what comes later.
func (m *member) settleHeld(t *testing.T, a action) {
	t.Helper()
	m.settleMu.Lock()
	defer m.settleMu.Unlock()
	m.mu.Lock()
	var batches [][]*consumer.Message
	for _, name := range slices.Sorted(maps.Keys(m.lanesOf)) {
		l := m.lanesOf[name]
		if len(l.queue) == 0 {
			continue
		}
		batch := make([]*consumer.Message, len(l.queue))
		for i, e := range l.queue {
			batch[i] = e.m
		}
		batches = append(batches, batch)
		l.queue, l.held = nil, false
	}
	m.mu.Unlock()
	for _, b := range batches {
		m.settle(b, a)
	}
}

// cancelRun ends Run's context; deliveries from then on are refused.
func (m *member) cancelRun() {
	m.mu.Lock()
	m.ctxDone = true
	m.mu.Unlock()
	m.cancel()
}

// returnsWithin reports whether Run returns within d.
func (m *member) returnsWithin(d time.Duration) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case err := <-m.done:
		m.done <- err
		return true
	case <-timer.C:
		return false
	}
}

func (m *member) isStopped() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.stopped
}

// stop ends Run's context, settles what is held with a, and waits until
// Run returned; it fails the test if Run does not return, returns an error,
// or the member saw the source break the contract.
func (m *member) stop(t *testing.T, a action) {
	t.Helper()
	m.mu.Lock()
	m.stopped = true
	m.mu.Unlock()
	m.cancelRun()
	m.settleHeld(t, a)
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case err := <-m.done:
		if err != nil {
			t.Errorf("%s: Run returned %v after its context ended, want nil", m.name, err)
		}
	case <-timer.C:
		m.mu.Lock()
		unsettled := 0
		for _, l := range m.lanesOf {
			unsettled += len(l.queue)
		}
		m.mu.Unlock()
		t.Errorf("%s: Run did not return within %v after its context ended (%d delivered messages left unsettled by the suite)",
			m.name, wait, unsettled)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, p := range m.problems {
		t.Errorf("%s: %s", m.name, p)
	}
	m.problems = nil
}

// deliveries returns what was delivered, in delivery order.
func (m *member) deliveries() []*consumer.Message {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.delivered)
}

func (m *member) released() []*consumer.Message {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.releasedMs)
}

// refusedLanes returns the lanes the member refused a delivery on.
func (m *member) refusedLanes() map[string]bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[string]bool{}
	for l := range m.refused {
		out[l] = true
	}
	return out
}

func (m *member) lanes() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for name := range m.lanesOf {
		out = append(out, name)
	}
	return out
}

// deliveredOf returns the deliveries whose values are in vals, as
// "value (coordinates)".
func (m *member) deliveredOf(vals map[string]bool) []string {
	var out []string
	for _, d := range m.deliveries() {
		if vals[string(d.Value)] {
			out = append(out, fmt.Sprintf("%s (%s)", d.Value, d.Coordinates()))
		}
	}
	return out
}

// waitFor polls cond until it holds, failing the test after wait with
// what, the progress cond reported and what the member saw.
func (m *member) waitFor(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for {
		ok, progress := cond()
		if ok {
			return
		}
		m.mu.Lock()
		returned, n, probs := m.returned, len(m.delivered), slices.Clone(m.problems)
		m.mu.Unlock()
		if returned {
			err := <-m.done
			m.done <- err
			t.Fatalf("%s: Run returned (%v) before %s (%s)", m.name, err, what, progress)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: gave up after %v waiting for %s (%s; %d deliveries; problems %q)", m.name, wait, what, progress, n, probs)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitCount waits until n messages were delivered.
func (m *member) waitCount(t *testing.T, what string, n int) {
	t.Helper()
	m.waitFor(t, what, func() (bool, string) {
		got := len(m.deliveries())
		return got >= n, fmt.Sprintf("%d delivered", got)
	})
}

// waitValues waits until every value in want was delivered.
func (m *member) waitValues(t *testing.T, what string, want map[string]bool) {
	t.Helper()
	m.waitEach(t, what, want, m.seen, "delivered")
}

// waitAcked waits until every value in want was acked.
func (m *member) waitAcked(t *testing.T, what string, want map[string]bool) {
	t.Helper()
	m.waitEach(t, what, want, m.acked, "acked")
}

// waitEach waits until every value in want is counted in counts (m.seen
// or m.acked, read under m.mu); done says what the count means.
func (m *member) waitEach(t *testing.T, what string, want map[string]bool, counts map[string]int, done string) {
	t.Helper()
	m.waitFor(t, what, func() (bool, string) {
		m.mu.Lock()
		defer m.mu.Unlock()
		missing := 0
		for v := range want {
			if counts[v] == 0 {
				missing++
			}
		}
		return missing == 0, fmt.Sprintf("%d of %d not %s yet", missing, len(want), done)
	})
}

// waitSettled waits until the settler has settled every delivery the
// policy did not hold.
func (m *member) waitSettled(t *testing.T) {
	t.Helper()
	m.waitFor(t, "the suite to settle what was delivered", func() (bool, string) {
		m.mu.Lock()
		defer m.mu.Unlock()
		n := 0
		for _, l := range m.lanesOf {
			if !l.held {
				n += len(l.queue)
			}
		}
		return n == 0, fmt.Sprintf("%d to settle", n)
	})
}
