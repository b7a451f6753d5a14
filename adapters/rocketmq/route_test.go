package rocketmq_test

import (
	"context"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/adapters/rocketmq"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/internal/testenv/rmqtest"
)

// refusals counts the Source's "no route" warnings and passes every record
// on to the test's log.
type refusals struct {
	slog.Handler
	n *atomic.Int64
}

func (h refusals) Handle(ctx context.Context, r slog.Record) error {
	if strings.Contains(r.Message, "has no route") {
		h.n.Add(1)
	}
	return h.Handler.Handle(ctx, r)
}

func (h refusals) WithAttrs(as []slog.Attr) slog.Handler {
	return refusals{h.Handler.WithAttrs(as), h.n}
}

func (h refusals) WithGroup(g string) slog.Handler { return refusals{h.Handler.WithGroup(g), h.n} }

// TestRunWaitsForTheTopicsRoute: a consumer starts while its topic has no
// route on the name server — as when the name server forgot a broker whose
// connection closed (under load, a broker closes it when the name server
// answers a request late, and its topics are unknown until it registers
// again, within 30 s; the fault suite met it at a load of 38). The client
// refuses to start then; the Source starts again until the route is there
// and consumes what was sent, instead of Run failing.
func TestRunWaitsForTheTopicsRoute(t *testing.T) {
	t.Parallel()
	topic := name(t, "t")
	d := newDB(t)
	var refused atomic.Int64
	log := slog.New(refusals{testLogger(t).Handler(), &refused})
	src := source(t, rocketmq.Config{Group: name(t, "g"), Topics: []string{topic}, Logger: log, RouteWait: 2 * time.Minute})
	r := start(t, consumer.Config[pgx.Tx]{
		Name: "ledger", Source: src, DeadLetter: src, Store: d.store, Key: consumer.ByJSONField("txn_id"),
		Handler: insertEffect(d, 1), Logger: testLogger(t),
	})
	testenv.WaitUntilProgress(t, time.Minute, "the Source refused twice for the missing route", func() (bool, string) {
		return refused.Load() >= 2, ""
	})
	rmqtest.Shared(t).CreateTopic(t, topic, 2)
	rmqtest.Shared(t).CreateTopic(t, topic+"_DLQ", 2)
	rmqtest.Send(t, rmqtest.Shared(t).NewProducer(t),
		[]*primitive.Message{payment(topic, 1, 100), payment(topic, 2, 200), payment(topic, 3, 300)}...)
	testenv.WaitUntilProgress(t, 2*time.Minute, "3 effects", func() (bool, string) {
		n := d.count(t, "")
		return n >= 3, ""
	})
	r.Stop(t)
	for _, k := range []string{"T00001", "T00002", "T00003"} {
		if n := effectsOf(t, d, k); n != 1 {
			t.Errorf("%s: %d effects, want 1", k, n)
		}
	}
}

// TestRunGivesUpOnAMissingTopic: a topic that never comes (a typo) ends Run
// with the client's error, which names the topic, once RouteWait passed —
// and at once with a negative RouteWait.
func TestRunGivesUpOnAMissingTopic(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		wait time.Duration
		want string
	}{
		{3 * time.Second, "Config.RouteWait 3s"},
		{-1, "route info not found"},
	} {
		topic := name(t, "never")
		src := source(t, rocketmq.Config{Group: name(t, "g"), Topics: []string{topic}, RouteWait: tc.wait})
		errc := make(chan error, 1)
		go func() {
			errc <- src.Run(context.Background(), func(context.Context, *consumer.Message) error { return nil })
		}()
		select {
		case err := <-errc:
			if err == nil || !strings.Contains(err.Error(), topic) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("RouteWait %v: Run returned %v, want an error naming %s and saying %q", tc.wait, err, topic, tc.want)
			}
		case <-time.After(2 * time.Minute):
			t.Fatalf("RouteWait %v: Run still running after 2m on a topic that does not exist", tc.wait)
		}
	}
}
