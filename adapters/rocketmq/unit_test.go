package rocketmq

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/rlog"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/wire"
	"github.com/idemkit/idem/dedup"
)

func TestToMessage(t *testing.T) {
	mx := &primitive.MessageExt{MsgId: "7F0000011F9018B4AAC2", QueueOffset: 42, ReconsumeTimes: 2, BornTimestamp: 1700000000123}
	mx.Topic = "payments"
	mx.Body = []byte(`{"txn_id":"T1"}`)
	mx.Queue = &primitive.MessageQueue{Topic: "%RETRY%ledger", BrokerName: "broker-a", QueueId: 0}
	mx.WithProperty(primitive.PropertyKeys, "T1")
	mx.WithProperty(primitive.PropertyTags, "paid")
	mx.WithProperty(primitive.PropertyUniqueClientMessageIdKeyIndex, mx.MsgId)
	mx.WithProperty(primitive.PropertyRetryTopic, "payments")
	mx.WithProperty(primitive.PropertyConsumeStartTime, "1")
	mx.WithProperty("tenant", "acme")
	mx.WithProperty("Idempotency-Key", "k-9")

	m := toMessage(mx, laneOf(mx.Queue))
	if m.ID != mx.MsgId || string(m.Key) != "T1" || m.Attempt != 3 || m.Topic != "payments" ||
		m.Partition != 0 || m.Offset != 42 || m.Lane != "%RETRY%ledger/broker-a/0" || m.Raw != mx ||
		m.Time.UnixMilli() != 1700000000123 || string(m.Value) != `{"txn_id":"T1"}` {
		t.Fatalf("converted %+v", m)
	}
	if len(m.Headers) != 2 || m.Headers[0].Key != "Idempotency-Key" || m.Headers[1].Key != "tenant" {
		t.Fatalf("headers %+v, want the two user properties, sorted", m.Headers)
	}
	if v, _ := m.Header("tenant"); string(v) != "acme" {
		t.Fatalf("tenant header %q", v)
	}
	if k, err := consumer.ByMessageID()(m); err != nil || k != mx.MsgId {
		t.Fatalf("ByMessageID = %q, %v", k, err)
	}
}

// TestMessageID: the ID is the UNIQ_KEY, else ORIGIN_MESSAGE_ID (a copy
// from the retry topic of a message without UNIQ_KEY), else the OffsetMsgId
// (its first delivery), so that a message and its retried copies agree; a
// message without any of them has no ID and is refused by ByMessageID. A
// message delivered without UNIQ_KEY gets its ID as UNIQ_KEY in the
// client's copy, which the client's fallback send-back carries along.
func TestMessageID(t *testing.T) {
	const offsetID, origin, uniq = "7F00000100002A9F0000000000148C83", "7F00000100002A9F0000000000100000", "C0000202221230946E090002FC860000"
	for _, tc := range []struct {
		name           string
		offset         string
		props          map[string]string
		want, wantUniq string
	}{
		{"UNIQ_KEY", offsetID, map[string]string{primitive.PropertyUniqueClientMessageIdKeyIndex: uniq}, uniq, uniq},
		{"UNIQ_KEY of a retried copy", offsetID, map[string]string{primitive.PropertyUniqueClientMessageIdKeyIndex: uniq,
			primitive.PropertyOriginMessageId: origin}, uniq, uniq},
		{"retried copy without UNIQ_KEY", offsetID, map[string]string{primitive.PropertyOriginMessageId: origin}, origin, origin},
		{"first delivery without UNIQ_KEY", offsetID, nil, offsetID, offsetID},
		{"nothing", "", nil, "", ""},
	} {
		mx := &primitive.MessageExt{OffsetMsgId: tc.offset, MsgId: tc.offset}
		mx.Topic = "payments"
		for k, v := range tc.props {
			mx.WithProperty(k, v)
		}
		m := toMessage(mx, "payments/broker-a/0")
		if m.ID != tc.want {
			t.Errorf("%s: ID %q, want %q", tc.name, m.ID, tc.want)
		}
		if got := mx.GetProperty(primitive.PropertyUniqueClientMessageIdKeyIndex); got != tc.wantUniq {
			t.Errorf("%s: UNIQ_KEY of the client's copy %q, want %q", tc.name, got, tc.wantUniq)
		}
		if mx.MsgId != tc.offset {
			t.Errorf("%s: MsgId changed to %q", tc.name, mx.MsgId)
		}
		if _, err := consumer.ByMessageID()(m); (err != nil) != (tc.want == "") || err != nil && !errors.Is(err, consumer.ErrNoKey) {
			t.Errorf("%s: ByMessageID error %v", tc.name, err)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	ok := Config{NameServers: []string{"127.0.0.1:9876"}, Group: "g", Topics: []string{"t"}}
	if err := ok.validate(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		edit  func(*Config)
		field string
	}{
		{"no name server", func(c *Config) { c.NameServers = nil }, "NameServers"},
		{"bad name server", func(c *Config) { c.NameServers = []string{"localhost"} }, "NameServers[0]"},
		{"no group", func(c *Config) { c.Group = "" }, "Group"},
		{"bad group", func(c *Config) { c.Group = "a.b" }, "Group"},
		{"no topics", func(c *Config) { c.Topics = nil }, "Topics"},
		{"bad topic", func(c *Config) { c.Topics = []string{"a/b"} }, "Topics[0]"},
		{"twice", func(c *Config) { c.Topics = []string{"a", "a"} }, "Topics[1]"},
		{"batch", func(c *Config) { c.BatchMaxSize = 2000 }, "BatchMaxSize"},
		{"broker DLQ batch", func(c *Config) { c.DeadLetter, c.BatchMaxSize = DeadLetterBroker, 8 }, "BatchMaxSize"},
		{"broker DLQ topic", func(c *Config) { c.DeadLetter, c.DeadLetterTopic = DeadLetterBroker, "x" }, "DeadLetterTopic"},
		{"delay level", func(c *Config) { c.RetryDelayLevel = 19 }, "RetryDelayLevel"},
		{"mode", func(c *Config) { c.DeadLetter = 7 }, "DeadLetter"},
		{"credentials", func(c *Config) { c.AccessKey = "ak" }, "AccessKey"},
		{"suspend", func(c *Config) { c.SuspendTime = -1 }, "SuspendTime"},
		{"retry delay", func(c *Config) { c.RetryDelays = []time.Duration{time.Second, 0} }, "RetryDelays[1]"},
		{"retry delay past the broker's", func(c *Config) { c.RetryDelays = []time.Duration{4 * 24 * time.Hour} }, "RetryDelays[0]"},
		{"retry delay twice", func(c *Config) { c.RetryDelays = []time.Duration{time.Second, time.Second} }, "RetryDelays[1]"},
		{"retry topic listed", func(c *Config) { c.Topics, c.RetryDelays = []string{"t", "t_RETRY"}, []time.Duration{time.Second} }, "Topics lists"},
	} {
		c := ok
		tc.edit(&c)
		err := c.validate()
		if err == nil || !strings.Contains(err.Error(), "Config."+tc.field) {
			t.Errorf("%s: error %v, want one naming Config.%s", tc.name, err, tc.field)
		}
	}
	c := ok
	c.DeadLetter = DeadLetterBroker
	if err := c.validate(); err != nil {
		t.Fatal(err)
	}
	c.setDefaults()
	if c.BatchMaxSize != 1 {
		t.Fatalf("BatchMaxSize defaults to %d with DeadLetterBroker, want 1", c.BatchMaxSize)
	}
	a, b := ok, ok
	a.setDefaults()
	b.setDefaults()
	if a.InstanceName == b.InstanceName {
		t.Fatalf("two sources share the instance name %q", a.InstanceName)
	}
}

func TestLetter(t *testing.T) {
	s := &Source{cfg: *testConfig(false, DeadLetterTopic)}
	s.cfg.DeadLetterMaxBytes = 8
	mx := batch(1, 3)[0]
	mx.WithProperty(primitive.PropertyKeys, "K1")
	mx.WithProperty("tenant", "acme")
	mx.WithProperty(wire.MetaReason, "stale reason of an earlier dead letter")
	m := toMessage(mx, laneOf(mx.Queue))
	m.Value = []byte("a body longer than eight bytes")
	l := s.letter(consumer.Letter{Message: m, Key: dedup.Key{Scope: "ledger", ID: "K1"},
		Reason: errors.New("bad\x01input\x02here"), Attempts: 3})
	want := map[string]string{
		wire.MetaReason: "bad input here", wire.MetaAttempts: "3", wire.MetaTopic: "t",
		wire.MetaPartition: "3", wire.MetaLane: "t/b/3", wire.MetaOffset: "0",
		wire.MetaMessageID: "ida", wire.MetaKeyScope: "ledger", wire.MetaKey: "K1",
		wire.MetaAttempt: "1", wire.MetaValueSize: "30", primitive.PropertyKeys: "K1", "tenant": "acme",
	}
	for k, v := range want {
		if got := l.GetProperty(k); got != v {
			t.Errorf("property %s = %q, want %q", k, got, v)
		}
	}
	if l.Topic != "t_DLQ" || !bytes.HasPrefix(l.Body, []byte("idem: value left out")) || len(l.GetProperty(wire.MetaValueSHA256)) != 64 {
		t.Fatalf("letter to %s with body %q, %s %q", l.Topic, l.Body, wire.MetaValueSHA256, l.GetProperty(wire.MetaValueSHA256))
	}
}

func TestClientLogBridge(t *testing.T) {
	var buf bytes.Buffer
	installClientLogger()
	prev := bridgeDest.Load()
	defer bridgeDest.Store(prev)
	SetClientLogger(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})), slog.LevelWarn)

	mx := batch(2, 0)
	mx[0].Body = []byte("SECRET-CARD-NUMBER")
	rlog.Info("info is below the level", map[string]any{"x": 1})
	rlog.Warning("consumeMessageCurrently error", map[string]any{
		rlog.LogKeyMessages: mx, "message": mx[0], rlog.LogKeyUnderlayError: errors.New("boom"),
	})
	rlog.Fatal("fatal does not exit", nil)
	out := buf.String()
	if strings.Contains(out, "SECRET") || strings.Contains(out, "below the level") {
		t.Fatalf("bridge leaked a body or ignored the level:\n%s", out)
	}
	for _, want := range []string{"consumeMessageCurrently error", "2 messages: ida@t/0, idb@t/1", "boom", "fatal does not exit"} {
		if !strings.Contains(out, want) {
			t.Fatalf("bridge output lacks %q:\n%s", want, out)
		}
	}
	buf.Reset()
	rlog.SetLogLevel("debug")
	rlog.Debug("now debug shows", nil)
	if !strings.Contains(buf.String(), "now debug shows") {
		t.Fatalf("SetLogLevel(debug) had no effect: %q", buf.String())
	}
}

func TestDeadLetterOutsideRun(t *testing.T) {
	s, err := New(Config{NameServers: []string{"127.0.0.1:9876"}, Group: "g", Topics: []string{"t"}, Logger: quietLog})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.DeadLetter(context.Background(), consumer.Letter{Message: &consumer.Message{}}); !errors.Is(err, ErrNotRunning) {
		t.Fatalf("DeadLetter outside Run: %v, want ErrNotRunning", err)
	}
	s.Ack(context.Background(), []*consumer.Message{{}}) // no Run: a no-op
	s.Release([]*consumer.Message{{}}, consumer.ErrStopped)
}

// TestNotOffsetOrdered: a queue's failed message comes back through the
// group's retry topic behind later offsets, so the source must not offer
// consumer.Config.Offsets (which skips what lies below a stored offset).
func TestNotOffsetOrdered(t *testing.T) {
	if (&Source{}).Describe().OffsetOrdered {
		t.Fatal("*rocketmq.Source declares OffsetOrdered: Config.Offsets would skip retried messages")
	}
}

// TestProducerChosenIDs: a message's ID is its UNIQ_KEY, which a producer
// may set, so the source says so, and the consumer honours a redriven
// copy's original message ID wherever the copy lies; the lineage
// properties are user properties, kept as headers.
func TestProducerChosenIDs(t *testing.T) {
	if !(&Source{}).Describe().ProducerChosenIDs {
		t.Fatal("*rocketmq.Source does not declare ProducerChosenIDs")
	}
	mx := &primitive.MessageExt{QueueOffset: 3}
	mx.Topic = "payments"
	mx.Queue = &primitive.MessageQueue{Topic: "payments", BrokerName: "broker-b", QueueId: 1}
	mx.WithProperty(primitive.PropertyUniqueClientMessageIdKeyIndex, "AC1100010000B33100000009")
	for _, k := range []string{wire.MetaTopic, wire.MetaPartition, wire.MetaOffset, wire.MetaMessageID, wire.MetaRedriveCount, wire.MetaRedrivenFrom} {
		mx.WithProperty(k, "v-"+k)
	}
	m := toMessage(mx, laneOf(mx.Queue))
	if len(m.Headers) != 6 {
		t.Fatalf("headers %+v, want the six lineage properties", m.Headers)
	}
	for _, h := range m.Headers {
		if string(h.Value) != "v-"+h.Key {
			t.Errorf("header %s = %q", h.Key, h.Value)
		}
	}
}

func TestRetryCopy(t *testing.T) {
	s := &Source{cfg: *testConfig(false, DeadLetterTopic), retryOf: map[string]string{"t_RETRY": "t"}}
	s.cfg.DeadLetterMaxBytes = 8 // a retry copy carries its whole body all the same
	mx := batch(1, 3)[0]
	mx.WithProperty(primitive.PropertyKeys, "K1")
	mx.WithProperty(primitive.PropertyTags, "paid")
	mx.WithProperty("tenant", "acme")
	m := toMessage(mx, laneOf(mx.Queue))
	m.Value = []byte("a body longer than eight bytes")
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	r := consumer.RetryLetter{
		Letter: consumer.Letter{Message: m, Key: dedup.Key{Scope: "ledger", ID: "K1"}, Reason: errors.New("down")},
		Retry:  wire.Retry{Attempt: 2, Delay: 1500 * time.Millisecond, Due: now.Add(1500 * time.Millisecond), FirstFailure: now.Add(-time.Minute)},
	}
	c := s.retryCopy(r, now)
	want := map[string]string{
		wire.MetaRetryAttempt: "2", wire.MetaRetryDue: "2026-01-02T03:04:06.5Z", wire.MetaTopic: "t",
		wire.MetaPartition: "3", wire.MetaMessageID: "ida", primitive.PropertyKeys: "K1", primitive.PropertyTags: "paid",
		"tenant": "acme", timerDelayMs: "1500",
	}
	for k, v := range want {
		if got := c.GetProperty(k); got != v {
			t.Errorf("property %s = %q, want %q", k, got, v)
		}
	}
	if c.Topic != "t_RETRY" || string(c.Body) != string(m.Value) || c.Queue == nil || c.Queue.QueueId != 3 {
		t.Fatalf("copy to %s queue %v with body %q", c.Topic, c.Queue, c.Body)
	}
	mqs := []*primitive.MessageQueue{{QueueId: 0}, {QueueId: 1}}
	if q := (sameQueue{}).Select(c, mqs, ""); q != mqs[1] {
		t.Errorf("the copy of queue 3 goes to retry queue %d of 2, want 1", q.QueueId)
	}
	// Due already: no timer.
	if c := s.retryCopy(r, r.Due); c.GetProperty(timerDelayMs) != "" {
		t.Errorf("a copy due now has %s %q", timerDelayMs, c.GetProperty(timerDelayMs))
	}
	// A message of the retry topic whose lineage the consumer did not
	// honour: its copy and its letter go with its topic's, not with
	// t_RETRY_RETRY or t_RETRY_DLQ.
	mx2 := batch(1, 0)[0]
	mx2.Topic = "t_RETRY"
	m2 := toMessage(mx2, laneOf(mx2.Queue))
	if c := s.retryCopy(consumer.RetryLetter{Letter: consumer.Letter{Message: m2}, Retry: wire.Retry{Delay: time.Second, Due: now}}, now); c.Topic != "t_RETRY" {
		t.Errorf("copy of a retry-topic message to %s, want t_RETRY", c.Topic)
	}
	if l := s.letter(consumer.Letter{Message: m2}); l.Topic != "t_DLQ" {
		t.Errorf("letter of a retry-topic message to %s, want t_DLQ", l.Topic)
	}
}

// TestRetryCopyPastThePropertiesLimit: an original whose properties are
// near the broker's limit makes a copy past it (the copy adds its lineage
// and retry properties). The broker would refuse it (MESSAGE_ILLEGAL)
// however often it is sent: Retry refuses it with ErrRetryTooLarge, so the
// consumer dead-letters the message.
func TestRetryCopyPastThePropertiesLimit(t *testing.T) {
	s := &Source{cfg: *testConfig(false, DeadLetterTopic), retryOf: map[string]string{"t_RETRY": "t"}}
	s.cfg.RetryDelays = []time.Duration{time.Second}
	mx := batch(1, 3)[0]
	mx.WithProperty("note", strings.Repeat("n", maxPropertiesLen-200)) // fits, alone
	m := toMessage(mx, laneOf(mx.Queue))
	now := time.Now()
	r := consumer.RetryLetter{
		Letter: consumer.Letter{Message: m, Key: dedup.Key{Scope: "ledger", ID: "K1"}, Reason: errors.New("down")},
		Retry:  wire.Retry{Attempt: 1, Delay: time.Second, Due: now.Add(time.Second), FirstFailure: now},
	}
	if err := s.Retry(context.Background(), r); !errors.Is(err, consumer.ErrRetryTooLarge) {
		t.Fatalf("Retry: %v, want ErrRetryTooLarge", err)
	}
	mx.WithProperty("note", "short")
	if err := s.Retry(context.Background(), consumer.RetryLetter{
		Letter: consumer.Letter{Message: toMessage(mx, laneOf(mx.Queue))},
		Retry:  wire.Retry{Attempt: 1, Delay: time.Second, Due: now.Add(time.Second), FirstFailure: now},
	}); !errors.Is(err, ErrNotRunning) {
		t.Fatalf("Retry of a small copy outside Run: %v, want ErrNotRunning", err)
	}
}
