package rocketmq_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/idemkit/idem/adapters/rocketmq"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/internal/testenv"
)

// TestLanesReportAStalledQueue: a queue whose messages wait unconsumed
// shows in Health (Lanes, StalledLanes) and in the
// idem.consumer.lanes.stalled gauge, and stops showing once it moves
// again. The push consumer's own view of its queues is where a queue shows
// that delivers nothing to the consumer; a handler that blocks stands in
// for whatever holds it.
func TestLanesReportAStalledQueue(t *testing.T) {
	d := newDB(t)
	topic := oneQueue(t, 1, 2, 3, 4, 5)
	src := source(t, rocketmq.Config{Group: name(t, "g"), Topics: []string{topic}})
	unblock := make(chan struct{})
	effect := insertEffect(d, 1)
	r := start(t, consumer.Config[pgx.Tx]{
		Name: "payments", Source: src, DeadLetter: src, Store: d.store,
		Key: consumer.ByJSONField("txn_id"), Logger: testLogger(t),
		Handler: consumer.HandlerFunc[pgx.Tx](func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			if k, _ := consumer.ByJSONField("txn_id")(m); k == "T00003" {
				select {
				case <-unblock:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			return effect(ctx, tx, m)
		}),
	})
	const stall = 2 * time.Second

	tel, reader := meteredTelemetry(t)
	reg, err := tel.Observe(r.Consumer(), stall)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = reg.Unregister() }()

	// check returns the stalled lanes and the gauge.
	check := func() ([]string, int64) {
		h := r.Health(testenv.Context(t, 10*time.Second))
		s := h.StalledLanes(time.Now(), stall)
		var rm metricdata.ResourceMetrics
		if err := reader.Collect(context.Background(), &rm); err != nil {
			t.Fatal(err)
		}
		gauge := int64(-1)
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				if g, ok := m.Data.(metricdata.Gauge[int64]); ok && m.Name == "idem.consumer.lanes.stalled" && len(g.DataPoints) == 1 {
					gauge = g.DataPoints[0].Value
				}
			}
		}
		return s, gauge
	}
	testenv.WaitUntilProgress(t, time.Minute, "the queue reported stalled", func() (bool, string) {
		s, g := check()
		return len(s) == 1 && strings.HasPrefix(s[0], topic+"/") && strings.Contains(s[0], "waiting") && g == 1,
			fmt.Sprintf("stalled %q, gauge %d", s, g)
	})
	// Payments ahead of T00003 may have committed in a batch of their own.
	if n := d.count(t, "key = 'T00003'"); n != 0 {
		t.Fatalf("T00003 applied %d times while its handler is held", n)
	}

	close(unblock)
	testenv.WaitUntil(t, time.Minute, "5 payments applied", func() bool { return d.count(t, "") == 5 })
	testenv.WaitUntilProgress(t, time.Minute, "the queue no longer stalled", func() (bool, string) {
		s, g := check()
		return len(s) == 0 && g == 0, fmt.Sprintf("stalled %q, gauge %d", s, g)
	})
	h := r.Health(testenv.Context(t, 10*time.Second))
	// The topic's queue, and the group's retry topic's once the client took it.
	var ours int
	for _, l := range h.Lanes {
		if strings.HasPrefix(l.Lane, topic+"/") {
			ours++
		}
		if l.Waiting != 0 {
			t.Errorf("lane %s: %d waiting after the stream was applied", l.Lane, l.Waiting)
		}
	}
	if ours != 1 {
		t.Fatalf("lanes %+v, want the topic's one queue", h.Lanes)
	}
	if err := h.Live(stall); err != nil {
		t.Fatalf("Live: %v", err)
	}
	r.Stop(t)
}
