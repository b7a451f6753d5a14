package otelconsumer_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/goleak"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/consumer/otelconsumer"
	"github.com/idemkit/idem/consumer/wire"
	"github.com/idemkit/idem/dedup/memstore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// sdk is a meter and a tracer whose output a test reads.
type sdk struct {
	reader *sdkmetric.ManualReader
	spans  *tracetest.SpanRecorder
	mp     *sdkmetric.MeterProvider
	tp     *sdktrace.TracerProvider
}

func newSDK(t testing.TB) *sdk {
	s := &sdk{reader: sdkmetric.NewManualReader(), spans: tracetest.NewSpanRecorder()}
	s.mp = sdkmetric.NewMeterProvider(sdkmetric.WithReader(s.reader))
	s.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(s.spans))
	t.Cleanup(func() {
		_ = s.mp.Shutdown(context.Background())
		_ = s.tp.Shutdown(context.Background())
	})
	return s
}

// metrics collects the metrics by name.
func (s *sdk) metrics(t testing.TB) map[string]metricdata.Metrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := s.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]metricdata.Metrics{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			out[m.Name] = m
		}
	}
	return out
}

// countsAgree fails t unless the metrics that count messages, over the
// points that carry every attribute of where, say what st says.
func countsAgree(t testing.TB, ms map[string]metricdata.Metrics, st consumer.Stats, where ...attribute.KeyValue) {
	t.Helper()
	for name, want := range map[string]int64{
		"messaging.client.consumed.messages":  st.Delivered,
		"idem.consumer.applied":               st.Applied,
		"idem.consumer.duplicates":            st.Duplicates,
		"idem.consumer.duplicate.age":         st.Duplicates,
		"idem.consumer.dead_letters":          st.DeadLettered,
		"idem.consumer.fetch_to_ack.duration": st.Delivered - st.Released,
	} {
		if got := total(t, ms, name, where...); got != want {
			t.Errorf("%s = %d, Stats say %d", name, got, want)
		}
	}
	if _, ok := ms["idem.consumer.stale"]; ok || st.Stale != 0 {
		if got := total(t, ms, "idem.consumer.stale", where...); got != st.Stale {
			t.Errorf("idem.consumer.stale = %d, Stats say %d", got, st.Stale)
		}
	}
}

// total sums a counter's points, or counts a histogram's observations,
// over the points that carry every attribute of where.
func total(t testing.TB, ms map[string]metricdata.Metrics, name string, where ...attribute.KeyValue) int64 {
	t.Helper()
	m, ok := ms[name]
	if !ok {
		t.Errorf("no metric %s", name)
		return -1
	}
	match := func(set attribute.Set) bool {
		for _, kv := range where {
			if v, ok := set.Value(kv.Key); !ok || v != kv.Value {
				return false
			}
		}
		return true
	}
	var n int64
	switch d := m.Data.(type) {
	case metricdata.Sum[int64]:
		for _, p := range d.DataPoints {
			if match(p.Attributes) {
				n += p.Value
			}
		}
	case metricdata.Histogram[float64]:
		for _, p := range d.DataPoints {
			if match(p.Attributes) {
				n += int64(p.Count)
			}
		}
	case metricdata.Histogram[int64]:
		for _, p := range d.DataPoints {
			if match(p.Attributes) {
				n += p.Sum
			}
		}
	default:
		t.Errorf("metric %s: unexpected data %T", name, m.Data)
	}
	return n
}

// traceparent returns a W3C traceparent header for a fresh producer span.
func traceparent(tp trace.TracerProvider) (consumer.Header, trace.SpanContext) {
	_, span := tp.Tracer("producer").Start(context.Background(), "send pay", trace.WithSpanKind(trace.SpanKindProducer))
	defer span.End()
	var hs []consumer.Header
	propagation.TraceContext{}.Inject(trace.ContextWithSpan(context.Background(), span), otelconsumer.HeaderCarrier{Headers: &hs})
	return hs[0], span.SpanContext()
}

func payment(i int) string { return fmt.Sprintf(`{"txn_id":"T%05d","amount":%d}`, i, 100+i) }

// TestMetricsAndSpansMatchStats runs duplicates, a permanent failure and
// bad input through the engine on the in-memory store: every counter
// equals its Stats field, and the spans nest and link as documented.
func TestMetricsAndSpansMatchStats(t *testing.T) {
	s := newSDK(t)
	tel, err := otelconsumer.New(otelconsumer.Config{System: "kafka", Group: "ledger", MeterProvider: s.mp, TracerProvider: s.tp})
	if err != nil {
		t.Fatal(err)
	}
	var msgs []*consumer.Message
	links := map[trace.SpanID]bool{}
	for i := range 30 {
		m := consumertest.Message("pay", int32(i%3), int64(i), "", payment(i%20))
		h, sc := traceparent(s.tp)
		m.Headers = append(m.Headers, h)
		links[sc.SpanID()] = true
		msgs = append(msgs, m)
	}
	msgs = append(msgs, consumertest.Message("pay", 0, 30, "", `{"amount":1}`)) // no key
	dl := &consumertest.DeadLetters{}
	res := consumertest.Run(t, consumer.Config[*memstore.Tx]{
		Name:  "payments",
		Store: memstore.New(memstore.Config{}),
		Handler: consumer.HandlerFunc[*memstore.Tx](func(ctx context.Context, tx *memstore.Tx, m *consumer.Message) error {
			if !trace.SpanFromContext(ctx).SpanContext().IsValid() {
				t.Error("the handler runs outside the transaction's span")
			}
			if id, _ := consumer.ByJSONField("txn_id")(m); id == "T00004" {
				return consumer.Permanent(errors.New("account closed"))
			}
			return nil
		}),
		Key:        consumer.ByJSONField("txn_id"),
		Observer:   tel,
		DeadLetter: tel.DeadLetter(dl),
		Logger:     quiet,
	}, consumertest.Script{MinDeliveries: 1, MaxDeliveries: 2}, msgs...)
	st := res.Stats
	if st.Duplicates == 0 || st.DeadLettered < 2 || st.Applied != 19 {
		t.Fatalf("the run lacks duplicates or dead letters: %+v", st)
	}

	ms := s.metrics(t)
	group := attribute.String("messaging.consumer.group.name", "ledger")
	countsAgree(t, ms, st, group, attribute.String("messaging.system", "kafka"), attribute.String("messaging.destination.name", "pay"))
	if got := total(t, ms, "idem.consumer.transactions", attribute.String("idem.transaction.outcome", "commit")); got != st.Commits {
		t.Errorf("committed transactions %d, Stats.Commits %d", got, st.Commits)
	}
	if got := total(t, ms, "idem.consumer.dead_letters", attribute.String("idem.dead_letter.cause", "permanent")); got < 1 {
		t.Errorf("no dead letter of cause permanent")
	}
	if got := total(t, ms, "idem.consumer.dead_letters", attribute.String("idem.dead_letter.cause", "bad_input")); got < 1 {
		t.Errorf("no dead letter of cause bad_input")
	}
	if got := total(t, ms, "messaging.client.consumed.messages", attribute.String("messaging.destination.partition.id", "0"),
		attribute.String("messaging.operation.name", "process"), attribute.String("idem.consumer.name", "payments")); got == 0 {
		t.Error("no message consumed from partition 0")
	}
	if got := total(t, ms, "idem.consumer.transaction.size"); got < st.Applied {
		t.Errorf("transaction sizes sum to %d, below the %d applied", got, st.Applied)
	}

	// Spans: a batch span per batch, linked to the producers; a transaction
	// span under it with claim and commit spans.
	byID := map[trace.SpanID]sdktrace.ReadOnlySpan{}
	for _, sp := range s.spans.Ended() {
		byID[sp.SpanContext().SpanID()] = sp
	}
	var batches, txs, claims, commits, deadLetters int
	linked := map[trace.SpanID]bool{}
	for _, sp := range s.spans.Ended() {
		parent := byID[sp.Parent().SpanID()]
		switch sp.Name() {
		case "process pay":
			batches++
			if sp.SpanKind() != trace.SpanKindConsumer {
				t.Errorf("batch span kind %v", sp.SpanKind())
			}
			for _, l := range sp.Links() {
				if !links[l.SpanContext.SpanID()] {
					t.Errorf("a link to an unknown span %v", l.SpanContext)
				}
				linked[l.SpanContext.SpanID()] = true
			}
		case "idem transaction":
			txs++
			if parent == nil || parent.Name() != "process pay" {
				t.Errorf("transaction span's parent: %v", parent)
			}
		case "idem claim", "idem commit":
			if sp.Name() == "idem claim" {
				claims++
			} else {
				commits++
			}
			if parent == nil || parent.Name() != "idem transaction" || sp.SpanKind() != trace.SpanKindClient {
				t.Errorf("%s span: parent %v, kind %v", sp.Name(), parent, sp.SpanKind())
			}
		case "dead_letter pay":
			deadLetters++
			if parent == nil || parent.Name() != "process pay" || sp.SpanKind() != trace.SpanKindProducer {
				t.Errorf("dead-letter span: parent %v, kind %v", parent, sp.SpanKind())
			}
		}
	}
	if batches == 0 || txs < batches || claims != txs || int64(commits) < st.Commits {
		t.Errorf("%d batch spans, %d transactions, %d claims, %d commits (Stats: %+v)", batches, txs, claims, commits, st)
	}
	if len(linked) != len(links) {
		t.Errorf("%d of %d producer spans linked", len(linked), len(links))
	}
	if int64(deadLetters) != st.DeadLettered {
		t.Errorf("%d dead-letter spans, %d dead-lettered", deadLetters, st.DeadLettered)
	}
	// The dead letters carry their span's context, not the producer's.
	for _, l := range dl.Letters() {
		headers, _ := wire.Letter(l).Record(1 << 20)
		sc := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), otelconsumer.HeaderCarrier{Headers: &headers}))
		sp, ok := byID[sc.SpanID()]
		if !ok || sp.Name() != "dead_letter pay" {
			t.Errorf("dead letter %s carries trace context %v, not its dead-letter span's", l.Message.Coordinates(), sc)
		}
	}
	if h := msgs[4].Headers; len(h) != 1 {
		t.Errorf("the original message's headers were changed: %v", h)
	}
}

// TestNoProvider: with otel's global no-op providers nothing is recorded
// and the handler's context is the consumer's.
func TestNoProvider(t *testing.T) {
	tel, err := otelconsumer.New(otelconsumer.Config{System: "kafka"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	b := consumer.Batch{Consumer: "c", Lane: "t/0", Messages: []*consumer.Message{consumertest.Message("t", 0, 0, "", "x")}}
	if got := tel.BatchStart(ctx, b); got != ctx {
		t.Errorf("BatchStart changed the context with nothing installed")
	}
	if _, err := otelconsumer.New(otelconsumer.Config{System: " kafka"}); err == nil {
		t.Error("New with a System of surrounding spaces")
	}
}

func TestAgeBucketsAreStats(t *testing.T) {
	bounds := consumer.Stats{}.DuplicateAge.Bounds
	res := consumertest.Run(t, consumer.Config[*memstore.Tx]{
		Name: "x", Store: memstore.New(memstore.Config{}), Key: consumer.ByMessageID(), Logger: quiet,
		Handler: consumer.HandlerFunc[*memstore.Tx](func(context.Context, *memstore.Tx, *consumer.Message) error { return nil }),
	}, consumertest.Script{}, consumertest.Message("t", 0, 0, "", "x"))
	bounds = res.Stats.DuplicateAge.Bounds
	if len(bounds) != len(otelconsumer.AgeBuckets) {
		t.Fatalf("%d buckets, Stats have %d", len(otelconsumer.AgeBuckets), len(bounds))
	}
	for i, b := range bounds {
		if b.Seconds() != otelconsumer.AgeBuckets[i] {
			t.Errorf("bucket %d: %v, Stats have %v", i, otelconsumer.AgeBuckets[i], b)
		}
	}
}
