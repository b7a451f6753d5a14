// Package oteloutbox exports an outbox relay's counters and the outbox's
// backlog as OpenTelemetry metrics: what package observe serves on
// /metrics beside a consumer's (observe.Server.WatchRelay).
//
// Every instrument is read at collection time — the counters from
// Relay.Stats, the gauges from Outbox.Pending and Relay.Health — so each is
// listed, at zero, from the first scrape after Observe. The points carry
// idem.outbox.table (the outbox's schema.table).
//
//	idem.outbox.published           records the broker acknowledged (republished ones included)
//	idem.outbox.republished         records acknowledged in a round whose marking failed: published again
//	idem.outbox.dead_lettered       records refused for good, moved to the dead-letter table
//	idem.outbox.failed              records whose publish failed, to be retried
//	idem.outbox.rounds              batches read and published
//	idem.outbox.failed_rounds       rounds that did not go through (Postgres, or a failed publish)
//	idem.outbox.pending             gauge: rows not published yet
//	idem.outbox.oldest_pending.age  gauge: seconds since the oldest pending row was enqueued
//	idem.outbox.progress.age        gauge: seconds since a round last went through
package oteloutbox

import (
	"context"
	"errors"
	"strings"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/idemkit/idem/outbox"
)

// ScopeName is the instrumentation scope of the meter.
const ScopeName = "github.com/idemkit/idem/outbox/oteloutbox"

// AttrTable is the outbox's table, schema.table.
const AttrTable = attribute.Key("idem.outbox.table")

// Relay is what Observe reads of a relay; *outbox.Relay is one.
type Relay interface {
	Stats() outbox.RelayStats
	Health() outbox.RelayHealth
}

// Pender is what Observe reads of an outbox; *outbox.Outbox is one.
type Pender interface {
	Pending(ctx context.Context) (outbox.PendingStats, error)
	Table() string
}

// Config configures Observe. Zero values take the defaults.
type Config struct {
	// MeterProvider defaults to the global one.
	MeterProvider metric.MeterProvider
}

// Observe registers the relay's instruments on the meter provider; they
// are read at every collection (Pending is a query, bounded by the
// collection's context). o may be nil: no pending gauges then. Unregister
// the registration when the relay is gone.
func Observe(cfg Config, o Pender, r Relay) (metric.Registration, error) {
	if r == nil {
		return nil, errors.New("oteloutbox: Observe of a nil relay")
	}
	if cfg.MeterProvider == nil {
		cfg.MeterProvider = otel.GetMeterProvider()
	}
	m := cfg.MeterProvider.Meter(ScopeName)
	var errs []error
	counter := func(name, unit, desc string) metric.Int64ObservableCounter {
		c, err := m.Int64ObservableCounter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	published := counter("idem.outbox.published", "{message}", "Records the broker acknowledged, republished ones included.")
	republished := counter("idem.outbox.republished", "{message}", "Records acknowledged in a round whose marking failed: they are published again.")
	dead := counter("idem.outbox.dead_lettered", "{message}", "Records refused for good, moved to the dead-letter table.")
	failed := counter("idem.outbox.failed", "{message}", "Records whose publish failed, to be retried.")
	rounds := counter("idem.outbox.rounds", "{round}", "Batches read and published.")
	failedRounds := counter("idem.outbox.failed_rounds", "{round}", "Rounds that did not go through: Postgres failed, or a record's publish failed.")
	progress, err := m.Float64ObservableGauge("idem.outbox.progress.age", metric.WithUnit("s"),
		metric.WithDescription("Seconds since a relay round last went through, or Run started; 0 before Run."))
	errs = append(errs, err)
	insts := []metric.Observable{published, republished, dead, failed, rounds, failedRounds, progress}
	var pending metric.Int64ObservableGauge
	var oldest metric.Float64ObservableGauge
	table := ""
	if o != nil {
		table = strings.ReplaceAll(o.Table(), `"`, "") // schema.table, unquoted
		pending, err = m.Int64ObservableGauge("idem.outbox.pending", metric.WithUnit("{message}"),
			metric.WithDescription("Outbox rows not published yet."))
		errs = append(errs, err)
		oldest, err = m.Float64ObservableGauge("idem.outbox.oldest_pending.age", metric.WithUnit("s"),
			metric.WithDescription("Seconds since the oldest pending outbox row was enqueued; 0 when none is pending."))
		errs = append(errs, err)
		insts = append(insts, pending, oldest)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	var set metric.ObserveOption = metric.WithAttributeSet(*attribute.EmptySet())
	if table != "" {
		set = metric.WithAttributeSet(attribute.NewSet(AttrTable.String(table)))
	}
	return m.RegisterCallback(func(ctx context.Context, ob metric.Observer) error {
		s := r.Stats()
		ob.ObserveInt64(published, s.Published, set)
		ob.ObserveInt64(republished, s.Republished, set)
		ob.ObserveInt64(dead, s.DeadLettered, set)
		ob.ObserveInt64(failed, s.Failed, set)
		ob.ObserveInt64(rounds, s.Rounds, set)
		ob.ObserveInt64(failedRounds, s.FailedRounds, set)
		var age float64
		if h := r.Health(); !h.LastProgress.IsZero() {
			age = max(time.Since(h.LastProgress).Seconds(), 0)
		}
		ob.ObserveFloat64(progress, age, set)
		if o == nil {
			return nil
		}
		p, err := o.Pending(ctx)
		if err != nil {
			return err
		}
		ob.ObserveInt64(pending, p.Count, set)
		ob.ObserveFloat64(oldest, p.OldestAge.Seconds(), set)
		return nil
	}, insts...)
}
