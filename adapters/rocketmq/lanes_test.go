package rocketmq_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"
	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/idemkit/idem/adapters/rocketmq"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/internal/testenv/rmqtest"
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

// TestLanesReportAQueueNoOneConsumes: the group's only member takes queue 0
// of two (its allocation leaves queue 1 to no one, as members whose views
// of the group differ can), so no process queue of any member shows queue
// 1. Health still reports it stalled — from the brokers' offsets — while
// queue 0, consumed, is not; and the member stays live (LaneStatus.Elsewhere).
func TestLanesReportAQueueNoOneConsumes(t *testing.T) {
	t.Parallel()
	topic := name(t, "t")
	mqs := rmqtest.Shared(t).CreateTopic(t, topic, 2)
	rmqtest.Shared(t).CreateTopic(t, topic+"_DLQ", 2)
	var msgs []*primitive.Message
	for i := range 6 {
		m := payment(topic, i+1, 100)
		m.Queue = mqs[i%2]
		msgs = append(msgs, m)
	}
	rmqtest.Send(t, rmqtest.Shared(t).NewProducer(t, producer.WithQueueSelector(producer.NewManualQueueSelector())), msgs...)
	d := newDB(t)
	src := source(t, rocketmq.Config{Group: name(t, "g"), Topics: []string{topic}, GroupCheck: 500 * time.Millisecond})
	rocketmq.TakeOnlyQueue(src, mqs[0].QueueId)
	r := start(t, consumer.Config[pgx.Tx]{
		Name: "ledger", Source: src, DeadLetter: src, Store: d.store, Key: consumer.ByJSONField("txn_id"),
		Handler: insertEffect(d, 1), Logger: testLogger(t),
	})
	lane := func(mq *primitive.MessageQueue) string {
		return mq.Topic + "/" + mq.BrokerName + "/" + strconv.Itoa(mq.QueueId)
	}
	testenv.WaitUntil(t, time.Minute, "queue 0's 3 payments applied", func() bool { return d.count(t, "") >= 3 })
	var stalled []string
	testenv.WaitUntilProgress(t, time.Minute, "queue 1 reported stalled", func() (bool, string) {
		stalled = r.Health(context.Background()).StalledLanes(time.Now(), time.Second)
		for _, s := range stalled {
			if strings.HasPrefix(s, lane(mqs[1])+": 3 messages waiting") {
				return true, ""
			}
		}
		return false, strings.Join(stalled, "; ")
	})
	for _, s := range stalled {
		if strings.HasPrefix(s, lane(mqs[0])+":") {
			t.Errorf("queue 0, consumed, reported stalled: %s", s)
		}
	}
	// Not this process's lane: not a reason to restart it.
	if err := r.Health(context.Background()).Live(time.Second); err != nil {
		t.Errorf("Live: %v, want nil: queue 1 is held by no process here", err)
	}
	if n := d.count(t, ""); n != 3 {
		t.Errorf("%d effects, want the 3 of queue 0", n)
	}
	r.Stop(t)
}
