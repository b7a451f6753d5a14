package otelconsumer

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/semconv/v1.43.0/messagingconv"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/wire"
	"github.com/idemkit/idem/dedup"
)

// ScopeName is the instrumentation scope of the meter and the tracer.
const ScopeName = "github.com/idemkit/idem/consumer/otelconsumer"

// Attributes of idem's own, beside the messaging conventions'.
const (
	AttrConsumer = attribute.Key("idem.consumer.name")     // consumer.Config.Name
	AttrCause    = attribute.Key("idem.dead_letter.cause") // consumer.Cause: bad_input, validate, rejected, fingerprint_mismatch, failed_before, permanent, exhausted, in_doubt, stale, parked_too_long
	AttrOutcome  = attribute.Key("idem.transaction.outcome")
	AttrMessages = attribute.Key("idem.transaction.messages")
	AttrKeyScope = attribute.Key("idem.key.scope")   // the dedup key's scope, as the letter's idem-key-scope
	AttrKey      = attribute.Key("idem.key")         // the dedup key's ID, as the letter's idem-key
	AttrMessage  = attribute.Key("idem.message")     // consumer.Message.Ref, as in the consumer's logs
	AttrLane     = attribute.Key("idem.lane")        // consumer.Message.Lane
	AttrDelay    = attribute.Key("idem.retry.delay") // a retry destination's wait, as wire.RetryDelayName: "10s", "1m"
)

// Config configures a Telemetry. Zero values take the defaults.
type Config struct {
	// System is messaging.system; default what the consumer's Source says
	// (consumer.SourceInfo: "kafka", "rocketmq"). Set it for a Source that
	// says nothing; without either the attribute is left out.
	System string
	// Group is messaging.consumer.group.name; default the Source's group
	// (the Kafka group, the RocketMQ consumer group), else the consumer's
	// Name.
	Group string
	// MeterProvider and TracerProvider default to the global ones (otel's
	// no-ops until the application installs an SDK).
	MeterProvider  metric.MeterProvider
	TracerProvider trace.TracerProvider
	// Propagator reads a producer's trace context from a message's headers
	// and writes the consumer's into dead letters; default W3C Trace
	// Context (traceparent, tracestate).
	Propagator propagation.TextMapPropagator
}

// Telemetry is a consumer.Observer that records OpenTelemetry metrics and
// traces. Use one per consumer. Safe for concurrent use.
type Telemetry struct {
	cfg    Config
	tracer trace.Tracer
	// defaultTP is otel's global tracer provider as it was when New ran,
	// when that was still the default one (no SDK installed), else nil.
	defaultTP trace.TracerProvider
	prop      propagation.TextMapPropagator
	lanes     sync.Map // lane name -> *lane
	// fallback: the consumer's attributes, once Observe knows them, for
	// the events outside a batch (the store's retries when Run starts)
	fallback atomic.Pointer[[]attribute.KeyValue]

	consumed   messagingconv.ClientConsumedMessages
	process    messagingconv.ProcessDuration
	applied    metric.Int64Counter
	duplicates metric.Int64Counter
	stale      metric.Int64Counter
	dupAge     metric.Float64Histogram
	dead       metric.Int64Counter
	released   metric.Int64Counter
	retries    metric.Int64Counter
	retrySent  metric.Int64Counter
	retryBack  metric.Int64Counter
	conflicts  metric.Int64Counter
	txs        metric.Int64Counter
	txSize     metric.Int64Histogram
	claim      metric.Float64Histogram
	commit     metric.Float64Histogram
	fetchToAck metric.Float64Histogram
}

// AgeBuckets are the bucket bounds of idem.consumer.duplicate.age, in
// seconds: those of consumer.Stats.DuplicateAge (1s, 10s, 1m, 10m, 1h, 6h,
// 1d, 7d, 30d, 90d).
var AgeBuckets = []float64{1, 10, 60, 600, 3600, 6 * 3600, 86400, 7 * 86400, 30 * 86400, 90 * 86400}

// durationBuckets, in seconds, for the claim, the commit, a batch and a
// message's time from fetch to ack.
var durationBuckets = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}

var sizeBuckets = []float64{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 10000}

// New returns a Telemetry; set it as consumer.Config.Observer. The
// consumer then writes its dead letters through ObserveDeadLetter, which
// carries the batch's trace context into them; Observe adds what events
// cannot show (every counter from zero, the health gauges).
func New(cfg Config) (*Telemetry, error) {
	if strings.TrimSpace(cfg.System) != cfg.System {
		return nil, fmt.Errorf("otelconsumer: Config.System %q has surrounding spaces", cfg.System)
	}
	if cfg.MeterProvider == nil {
		cfg.MeterProvider = otel.GetMeterProvider()
	}
	var defaultTP trace.TracerProvider
	if cfg.TracerProvider == nil {
		cfg.TracerProvider = otel.GetTracerProvider()
		// otel's default global provider, before an SDK is installed, makes
		// non-recording spans, at two allocations each. It is an unexported
		// type; if its name changes, spans are merely always started.
		if reflect.TypeOf(cfg.TracerProvider).String() == "*global.tracerProvider" {
			defaultTP = cfg.TracerProvider
		}
	}
	if cfg.Propagator == nil {
		cfg.Propagator = propagation.TraceContext{}
	}
	t := &Telemetry{cfg: cfg, prop: cfg.Propagator, tracer: cfg.TracerProvider.Tracer(ScopeName), defaultTP: defaultTP}
	m := cfg.MeterProvider.Meter(ScopeName)
	var errs []error
	check := func(err error) { errs = append(errs, err) }
	var err error
	t.consumed, err = messagingconv.NewClientConsumedMessages(m)
	check(err)
	t.process, err = messagingconv.NewProcessDuration(m, metric.WithExplicitBucketBoundaries(durationBuckets...))
	check(err)
	counter := func(name, unit, desc string) metric.Int64Counter {
		c, err := m.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		check(err)
		return c
	}
	seconds := func(name, desc string, bounds []float64) metric.Float64Histogram {
		h, err := m.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(desc), metric.WithExplicitBucketBoundaries(bounds...))
		check(err)
		return h
	}
	t.applied = counter("idem.consumer.applied", "{message}", "Messages whose handler's effects committed.")
	t.duplicates = counter("idem.consumer.duplicates", "{message}", "Messages skipped: their key was claimed before.")
	t.stale = counter("idem.consumer.stale", "{message}", "Stale events skipped: at or below their entity's watermark (Config.Entity, StaleSkip).")
	t.dead = counter("idem.consumer.dead_letters", "{message}", "Messages written to the dead-letter sink, by cause.")
	t.released = counter("idem.consumer.released", "{message}", "Messages given back unacknowledged (a stop, a stopped lane).")
	t.retries = counter("idem.consumer.retries", "{retry}", "Waits before a retry, by the class of the failure.")
	t.retrySent = counter("idem.consumer.retry.sent", "{message}", "Copies written to a retry destination (NonBlocking), by its delay.")
	t.retryBack = counter("idem.consumer.retry.returned", "{message}", "Retry copies come back and settled, by the delay of the trip they came back from.")
	t.conflicts = counter("idem.consumer.conflicts", "{transaction}", "Transactions that collided with another (deadlock, serialization failure, a key in flight).")
	t.txs = counter("idem.consumer.transactions", "{transaction}", "Transactions, by outcome (commit, rollback).")
	t.txSize, err = m.Int64Histogram("idem.consumer.transaction.size", metric.WithUnit("{message}"),
		metric.WithDescription("Messages claimed in one transaction."), metric.WithExplicitBucketBoundaries(sizeBuckets...))
	check(err)
	t.dupAge = seconds("idem.consumer.duplicate.age", "How long after its key was first claimed a duplicate arrived: retention must stay above its 99.9th percentile.", AgeBuckets)
	t.claim = seconds("idem.consumer.claim.duration", "Time of the store's claim statement.", durationBuckets)
	t.commit = seconds("idem.consumer.commit.duration", "Time of COMMIT.", durationBuckets)
	t.fetchToAck = seconds("idem.consumer.fetch_to_ack.duration", "Time from the source's delivery of a message to its acknowledgement.", durationBuckets)
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return t, nil
}

var consumerKind = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer)}

// lane holds a lane's attributes, built once.
type lane struct {
	topic     string
	span      string // the batch span's name: process <topic>
	attrs     []attribute.KeyValue
	set       metric.MeasurementOption // attrs as one set
	commitSet metric.MeasurementOption // attrs and idem.transaction.outcome=commit
	// attrs and messaging.operation.name, for the conventions' metrics
	process    []attribute.KeyValue
	processSet metric.MeasurementOption
	delays     sync.Map // time.Duration -> metric.MeasurementOption: attrs and idem.retry.delay
}

// delaySet is the lane's attributes and idem.retry.delay d, built once.
func (l *lane) delaySet(d time.Duration) metric.MeasurementOption {
	if o, ok := l.delays.Load(d); ok {
		return o.(metric.MeasurementOption)
	}
	o := metric.WithAttributeSet(attribute.NewSet(append(l.attrs[:len(l.attrs):len(l.attrs)], AttrDelay.String(wire.RetryDelayName(d)))...))
	actual, _ := l.delays.LoadOrStore(d, o)
	return actual.(metric.MeasurementOption)
}

func (t *Telemetry) lane(b consumer.Batch) *lane {
	if l, ok := t.lanes.Load(b.Lane); ok {
		return l.(*lane)
	}
	l := &lane{}
	attrs := t.consumerAttrs(b.Consumer, b.Source)
	if len(b.Messages) > 0 {
		m := b.Messages[0]
		l.topic = m.Topic
		l.span = "process " + m.Topic
		attrs = append(attrs, semconv.MessagingDestinationName(m.Topic),
			semconv.MessagingDestinationPartitionID(PartitionID(m)))
	}
	l.attrs = attrs
	l.set = metric.WithAttributeSet(attribute.NewSet(attrs...))
	l.commitSet = metric.WithAttributeSet(attribute.NewSet(append(attrs[:len(attrs):len(attrs)], AttrOutcome.String("commit"))...))
	l.process = append(attrs[:len(attrs):len(attrs)], semconv.MessagingOperationName("process"))
	l.processSet = metric.WithAttributeSet(attribute.NewSet(l.process...))
	actual, _ := t.lanes.LoadOrStore(b.Lane, l)
	return actual.(*lane)
}

// consumerAttrs are the attributes of every point of a consumer:
// messaging.system (when known), messaging.consumer.group.name and
// idem.consumer.name, Config's fields before what the Source says.
func (t *Telemetry) consumerAttrs(name string, src consumer.SourceInfo) []attribute.KeyValue {
	system, group := t.cfg.System, t.cfg.Group
	if system == "" {
		system = src.System
	}
	if group == "" {
		group = src.Group
	}
	if group == "" {
		group = name
	}
	attrs := make([]attribute.KeyValue, 0, 6)
	if system != "" {
		attrs = append(attrs, semconv.MessagingSystemKey.String(system))
	}
	return append(attrs, semconv.MessagingConsumerGroupName(group), AttrConsumer.String(name))
}

// PartitionID is a message's messaging.destination.partition.id: the
// conventions want it unique within the destination (the topic), so it is
// the message's lane without its topic — a Kafka partition's number, and
// for RocketMQ broker and queue ID, "broker-a/0", since queue 0 of two
// brokers are two queues. A lane that is not under the message's topic (a
// queue of RocketMQ's retry topic, %RETRY%group/broker-a/0, delivering
// the topic's messages again) is given whole, and a message without a lane
// its partition number.
func PartitionID(m *consumer.Message) string {
	if m.Lane == "" {
		return strconv.Itoa(int(m.Partition))
	}
	if rest, ok := strings.CutPrefix(m.Lane, m.Topic+"/"); ok && m.Topic != "" {
		return rest
	}
	return m.Lane
}

// batch is a batch's state, carried in its context.
type batch struct {
	lane       *lane
	start      time.Time
	span       trace.Span
	applied    int64
	duplicates int64
	stale      int64
	dead       map[consumer.Cause]int64
}

type batchKey struct{}

func batchOf(ctx context.Context) *batch {
	b, _ := ctx.Value(batchKey{}).(*batch)
	return b
}

// BatchStart starts the batch's CONSUMER span, "process <topic>", linked to
// the producers' trace contexts found in the messages' headers, and counts
// messaging.client.consumed.messages. With neither a meter nor a tracer
// installed it does nothing.
func (t *Telemetry) BatchStart(ctx context.Context, b consumer.Batch) context.Context {
	metrics := t.consumed.Enabled(ctx)
	tracing := t.defaultTP == nil || otel.GetTracerProvider() != t.defaultTP // an SDK was installed since
	if !metrics && !tracing {
		return ctx
	}
	l := t.lane(b)
	sctx, span := ctx, trace.SpanFromContext(context.Background()) // a no-op span: never the caller's
	if tracing {
		sctx, span = t.tracer.Start(ctx, l.span, consumerKind...)
	}
	if !metrics && !span.IsRecording() {
		return ctx
	}
	if span.IsRecording() {
		span.SetAttributes(l.attrs...)
		span.SetAttributes(semconv.MessagingOperationTypeProcess, semconv.MessagingOperationName("process"))
		if len(b.Messages) == 1 {
			m := b.Messages[0]
			span.SetAttributes(semconv.MessagingMessageID(m.ID))
			if t.cfg.System == "kafka" || (t.cfg.System == "" && b.Source.System == "kafka") {
				span.SetAttributes(semconv.MessagingKafkaOffset(int(m.Offset)))
			}
		} else {
			span.SetAttributes(semconv.MessagingBatchMessageCount(len(b.Messages)))
		}
		for _, m := range b.Messages {
			pctx := t.prop.Extract(context.Background(), HeaderCarrier{Headers: &m.Headers})
			if sc := trace.SpanContextFromContext(pctx); sc.IsValid() {
				span.AddLink(trace.Link{SpanContext: sc, Attributes: []attribute.KeyValue{semconv.MessagingMessageID(m.ID)}})
			}
		}
	}
	if metrics {
		t.consumed.Inst().Add(ctx, int64(len(b.Messages)), l.processSet)
	}
	return context.WithValue(sctx, batchKey{}, &batch{lane: l, start: time.Now(), span: span})
}

// TxStart starts the transaction's span, under the batch's.
func (t *Telemetry) TxStart(ctx context.Context, n int) context.Context {
	if b := batchOf(ctx); b == nil || !b.span.IsRecording() {
		return ctx
	}
	ctx, _ = t.tracer.Start(ctx, "idem transaction", trace.WithAttributes(AttrMessages.Int(n)))
	return ctx
}

// TxEnd records the transaction's metrics, its claim and commit as CLIENT
// child spans, and ends its span.
func (t *Telemetry) TxEnd(ctx context.Context, tx consumer.TxEvent) {
	b := batchOf(ctx)
	if b == nil {
		return
	}
	set := b.lane.set
	outcome, errType := "commit", ""
	if tx.Err != nil {
		outcome, errType = "rollback", tx.Class.String()
		if tx.Class == 0 {
			errType = "_OTHER"
		}
	}
	if tx.Err == nil {
		t.txs.Add(ctx, 1, b.lane.commitSet)
	} else {
		t.txs.Add(ctx, 1, metric.WithAttributes(append(b.lane.attrs[:len(b.lane.attrs):len(b.lane.attrs)], AttrOutcome.String(outcome), semconv.ErrorTypeKey.String(errType))...))
	}
	t.txSize.Record(ctx, int64(tx.Messages), set)
	if tx.Class == dedup.ClassConflict {
		t.conflicts.Add(ctx, 1, set)
	}
	if !tx.ClaimEnd.IsZero() {
		t.claim.Record(ctx, tx.ClaimEnd.Sub(tx.ClaimStart).Seconds(), set)
	}
	if !tx.CommitStart.IsZero() && tx.Err == nil {
		t.commit.Record(ctx, tx.End.Sub(tx.CommitStart).Seconds(), set)
	}
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	child := func(name string, start, end time.Time, err error) {
		_, s := t.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindClient), trace.WithTimestamp(start),
			trace.WithAttributes(AttrMessages.Int(tx.Messages)))
		if err != nil {
			s.SetStatus(codes.Error, err.Error())
		}
		s.End(trace.WithTimestamp(end))
	}
	if !tx.ClaimStart.IsZero() {
		child("idem claim", tx.ClaimStart, tx.ClaimEnd, tx.ClaimErr)
	}
	if !tx.CommitStart.IsZero() {
		child("idem commit", tx.CommitStart, tx.End, tx.Err)
	}
	span.SetAttributes(AttrOutcome.String(outcome))
	if tx.Err != nil {
		span.SetAttributes(semconv.ErrorTypeKey.String(errType))
		span.SetStatus(codes.Error, tx.Err.Error())
	}
	span.End(trace.WithTimestamp(tx.End))
}

// Settled counts the message's outcome (flushed at BatchEnd; copies sent
// to and come back from retry at once, by delay), records a duplicate's
// age, and adds a dead letter as an event to the batch's span.
func (t *Telemetry) Settled(ctx context.Context, s consumer.Settlement) {
	b := batchOf(ctx)
	if b == nil {
		return
	}
	if s.ReturnedFrom > 0 {
		t.retryBack.Add(ctx, 1, b.lane.delaySet(s.ReturnedFrom))
	}
	if s.Outcome == consumer.OutcomeRetryLater && s.RetryDelay > 0 {
		t.retrySent.Add(ctx, 1, b.lane.delaySet(s.RetryDelay))
	}
	switch s.Outcome {
	case consumer.OutcomeApplied:
		b.applied++
	case consumer.OutcomeStale:
		b.stale++
	case consumer.OutcomeDuplicate:
		b.duplicates++
		if !s.FirstAt.IsZero() {
			t.dupAge.Record(ctx, s.Age.Seconds(), b.lane.set)
		}
	case consumer.OutcomeDeadLettered:
		if b.dead == nil {
			b.dead = make(map[consumer.Cause]int64)
		}
		b.dead[s.Cause]++
		if b.span.IsRecording() {
			reason := ""
			if s.Reason != nil {
				reason = s.Reason.Error()
			}
			attrs := append(keyAttrs(s.Message, s.Key), semconv.MessagingMessageID(s.Message.ID), AttrCause.String(s.Cause.String()),
				attribute.String("idem.dead_letter.reason", reason), attribute.Int("idem.dead_letter.attempts", s.Attempts))
			b.span.AddEvent("dead_letter", trace.WithAttributes(attrs...))
		}
	}
}

// Retry counts the retry by the class of its failure.
func (t *Telemetry) Retry(ctx context.Context, r consumer.RetryEvent) {
	var attrs []attribute.KeyValue
	if b := batchOf(ctx); b != nil {
		attrs = append(attrs, b.lane.attrs...)
		if b.span.IsRecording() {
			b.span.AddEvent("retry", trace.WithAttributes(attribute.Int("idem.retry", r.N), semconv.ErrorTypeKey.String(r.Class.String())))
		}
	} else if f := t.fallback.Load(); f != nil {
		attrs = append(attrs, *f...)
	}
	t.retries.Add(ctx, 1, metric.WithAttributes(append(attrs, semconv.ErrorTypeKey.String(r.Class.String()))...))
}

// BatchEnd records the batch's outcomes, its processing time and each
// acknowledged message's time from fetch to ack, and ends the span.
func (t *Telemetry) BatchEnd(ctx context.Context, e consumer.Batch) {
	b := batchOf(ctx)
	if b == nil {
		return
	}
	now := time.Now()
	set := b.lane.set
	if b.applied > 0 {
		t.applied.Add(ctx, b.applied, set)
	}
	if b.duplicates > 0 {
		t.duplicates.Add(ctx, b.duplicates, set)
	}
	if b.stale > 0 {
		t.stale.Add(ctx, b.stale, set)
	}
	for cause, n := range b.dead {
		t.dead.Add(ctx, n, metric.WithAttributes(append(b.lane.attrs[:len(b.lane.attrs):len(b.lane.attrs)], AttrCause.String(cause.String()))...))
	}
	if len(e.Released) > 0 {
		t.released.Add(ctx, int64(len(e.Released)), set)
	}
	if len(e.Released) > 0 || e.AckErr != nil {
		errType := "released"
		if e.AckErr != nil {
			errType = "ack_failed"
		}
		t.process.Inst().Record(ctx, now.Sub(b.start).Seconds(), metric.WithAttributes(append(b.lane.process[:len(b.lane.process):len(b.lane.process)], semconv.ErrorTypeKey.String(errType))...))
	} else {
		t.process.Inst().Record(ctx, now.Sub(b.start).Seconds(), b.lane.processSet)
	}
	if t.fetchToAck.Enabled(ctx) {
		for _, m := range e.Acked {
			if !m.DeliveredAt.IsZero() {
				t.fetchToAck.Record(ctx, now.Sub(m.DeliveredAt).Seconds(), set)
			}
		}
	}
	if b.span.IsRecording() {
		b.span.SetAttributes(
			attribute.Int64("idem.applied", b.applied), attribute.Int64("idem.duplicates", b.duplicates),
			attribute.Int("idem.acked", len(e.Acked)), attribute.Int("idem.released", len(e.Released)))
		var dead int64
		for _, n := range b.dead {
			dead += n
		}
		b.span.SetAttributes(attribute.Int64("idem.dead_letters", dead))
		if e.AckErr != nil {
			b.span.SetStatus(codes.Error, "ack: "+e.AckErr.Error())
		} else if len(e.Released) > 0 {
			b.span.SetStatus(codes.Error, "released unacknowledged")
		}
	}
	b.span.End()
}

// ObserveDeadLetter wraps the consumer's dead-letter sink
// (consumer.DeadLetterObserver; consumer.New calls it): each letter is
// written under a PRODUCER span, "dead_letter <topic>", a child of the
// batch's, whose trace context the letter carries in place of the
// producer's (Letter.Headers; the batch's span links to the producer's), so
// that from a dead letter one finds the trace of the batch that failed it.
// The message itself is not changed. A sink this Telemetry wrapped already
// is returned as it is.
func (t *Telemetry) ObserveDeadLetter(next consumer.DeadLetter) consumer.DeadLetter {
	if d, ok := next.(*tracedSink); ok && d.t == t {
		return next
	}
	return &tracedSink{t: t, next: next}
}

// DeadLetter is ObserveDeadLetter, for a sink given to the consumer already
// wrapped; the consumer does not wrap it twice.
func (t *Telemetry) DeadLetter(next consumer.DeadLetter) consumer.DeadLetter {
	return t.ObserveDeadLetter(next)
}

// tracedSink is a dead-letter sink a Telemetry wrapped.
type tracedSink struct {
	t    *Telemetry
	next consumer.DeadLetter
}

func (d *tracedSink) DeadLetter(ctx context.Context, l consumer.Letter) error {
	t := d.t
	if l.Message == nil {
		return d.next.DeadLetter(ctx, l)
	}
	if t.defaultTP != nil && otel.GetTracerProvider() == t.defaultTP {
		return d.next.DeadLetter(ctx, l) // no SDK: no span
	}
	attrs := []attribute.KeyValue{semconv.MessagingOperationTypeSend, semconv.MessagingOperationName("dead_letter"),
		semconv.MessagingMessageID(l.Message.ID), AttrCause.String(l.Cause.String())}
	if b := batchOf(ctx); b != nil {
		for _, kv := range b.lane.attrs {
			if kv.Key == semconv.MessagingSystemKey {
				attrs = append(attrs, kv)
			}
		}
	} else if t.cfg.System != "" {
		attrs = append(attrs, semconv.MessagingSystemKey.String(t.cfg.System))
	}
	attrs = append(attrs, keyAttrs(l.Message, l.Key)...)
	ctx, span := t.tracer.Start(ctx, "dead_letter "+l.Message.Topic, trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(attrs...))
	defer span.End()
	if trace.SpanContextFromContext(ctx).IsValid() {
		// Every field of the propagator replaces the producer's: those the
		// batch's context has no value for are removed (a nil Value).
		fields := t.prop.Fields()
		hs := make([]consumer.Header, 0, len(l.Headers)+len(fields))
		hs = append(hs, l.Headers...)
		for _, f := range fields {
			hs = append(hs, consumer.Header{Key: f})
		}
		t.prop.Inject(ctx, HeaderCarrier{Headers: &hs})
		l.Headers = hs
	}
	err := d.next.DeadLetter(ctx, l)
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
	}
	return err
}

// keyAttrs name a message and its key as the consumer's logs and the
// letters do; the key's attributes are left out when no key was derived.
func keyAttrs(m *consumer.Message, k dedup.Key) []attribute.KeyValue {
	attrs := []attribute.KeyValue{AttrMessage.String(m.Ref())}
	if k != (dedup.Key{}) {
		attrs = append(attrs, AttrKeyScope.String(k.Scope), AttrKey.String(k.ID))
	}
	return attrs
}

var _ consumer.DeadLetterObserver = (*Telemetry)(nil)
var _ consumer.Observer = (*Telemetry)(nil)
