package rocketmq_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"
	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/adapters/rocketmq"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/internal/testenv/rmqtest"
)

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
