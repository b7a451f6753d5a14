package otelconsumer

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/idemkit/idem/consumer"
)

// ObserveHealth registers gauges read from a consumer's Health at every
// collection: what a dashboard needs between two batches, and what counters
// cannot show — a consumer that holds messages and makes no progress, or a
// lane the source reports stalled (consumer.LaneReporter: a queue whose
// fetching stopped, or whose messages wait unconsumed), which delivers
// nothing and so moves no counter.
//
//   - idem.consumer.in_flight: messages delivered and not settled yet;
//   - idem.consumer.progress.age: seconds since a batch was last
//     acknowledged (or Run started); 0 before Run;
//   - idem.consumer.lanes.stopped: lanes stopped (StopLaneOnExhausted);
//   - idem.consumer.lanes.stalled: lanes the source reports with no
//     progress for longer than stall (consumer.Health.StalledLanes);
//   - idem.consumer.lane.waiting: per lane (idem.lane), the source's
//     fetched messages not settled yet.
//
// name is the consumer's Config.Name. Health is called with a context
// bounded by the collection's. Unregister the returned registration when
// the consumer is gone.
func (t *Telemetry) ObserveHealth(name string, health func(context.Context) consumer.Health, stall time.Duration) (metric.Registration, error) {
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
	for _, err := range []error{err1, err2, err3, err4, err5} {
		if err != nil {
			return nil, err
		}
	}
	group := t.cfg.Group
	if group == "" {
		group = name
	}
	attrs := []attribute.KeyValue{
		semconv.MessagingSystemKey.String(t.cfg.System),
		semconv.MessagingConsumerGroupName(group),
		AttrConsumer.String(name),
	}
	set := metric.WithAttributeSet(attribute.NewSet(attrs...))
	return m.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		h := health(ctx)
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
		return nil
	}, inFlight, age, stopped, stalled, waiting)
}
