package rocketmq_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/idemkit/idem/adapters/rocketmq"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/otelconsumer"
	"github.com/idemkit/idem/internal/testenv"
)

// TestTelemetryNamesTheBroker: on the real broker, with no System or Group
// configured, the consumer's points carry messaging.system rocketmq, the
// source's consumer group, and a partition ID that names the queue's
// broker — queue 0 of two brokers are two series, not one.
func TestTelemetryNamesTheBroker(t *testing.T) {
	d := newDB(t)
	topic := oneQueue(t, 1, 2, 3)
	group := name(t, "g")
	src := source(t, rocketmq.Config{Group: group, Topics: []string{topic}})
	tel, reader := meteredTelemetry(t)
	r := start(t, consumer.Config[pgx.Tx]{
		Name: "payments", Source: src, DeadLetter: src, Store: d.store, Observer: tel,
		Key: consumer.ByJSONField("txn_id"), Logger: testLogger(t), Handler: insertEffect(d, 1),
	})
	testenv.WaitUntil(t, time.Minute, "3 payments applied", func() bool { return d.count(t, "") == 3 })
	var lane string
	for _, l := range r.Health(testenv.Context(t, 10*time.Second)).Lanes {
		if strings.HasPrefix(l.Lane, topic+"/") {
			lane = l.Lane
		}
	}
	r.Stop(t)
	want := strings.TrimPrefix(lane, topic+"/") // broker/queue
	if strings.Count(want, "/") != 1 {
		t.Fatalf("the topic's lane %q names no broker", lane)
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var consumed int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "messaging.client.consumed.messages" {
				continue
			}
			for _, p := range m.Data.(metricdata.Sum[int64]).DataPoints {
				get := func(k string) string { v, _ := p.Attributes.Value(attribute.Key(k)); return v.AsString() }
				if get("messaging.destination.name") != topic {
					continue
				}
				if get("messaging.system") != "rocketmq" || get("messaging.consumer.group.name") != group || get("messaging.destination.partition.id") != want {
					t.Errorf("a point of %s: %v; want system rocketmq, group %s, partition %s", topic, p.Attributes.ToSlice(), group, want)
				}
				consumed += p.Value
			}
		}
	}
	if consumed < 3 {
		t.Errorf("%d messages consumed from %s in the metrics, want at least 3", consumed, topic)
	}
}

// meteredTelemetry is a Telemetry on an SDK meter provider whose metrics
// the test collects from reader.
func meteredTelemetry(t *testing.T) (*otelconsumer.Telemetry, *sdkmetric.ManualReader) {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	tel, err := otelconsumer.New(otelconsumer.Config{MeterProvider: mp})
	if err != nil {
		t.Fatal(err)
	}
	return tel, reader
}
