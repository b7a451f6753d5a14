package otelconsumer_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/consumer/otelconsumer"
	"github.com/idemkit/idem/consumer/source"
	"github.com/idemkit/idem/consumer/wire"
	"github.com/idemkit/idem/dedup/memstore"
)

// infoSource says it is a RocketMQ source of group g1.
type infoSource struct{ *consumertest.Source }

func (s infoSource) Describe() source.Description {
	d := s.Source.Describe()
	d.System, d.Group = "rocketmq", "g1"
	return d
}

// wrapper embeds the Source interface, as a timing or logging wrapper
// does, and records the messages it delivered; the Description is the
// wrapped source's.
type wrapper struct {
	source.Source
	mu        sync.Mutex
	delivered map[*consumer.Message]bool
}

func (w *wrapper) Run(ctx context.Context, deliver source.DeliverFunc) error {
	return w.Source.Run(ctx, func(ctx context.Context, m *consumer.Message) error {
		w.mu.Lock()
		w.delivered[m] = true
		w.mu.Unlock()
		return deliver(ctx, m)
	})
}

// run runs a consumer over msgs on a source that describes itself through
// a wrapper, until they are settled, and returns it stopped.
func run(t *testing.T, tel *otelconsumer.Telemetry, sink consumer.DeadLetter, before func(*consumer.Consumer[*memstore.Tx]), msgs ...*consumer.Message) (*consumer.Consumer[*memstore.Tx], *wrapper) {
	t.Helper()
	inner := consumertest.NewSource(consumertest.Script{})
	src := &wrapper{Source: infoSource{inner}, delivered: map[*consumer.Message]bool{}}
	c, err := consumer.New(consumer.Config[*memstore.Tx]{
		Name: "payments", Source: src, Store: memstore.New(memstore.Config{}), DeadLetter: sink,
		Handler: consumer.HandlerFunc[*memstore.Tx](func(_ context.Context, _ *memstore.Tx, m *consumer.Message) error {
			if id, _ := consumer.ByJSONField("txn_id")(m); id == "T00004" {
				return consumer.Permanent(errors.New("account closed"))
			}
			return nil
		}),
		Key: consumer.ByJSONField("txn_id"), Observer: tel, Logger: quiet,
	})
	if err != nil {
		t.Fatal(err)
	}
	if before != nil {
		before(c)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.Run(context.Background()) }()
	inner.Push(msgs...)
	if err := inner.WaitIdle(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	return c, src
}

// points returns a metric's points by their attribute sets.
func points(t *testing.T, ms map[string]metricdata.Metrics, name string) map[attribute.Distinct]metricdata.DataPoint[int64] {
	t.Helper()
	out := map[attribute.Distinct]metricdata.DataPoint[int64]{}
	switch d := ms[name].Data.(type) {
	case metricdata.Sum[int64]:
		for _, p := range d.DataPoints {
			out[p.Attributes.Equivalent()] = p
		}
	case metricdata.Gauge[int64]:
		for _, p := range d.DataPoints {
			out[p.Attributes.Equivalent()] = p
		}
	default:
		t.Errorf("metric %s: %T, no int64 points", name, ms[name].Data)
	}
	return out
}

// TestTelemetryFromTheSource: with neither System nor Group configured,
// every point carries the messaging system and the consumer group the
// Source says it has (found through a wrapper's Unwrap); Config's fields
// override them.
func TestTelemetryFromTheSource(t *testing.T) {
	s := newSDK(t)
	tel, err := otelconsumer.New(otelconsumer.Config{MeterProvider: s.mp, TracerProvider: s.tp})
	if err != nil {
		t.Fatal(err)
	}
	c, _ := run(t, tel, &consumertest.DeadLetters{}, nil,
		consumertest.Message("pay", 0, 0, "", payment(1)), consumertest.Message("pay", 1, 0, "", payment(2)))
	if info := c.SourceInfo(); info.System != "rocketmq" || info.Group != "g1" {
		t.Fatalf("SourceInfo %+v", info)
	}
	ms := s.metrics(t)
	if got := total(t, ms, "idem.consumer.applied", attribute.String("messaging.system", "rocketmq"),
		attribute.String("messaging.consumer.group.name", "g1"), attribute.String("idem.consumer.name", "payments")); got != 2 {
		t.Errorf("applied with the source's system and group: %d, want 2", got)
	}
	for _, sp := range s.spans.Ended() {
		if sp.Name() != "process pay" {
			continue
		}
		set := attribute.NewSet(sp.Attributes()...)
		if v, _ := set.Value("messaging.system"); v.AsString() != "rocketmq" {
			t.Errorf("batch span's messaging.system %q", v.AsString())
		}
	}

	s2 := newSDK(t)
	over, err := otelconsumer.New(otelconsumer.Config{System: "custom", Group: "mine", MeterProvider: s2.mp})
	if err != nil {
		t.Fatal(err)
	}
	run(t, over, &consumertest.DeadLetters{}, nil, consumertest.Message("pay", 0, 0, "", payment(1)))
	if got := total(t, s2.metrics(t), "idem.consumer.applied", attribute.String("messaging.system", "custom"),
		attribute.String("messaging.consumer.group.name", "mine")); got != 1 {
		t.Errorf("applied with Config's system and group: %d, want 1", got)
	}
}

// TestDeadLettersTracedWithoutAWrapper: given the bare sink, the consumer
// writes each letter under a dead-letter span whose trace context the
// letter carries instead of the producer's; the sink is handed the very
// message the source delivered (a RocketMQ source finds its in-flight
// message by it); a sink wrapped by hand is not traced twice.
func TestDeadLettersTracedWithoutAWrapper(t *testing.T) {
	for _, wrapped := range []bool{false, true} {
		s := newSDK(t)
		tel, err := otelconsumer.New(otelconsumer.Config{MeterProvider: s.mp, TracerProvider: s.tp})
		if err != nil {
			t.Fatal(err)
		}
		dl := &consumertest.DeadLetters{}
		var sink consumer.DeadLetter = dl
		if wrapped {
			sink = tel.DeadLetter(dl)
		}
		var msgs []*consumer.Message
		producers := map[trace.SpanID]bool{}
		for i := range 6 {
			m := consumertest.Message("pay", 0, int64(i), "", payment(i))
			h, sc := traceparent(s.tp)
			m.Headers = append(m.Headers, h, consumer.Header{Key: "tracestate", Value: []byte("producer=1")})
			producers[sc.SpanID()] = true
			msgs = append(msgs, m)
		}
		_, src := run(t, tel, sink, nil, msgs...)
		spans := map[trace.SpanID]string{}
		var deadSpans int
		for _, sp := range s.spans.Ended() {
			spans[sp.SpanContext().SpanID()] = sp.Name()
			if sp.Name() == "dead_letter pay" {
				deadSpans++
			}
		}
		letters := dl.Letters()
		if len(letters) != 1 || deadSpans != 1 {
			t.Fatalf("wrapped %v: %d letters, %d dead-letter spans; want 1 and 1", wrapped, len(letters), deadSpans)
		}
		l := letters[0]
		src.mu.Lock()
		same := src.delivered[l.Message]
		src.mu.Unlock()
		if !same {
			t.Errorf("wrapped %v: the sink got a copy of the message, not the one delivered", wrapped)
		}
		headers, _ := wire.Letter(l).Record(1 << 20)
		carrier := otelconsumer.HeaderCarrier{Headers: &headers}
		sc := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), carrier))
		if spans[sc.SpanID()] != "dead_letter pay" || producers[sc.SpanID()] {
			t.Errorf("wrapped %v: the letter carries trace context %v (%q), not its dead-letter span's", wrapped, sc, spans[sc.SpanID()])
		}
		if ts := carrier.Get("tracestate"); ts != "" {
			t.Errorf("wrapped %v: the letter kept the producer's tracestate %q", wrapped, ts)
		}
		own := propagation.TraceContext{}.Extract(context.Background(), otelconsumer.HeaderCarrier{Headers: &l.Message.Headers})
		if !producers[trace.SpanContextFromContext(own).SpanID()] {
			t.Errorf("wrapped %v: the message's own traceparent was changed: %v", wrapped, l.Message.Headers)
		}
	}
}

// TestObserveExportsEveryCounterFromZero: right after Observe, before Run
// and before any message, a collection lists every counter at 0 — dead
// letters for each cause, retries for each retried class — and the health
// gauges, all with the consumer's attributes.
func TestObserveExportsEveryCounterFromZero(t *testing.T) {
	s := newSDK(t)
	tel, err := otelconsumer.New(otelconsumer.Config{MeterProvider: s.mp})
	if err != nil {
		t.Fatal(err)
	}
	checked := false
	run(t, tel, &consumertest.DeadLetters{}, func(c *consumer.Consumer[*memstore.Tx]) {
		reg, err := tel.Observe(c, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = reg.Unregister() })
		ms := s.metrics(t)
		base := []attribute.KeyValue{attribute.String("messaging.system", "rocketmq"),
			attribute.String("messaging.consumer.group.name", "g1"), attribute.String("idem.consumer.name", "payments")}
		want := map[string][]attribute.KeyValue{
			"messaging.client.consumed.messages": {attribute.String("messaging.operation.name", "process")},
			"idem.consumer.applied":              nil,
			"idem.consumer.duplicates":           nil,
			"idem.consumer.stale":                nil,
			"idem.consumer.released":             nil,
			"idem.consumer.conflicts":            nil,
			"idem.consumer.transactions":         {attribute.String("idem.transaction.outcome", "commit")},
			"idem.consumer.in_flight":            nil,
			"idem.consumer.lanes.stopped":        nil,
			"idem.consumer.lanes.stalled":        nil,
		}
		for _, c := range wire.Causes() {
			want["idem.consumer.dead_letters/"+c.String()] = []attribute.KeyValue{attribute.String("idem.dead_letter.cause", c.String())}
		}
		for _, class := range []string{"unknown", "retryable", "unavailable", "conflict"} {
			want["idem.consumer.retries/"+class] = []attribute.KeyValue{attribute.String("error.type", class)}
		}
		for key, extra := range want {
			name, _, _ := strings.Cut(key, "/")
			set := attribute.NewSet(append(append([]attribute.KeyValue(nil), base...), extra...)...)
			p, ok := points(t, ms, name)[set.Equivalent()]
			if !ok || p.Value != 0 {
				t.Errorf("%s: no point at 0 for %v (found %v, %d)", key, set.ToSlice(), ok, p.Value)
			}
		}
		checked = true
	}, consumertest.Message("pay", 0, 0, "", payment(1)))
	if !checked {
		t.Fatal("not checked")
	}
	// After the run the counters went on from there.
	if got := total(t, s.metrics(t), "idem.consumer.applied", attribute.String("idem.consumer.name", "payments")); got != 1 {
		t.Errorf("applied %d after one message, want 1", got)
	}
}

// TestPartitionIDNamesTheBroker: RocketMQ's queue 0 of two brokers are two
// partitions of the topic, not one.
func TestPartitionIDNamesTheBroker(t *testing.T) {
	s := newSDK(t)
	tel, err := otelconsumer.New(otelconsumer.Config{MeterProvider: s.mp})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, lane := range []string{"pay/broker-a/0", "pay/broker-b/0", "pay/broker-b/0"} {
		m := consumertest.Message("pay", 0, 0, "", "x")
		m.Lane = lane
		b := consumer.Batch{Consumer: "payments", Source: consumer.SourceInfo{System: "rocketmq", Group: "g"}, Lane: lane, Messages: []*consumer.Message{m}}
		bctx := tel.BatchStart(ctx, b)
		b.Acked = b.Messages
		tel.BatchEnd(bctx, b)
	}
	ms := s.metrics(t)
	for id, want := range map[string]int64{"broker-a/0": 1, "broker-b/0": 2} {
		if got := total(t, ms, "messaging.client.consumed.messages", attribute.String("messaging.destination.partition.id", id)); got != want {
			t.Errorf("partition %s: %d consumed, want %d", id, got, want)
		}
	}
	kafka := consumertest.Message("pay", 3, 9, "", "x")
	retry := consumertest.Message("pay", 0, 1, "", "x")
	retry.Lane = "%RETRY%g/broker-a/0"
	for m, want := range map[*consumer.Message]string{kafka: "3", retry: "%RETRY%g/broker-a/0", {Topic: "t", Partition: 2}: "2"} {
		if got := otelconsumer.PartitionID(m); got != want {
			t.Errorf("PartitionID(lane %q) = %q, want %q", m.Lane, got, want)
		}
	}
}
