package otelconsumer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/wire"
	"github.com/idemkit/idem/dedup"
)

// HealthReporter is what Observe reads of a consumer beside its events;
// *consumer.Consumer[TTx] is one.
type HealthReporter interface {
	Name() string
	SourceInfo() consumer.SourceInfo
	Health(ctx context.Context) consumer.Health
}

// Observe adds to the consumer's telemetry what its events cannot show.
//
// Every counter, at zero, from the moment Observe is called: with the
// consumer's attributes (messaging.system, messaging.consumer.group.name,
// idem.consumer.name), idem.consumer.dead_letters for each cause,
// idem.consumer.retries for each class of failure that is retried, and
// idem.consumer.transactions for commits. A scrape right after start lists
// each, so a dashboard shows 0 rather than "No data", and rate() and
// increase() see the first increment. (The lanes' points, which add the
// topic and partition, appear with their first batch.)
//
// Gauges read from the consumer's Health at every collection: what a
// dashboard needs between two batches, and what counters cannot show — a
// consumer that holds messages and makes no progress, or a lane the source
// reports stalled (source.Description.Lanes: a queue whose fetching stopped,
// or whose messages wait unconsumed), which delivers nothing and so moves
// no counter.
//
//   - idem.consumer.in_flight: messages delivered and not settled yet;
//   - idem.consumer.progress.age: seconds since a batch was last
//     acknowledged (or Run started); 0 before Run;
//   - idem.consumer.lanes.stopped: lanes stopped (StopLaneOnExhausted);
//   - idem.consumer.lanes.stalled: lanes the source reports with no
//     progress for longer than stall (consumer.Health.StalledLanes);
//   - idem.consumer.lane.waiting: per lane (idem.lane), the source's
//     fetched messages not settled yet;
//   - idem.consumer.parked.keys: record keys parked (NonBlocking.KeyOrdered;
//     consumer.Health.Parked, read from the store at most every 5
//     seconds), with KeyOrdered only: with a store that parks, every
//     member reports the same keys — aggregate them with max, not sum;
//   - idem.consumer.parked.oldest_age: seconds since the oldest of them
//     was parked; 0 when none is.
//
// Health is called with a context bounded by the collection's. Unregister
// the returned registration when the consumer is gone. Call Observe once,
// for the consumer whose Observer the Telemetry is.
func (t *Telemetry) Observe(c HealthReporter, stall time.Duration) (metric.Registration, error) {
	if c == nil {
		return nil, errors.New("otelconsumer: Observe of a nil consumer")
	}
	if stall <= 0 {
		return nil, fmt.Errorf("otelconsumer: Observe: stall is %v, want a positive bound", stall)
	}
	attrs := t.consumerAttrs(c.Name(), c.SourceInfo())
	t.fallback.Store(&attrs)
	t.zero(attrs)

	m := t.cfg.MeterProvider.Meter(ScopeName)
	inFlight, err1 := m.Int64ObservableGauge("idem.consumer.in_flight", metric.WithUnit("{message}"),
		metric.WithDescription("Messages delivered to the consumer and not settled yet."))
	age, err2 := m.Float64ObservableGauge("idem.consumer.progress.age", metric.WithUnit("s"),
		metric.WithDescription("Seconds since a batch was last acknowledged, or Run started."))
	stopped, err3 := m.Int64ObservableGauge("idem.consumer.lanes.stopped", metric.WithUnit("{lane}"),
		metric.WithDescription("Lanes stopped until the consumer restarts."))
	stalled, err4 := m.Int64ObservableGauge("idem.consumer.lanes.stalled", metric.WithUnit("{lane}"),
		metric.WithDescription("Lanes the source reports with no progress for longer than the stall bound."))
	waiting, err5 := m.Int64ObservableGauge("idem.consumer.lane.waiting", metric.WithUnit("{message}"),
		metric.WithDescription("A lane's messages fetched by the source and not settled yet."))
	parked, err6 := m.Int64ObservableGauge("idem.consumer.parked.keys", metric.WithUnit("{key}"),
		metric.WithDescription("Record keys parked while a message of theirs is in retry (KeyOrdered)."))
	parkedAge, err7 := m.Float64ObservableGauge("idem.consumer.parked.oldest_age", metric.WithUnit("s"),
		metric.WithDescription("Seconds since the oldest parked record key was parked; 0 when none is."))
	if err := errors.Join(err1, err2, err3, err4, err5, err6, err7); err != nil {
		return nil, err
	}
	set := metric.WithAttributeSet(attribute.NewSet(attrs...))
	return m.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		h := c.Health(ctx)
		now := time.Now()
		o.ObserveInt64(inFlight, h.InFlight, set)
		var a float64
		if !h.LastProgress.IsZero() {
			a = now.Sub(h.LastProgress).Seconds()
		}
		o.ObserveFloat64(age, a, set)
		o.ObserveInt64(stopped, int64(len(h.StoppedLanes)), set)
		o.ObserveInt64(stalled, int64(len(h.StalledLanes(now, stall))), set)
		for _, l := range h.Lanes {
			o.ObserveInt64(waiting, l.Waiting, metric.WithAttributeSet(attribute.NewSet(append(attrs[:len(attrs):len(attrs)], AttrLane.String(l.Lane))...)))
		}
		if h.Parked != nil {
			o.ObserveInt64(parked, int64(h.Parked.Keys), set)
			var pa float64
			if !h.Parked.Oldest.IsZero() {
				pa = max(now.Sub(h.Parked.Oldest).Seconds(), 0)
			}
			o.ObserveFloat64(parkedAge, pa, set)
		}
		return nil
	}, inFlight, age, stopped, stalled, waiting, parked, parkedAge)
}

// retriedClasses are the classes of the failures a consumer retries: the
// values of idem.consumer.retries' error.type.
var retriedClasses = []dedup.ErrorClass{dedup.ClassUnknown, dedup.ClassRetryable, dedup.ClassUnavailable, dedup.ClassConflict}

// zero adds 0 to every counter for the consumer's attributes.
func (t *Telemetry) zero(attrs []attribute.KeyValue) {
	ctx := context.Background()
	with := func(kv ...attribute.KeyValue) metric.MeasurementOption {
		return metric.WithAttributeSet(attribute.NewSet(append(attrs[:len(attrs):len(attrs)], kv...)...))
	}
	set := with()
	for _, c := range []metric.Int64Counter{t.applied, t.duplicates, t.stale, t.released, t.conflicts} {
		c.Add(ctx, 0, set)
	}
	t.consumed.Inst().Add(ctx, 0, with(semconv.MessagingOperationName("process")))
	t.txs.Add(ctx, 0, with(AttrOutcome.String("commit")))
	for _, c := range wire.Causes() {
		t.dead.Add(ctx, 0, with(AttrCause.String(c.String())))
	}
	for _, c := range retriedClasses {
		t.retries.Add(ctx, 0, with(semconv.ErrorTypeKey.String(c.String())))
	}
}
