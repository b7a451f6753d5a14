package observe_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/consumer/otelconsumer"
	"github.com/idemkit/idem/consumer/source"
	"github.com/idemkit/idem/consumer/wire"
	"github.com/idemkit/idem/dedup/memstore"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/internal/testenv/promtest"
	"github.com/idemkit/idem/observe"
)

// retrySource is a consumertest.Source with a retry topic, "pay.retry":
// what it is given as a RetrySink comes back there, delivered once due,
// or, for a copy on its second trip, once early is closed.
type retrySource struct {
	*consumertest.Source
	early  chan struct{}
	mu     sync.Mutex
	offset int64
}

func (s *retrySource) Run(ctx context.Context, deliver source.DeliverFunc) error {
	return s.Source.Run(ctx, func(ctx context.Context, m *consumer.Message) error {
		if due, ok := wire.RetryDue(m); ok && m.Topic == "pay.retry" {
			var early chan struct{}
			if v, _ := m.Header(wire.MetaRetryAttempt); string(v) == "2" {
				early = s.early
			}
			t := time.NewTimer(time.Until(due))
			select {
			case <-t.C:
			case <-early:
				t.Stop()
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			}
		}
		return deliver(ctx, m)
	})
}

func (s *retrySource) Describe() source.Description {
	d := s.Source.Describe()
	d.RetryOf = func(topic string) (string, bool) { return "pay", topic == "pay.retry" }
	return d
}

func (s *retrySource) Retry(_ context.Context, r consumer.RetryLetter) error {
	headers, value := wire.Letter(r.Letter).RetryRecord(r.Retry)
	s.mu.Lock()
	m := consumertest.Message("pay.retry", 0, s.offset, "", string(value))
	s.offset++
	s.mu.Unlock()
	m.Headers = headers
	s.Push(m)
	return nil
}

// TestRetryMetricsByDelay runs a NonBlocking consumer with two delays: a
// payment that succeeds once back from its first trip and one that never
// does (dead-lettered after its second). idem_consumer_retry_sent_total
// and idem_consumer_retry_returned_total count the copies by delay, and
// while the second copy waits sent less returned is 1 for its delay; once
// all is settled it is 0 for each.
func TestRetryMetricsByDelay(t *testing.T) {
	src := &retrySource{Source: consumertest.NewSource(consumertest.Script{}), early: make(chan struct{})}
	obs, err := observe.New(observe.Config{Logger: testenv.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	tel, err := obs.Telemetry(otelconsumer.Config{System: "test"})
	if err != nil {
		t.Fatal(err)
	}
	dl := &consumertest.DeadLetters{}
	c, err := consumer.New(consumer.Config[*memstore.Tx]{
		Name: "payments", Source: src, DeadLetter: dl, Store: memstore.New(memstore.Config{}),
		Key: consumer.ByMessageID(), Observer: tel, Logger: testenv.Logger(t),
		Retries: consumer.NonBlocking{Attempts: 1, Delays: []time.Duration{10 * time.Millisecond, time.Hour}, Sink: src},
		Handler: consumer.HandlerFunc[*memstore.Tx](func(_ context.Context, _ *memstore.Tx, m *consumer.Message) error {
			trip := 0
			if v, ok := m.Header(wire.MetaRetryAttempt); ok {
				trip, _ = strconv.Atoi(string(v))
			}
			if v := string(m.Value); v == "never" || (v == "once back" && trip < 1) {
				return consumer.Retryable(errors.New("downstream away"))
			}
			return nil
		}),
	})
	if err != nil {
		t.Fatal(err)
	}
	base, stop := watchAndRun(t, obs, c, tel)
	src.Push(consumertest.Message("pay", 0, 0, "", "once back"), consumertest.Message("pay", 0, 1, "", "never"),
		consumertest.Message("pay", 0, 2, "", "fine"))

	count := func(name, delay string) float64 {
		v, _ := promtest.Sum(promtest.Scrape(t, base), name, map[string]string{"idem_consumer_name": "payments", "idem_retry_delay": delay})
		return v
	}
	// In retry now: the second copy of "never", on its hour-long trip.
	testenv.WaitUntilProgress(t, time.Minute, "a copy on the hour-long trip", func() (bool, string) {
		sent, back := count("idem_consumer_retry_sent_total", "1h"), count("idem_consumer_retry_returned_total", "1h")
		return sent == 1 && back == 0, fmt.Sprintf("1h: sent %v, returned %v", sent, back)
	})
	close(src.early)
	testenv.WaitUntilProgress(t, time.Minute, "every copy back", func() (bool, string) {
		return len(dl.Letters()) == 1 && c.Stats().Applied == 2, fmt.Sprintf("%d dead letters, %+v", len(dl.Letters()), c.Stats())
	})
	for _, w := range []struct {
		delay          string
		sent, returned float64
	}{{"10ms", 2, 2}, {"1h", 1, 1}} {
		if sent, back := count("idem_consumer_retry_sent_total", w.delay), count("idem_consumer_retry_returned_total", w.delay); sent != w.sent || back != w.returned {
			t.Errorf("delay %s: sent %v, returned %v; want %v, %v", w.delay, sent, back, w.sent, w.returned)
		}
	}
	stop()
}
