package kafka

import (
	"strings"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/idemkit/idem/consumer"
)

func testPartition(start int64) *partition {
	return newPartition(&generation{wake: make(chan struct{}, 1)}, "orders", kafkago.PartitionAssignment{ID: 3, Offset: start})
}

func deliverN(p *partition, offsets ...int64) []*consumer.Message {
	msgs := make([]*consumer.Message, len(offsets))
	for i, off := range offsets {
		msgs[i] = p.message(&kafkago.Message{Topic: "orders", Partition: 3, Offset: off, Key: []byte("k"), Value: []byte("v"),
			Headers: []kafkago.Header{{Key: "h", Value: []byte("x")}}})
		p.push(msgs[i])
	}
	return msgs
}

func wantCommit(t *testing.T, p *partition, want int64) {
	t.Helper()
	got, _, ok := p.toCommit()
	if want < 0 {
		if ok {
			t.Fatalf("commit %d, want none", got)
		}
		return
	}
	if !ok || got != want {
		t.Fatalf("commit (%d, %v), want %d", got, ok, want)
	}
}

func TestMessageEnvelope(t *testing.T) {
	p := testPartition(kafkago.FirstOffset)
	m := deliverN(p, 42)[0]
	if m.ID != "orders/3/42" || m.Lane != "orders/3" || m.Coordinates() != m.ID {
		t.Fatalf("ID %q, Lane %q", m.ID, m.Lane)
	}
	if m.Topic != "orders" || m.Partition != 3 || m.Offset != 42 || m.Attempt != 1 {
		t.Fatalf("envelope %+v", m)
	}
	if v, ok := m.Header("h"); !ok || string(v) != "x" {
		t.Fatalf("header h = %q, %v", v, ok)
	}
	raw, ok := m.Raw.(*kafkago.Message)
	if !ok || raw.Offset != 42 || string(raw.Key) != "k" {
		t.Fatalf("Raw = %#v", m.Raw)
	}
}

func TestWatermarkIsContiguousAckedPrefix(t *testing.T) {
	p := testPartition(10)              // the group had committed 10
	msgs := deliverN(p, 10, 11, 13, 14) // 12 was compacted away
	wantCommit(t, p, -1)

	p.settle(msgs[2], acked) // 13 before 10 and 11
	wantCommit(t, p, -1)
	p.settle(msgs[1], acked)
	wantCommit(t, p, -1)
	if commit, _ := p.settle(msgs[0], acked); !commit {
		t.Fatal("acking the head did not ask for a commit")
	}
	wantCommit(t, p, 14) // 10, 11 and 13 acked: resume at 14
	p.committedTo(14, 0)
	wantCommit(t, p, -1)

	_, idle := p.settle(msgs[3], acked)
	if !idle {
		t.Fatal("all acked, but the partition is not idle")
	}
	wantCommit(t, p, 15)
}

func TestReleaseHoldsTheWatermark(t *testing.T) {
	p := testPartition(kafkago.FirstOffset)
	msgs := deliverN(p, 0, 1, 2, 3)
	p.settle(msgs[0], acked)
	p.settle(msgs[2], acked) // acked before the release of 1, as a batch's acks are
	p.settle(msgs[1], released)
	p.settle(msgs[3], acked)
	wantCommit(t, p, 1)
	if p.busy() {
		t.Fatal("everything is settled, but the partition is busy")
	}
}

func TestAcksOfOtherAssignmentsAreDropped(t *testing.T) {
	old := testPartition(kafkago.FirstOffset)
	stale := deliverN(old, 0, 1)
	old.end()
	if commit, _ := old.settle(stale[0], acked); commit {
		t.Fatal("an ended assignment asked for a commit")
	}

	// The partition is assigned again and redelivered from 0: the lane may
	// still ack the first assignment's copies, which must not count here.
	p := testPartition(kafkago.FirstOffset)
	fresh := deliverN(p, 0, 1)
	p.settle(stale[0], acked)
	p.settle(stale[1], acked)
	wantCommit(t, p, -1)
	if !p.busy() {
		t.Fatal("stale acks settled fresh deliveries")
	}
	p.settle(fresh[0], acked)
	p.settle(fresh[0], acked) // twice: no effect
	wantCommit(t, p, 1)
}

func TestCommitNeverGoesBelowTheAssignedOffset(t *testing.T) {
	p := testPartition(100) // committed 100, but the log was truncated to 50
	msgs := deliverN(p, 50, 51)
	p.settle(msgs[0], acked)
	p.settle(msgs[1], acked)
	wantCommit(t, p, -1)
	p.committedTo(90, 0) // a late, lower success changes nothing
	if _, _, ok := p.toCommit(); ok {
		t.Fatal("commit below 100")
	}
}

// The fetcher resets below what it delivered (the topic was recreated, the
// log truncated): the lane still holds the old log's messages when the new
// log's come. Every ack lands, none of the old log's offsets is committed
// for the new one, and nothing stays unsettled for Stop to wait on.
func TestWatermarkSurvivesAResetBackwards(t *testing.T) {
	p := testPartition(100)
	old := deliverN(p, 100, 101, 102)
	p.settle(old[0], acked) // the old log's watermark: 101
	fresh := deliverN(p, 0, 1)
	for _, m := range []*consumer.Message{fresh[0], old[1], old[2], fresh[1]} {
		p.settle(m, acked)
	}
	if p.busy() {
		t.Fatal("every message was acked, but the partition is busy: Stop would wait forever")
	}
	wantCommit(t, p, 2) // the new log's watermark
}

// The fetcher says it reset below what it delivered: a new epoch starts at
// the reset offset, which is committed at once (a restart must not resume
// at an offset of the old log); the old log's acks and a commit of it that
// completes late change nothing.
func TestRestartStartsANewEpoch(t *testing.T) {
	p := testPartition(100)
	old := deliverN(p, 100, 101, 102)
	p.settle(old[0], acked)
	off, epoch, _ := p.toCommit() // 101, in flight
	if !p.restart(0) {
		t.Fatal("a restart asked for no commit")
	}
	wantCommit(t, p, 0)
	p.committedTo(off, epoch) // the old log's commit completes
	wantCommit(t, p, 0)
	_, epoch, _ = p.toCommit()
	p.committedTo(0, epoch)
	wantCommit(t, p, -1)

	fresh := deliverN(p, 0, 1)
	p.settle(old[1], acked)
	p.settle(old[2], released)
	wantCommit(t, p, -1)
	if !p.busy() {
		t.Fatal("the old log's acks settled the new log's messages")
	}
	p.settle(fresh[1], acked)
	p.settle(fresh[0], acked)
	wantCommit(t, p, 2)
	if p.busy() {
		t.Fatal("everything is settled, but the partition is busy")
	}
}

// Offsets the fetcher passed over without delivering (transaction markers,
// aborted or compacted records) count as acked: the watermark moves past
// them once what was delivered before them is acked, and not past a
// released message.
func TestPassedOffsetsCountAsAcked(t *testing.T) {
	p := testPartition(kafkago.FirstOffset)
	msgs := deliverN(p, 0, 1)
	p.passed(3) // 2 is a commit marker
	wantCommit(t, p, -1)
	p.settle(msgs[1], acked)
	p.settle(msgs[0], acked)
	wantCommit(t, p, 3)

	p.passed(9) // an aborted transaction and its marker, nothing pending
	wantCommit(t, p, 9)

	msgs = deliverN(p, 9)
	p.passed(11)
	p.passed(12)
	p.settle(msgs[0], released)
	wantCommit(t, p, 9)
	if p.busy() {
		t.Fatal("everything is settled, but the partition is busy")
	}
}

func TestUnpushForgetsARefusedDelivery(t *testing.T) {
	p := testPartition(kafkago.FirstOffset)
	msgs := deliverN(p, 0, 1)
	p.unpush(msgs[1])
	p.settle(msgs[0], acked)
	wantCommit(t, p, 1)
	if p.busy() {
		t.Fatal("a refused delivery stays unsettled")
	}
}

func TestConfigErrorsNameFields(t *testing.T) {
	cases := []struct {
		cfg  Config
		want string
	}{
		{Config{}, "Config.Brokers"},
		{Config{Brokers: []string{"nohost"}, Topics: []string{"t"}, Group: "g"}, "Config.Brokers[0]"},
		{Config{Brokers: []string{"h:1"}, Group: "g"}, "Config.Topics"},
		{Config{Brokers: []string{"h:1"}, Topics: []string{"a/b"}, Group: "g"}, "Config.Topics[0]"},
		{Config{Brokers: []string{"h:1"}, Topics: []string{"t", "t"}, Group: "g"}, "Config.Topics[1]"},
		{Config{Brokers: []string{"h:1"}, Topics: []string{"t"}}, "Config.Group"},
		{Config{Brokers: []string{"h:1"}, Topics: []string{"t"}, Group: "g", StartFrom: 5}, "Config.StartFrom"},
		{Config{Brokers: []string{"h:1"}, Topics: []string{"t"}, Group: "g", MaxWait: -1}, "Config.MaxWait"},
		{Config{Brokers: []string{"h:1"}, Topics: []string{"t"}, Group: "g", SessionTimeout: 1, HeartbeatInterval: 2}, "Config.HeartbeatInterval"},
		{Config{Brokers: []string{"h:1"}, Topics: []string{"t"}, Group: "g", HeartbeatInterval: time.Minute}, "Config.HeartbeatInterval"},
		{Config{Brokers: []string{"h:1"}, Topics: []string{"t"}, Group: "g", DeadLetterTopic: "t/dlq"}, "Config.DeadLetterTopic"},
		{Config{Brokers: []string{"h:1"}, Topics: []string{"t"}, Group: "g", DeadLetterMaxBytes: -1}, "Config.DeadLetterMaxBytes"},
		{Config{Brokers: []string{"h:1"}, Topics: []string{"t"}, Group: "g", DeadLetterTimeout: -1}, "Config.DeadLetterTimeout"},
		{Config{Brokers: []string{"h:1"}, Topics: []string{"t"}, Group: "g", RetryDelays: []time.Duration{0}}, "Config.RetryDelays[0]"},
		{Config{Brokers: []string{"h:1"}, Topics: []string{"t"}, Group: "g", RetryDelays: []time.Duration{time.Microsecond}}, "Config.RetryDelays[0]"},
		{Config{Brokers: []string{"h:1"}, Topics: []string{"t"}, Group: "g", RetryDelays: []time.Duration{time.Second, time.Second}}, "Config.RetryDelays[1]"},
		{Config{Brokers: []string{"h:1"}, Topics: []string{"t", "t.retry.1s"}, Group: "g", RetryDelays: []time.Duration{time.Second}}, "Config.Topics lists \"t.retry.1s\""},
	}
	for _, c := range cases {
		_, err := New(c.cfg)
		if err == nil {
			t.Errorf("New(%+v) accepted", c.cfg)
			continue
		}
		if !strings.Contains(err.Error(), c.want) {
			t.Errorf("New(%+v): %v; want it to name %s", c.cfg, err, c.want)
		}
	}
	if _, err := New(Config{Brokers: []string{"h:1"}, Topics: []string{"t"}, Group: "g"}); err != nil {
		t.Fatalf("minimal config: %v", err)
	}
}
