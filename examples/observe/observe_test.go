package observe_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/consumer/otelconsumer"
	"github.com/idemkit/idem/dedup/memstore"
	"github.com/idemkit/idem/examples/observe"
)

func get(t *testing.T, h http.Handler, url string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, url, nil))
	return rec.Code, rec.Body.String()
}

// TestHealthzAndMetrics: /healthz is 503 before Run and after Stop, 200
// while the consumer runs; /metrics shows what it applied.
func TestHealthzAndMetrics(t *testing.T) {
	mp, metrics, err := observe.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	defer mp.Shutdown(context.Background()) //nolint:errcheck
	tel, err := otelconsumer.New(otelconsumer.Config{System: "kafka", MeterProvider: mp})
	if err != nil {
		t.Fatal(err)
	}
	src := consumertest.NewSource(consumertest.Script{})
	c, err := consumer.New(consumer.Config[*memstore.Tx]{
		Name: "healthz", Source: src, Store: memstore.New(memstore.Config{}), DeadLetter: &consumertest.DeadLetters{},
		Handler:  consumer.HandlerFunc[*memstore.Tx](func(context.Context, *memstore.Tx, *consumer.Message) error { return nil }),
		Key:      consumer.ByMessageID(),
		Observer: tel,
		Logger:   slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	healthz := observe.Health(c.Health, time.Minute)
	if code, body := get(t, healthz, "/healthz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "not running") {
		t.Errorf("before Run: %d %s", code, body)
	}
	ctx := context.Background()
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	src.Push(consumertest.Message("pay", 0, 0, "", "a"), consumertest.Message("pay", 0, 1, "", "b"))
	waitCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := src.WaitIdle(waitCtx); err != nil {
		t.Fatal(err)
	}
	code, body := get(t, healthz, "/healthz")
	var h struct {
		Ready, Live bool
		InFlight    int64 `json:"in_flight"`
	}
	if err := json.Unmarshal([]byte(body), &h); err != nil || code != http.StatusOK || !h.Ready || !h.Live || h.InFlight != 0 {
		t.Errorf("running: %d %s", code, body)
	}
	// The batch's counters are recorded when the batch ends, just after its
	// acknowledgement, which is what made the source idle: wait for them.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
		code, body := get(t, metrics, "/metrics")
		if code == http.StatusOK && strings.Contains(body, `idem_consumer_applied_total{idem_consumer_name="healthz"`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/metrics: %d %s", code, body)
		}
	}
	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if code, _ := get(t, healthz, "/healthz?probe=ready"); code != http.StatusServiceUnavailable {
		t.Errorf("stopped, ready probe: %d", code)
	}
	if code, _ := get(t, healthz, "/healthz?probe=live"); code != http.StatusOK {
		t.Errorf("stopped, live probe: %d", code) // nothing in flight, nothing stopped: a restart is not asked for
	}
}
