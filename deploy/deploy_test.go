package deploy

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/consumer/otelconsumer"
	"github.com/idemkit/idem/consumer/source"
	"github.com/idemkit/idem/httpidem"
	"github.com/idemkit/idem/httpidem/otelhttpidem"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/internal/testenv/pgtest"
	"github.com/idemkit/idem/internal/testenv/promtest"
	"github.com/idemkit/idem/internal/testenv/relaytest"
	"github.com/idemkit/idem/observe"
	"github.com/idemkit/idem/outbox"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// lanesSource is a consumertest.Source that reports its one lane as a
// Kafka source would (source.Description.Lanes): fetched from just now.
type lanesSource struct{ *consumertest.Source }

func (s lanesSource) Describe() source.Description {
	d := s.Source.Describe()
	d.Lanes = func() []source.LaneStatus {
		now := time.Now()
		return []source.LaneStatus{{Lane: "payments/0", LastFetch: now, LastSettled: now}}
	}
	return d
}

// TestDashboardAndAlertsMatchTheScrape serves, behind one observe.Server,
// what the dashboard and the alerts watch: a consumer on Postgres (applied
// messages, a duplicate, a bad input dead-lettered, a retry), an
// idempotent HTTP API (executed, replayed, 409 in flight, 422 mismatch),
// an outbox relay that published what the API enqueued, and the store's
// effect journal. Then it
// scrapes /metrics once every series the files use has a sample, and
// checks every expression of deploy/prometheus/alerts.yml and every
// target and variable query of deploy/grafana/idem.json against it.
func TestDashboardAndAlertsMatchTheScrape(t *testing.T) {
	pool, schema := testenv.SchemaPool(t)
	ctx := testenv.Context(t, 3*time.Minute)
	log := testenv.Logger(t)
	if _, err := pool.Exec(ctx, `CREATE TABLE ledger (txn_id text PRIMARY KEY); CREATE TABLE payments (id text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	store := pgtest.Store(t, pool, schema)
	ob := relaytest.OutboxIn(t, pool, schema)
	obs, err := observe.New(observe.Config{Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	base := promtest.Serve(t, obs)

	// The consumer: T1 applied after one retry, T2 applied, T1 again a
	// duplicate, a message without txn_id dead-lettered as bad input.
	src := lanesSource{consumertest.NewSource(consumertest.Script{})}
	tel, err := obs.Telemetry(otelconsumer.Config{System: "kafka"})
	if err != nil {
		t.Fatal(err)
	}
	var failedOnce atomic.Bool
	c, err := consumer.New(consumer.Config[pgx.Tx]{
		Name: "payments", Source: src, DeadLetter: &consumertest.DeadLetters{}, Store: store, Observer: tel, Logger: log,
		Key:   consumer.ByJSONField("txn_id"),
		Retry: consumer.RetryPolicy{Initial: time.Millisecond, Max: time.Millisecond},
		Handler: consumer.HandlerFunc[pgx.Tx](func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			id, _ := consumer.ByJSONField("txn_id")(m)
			if id == "T1" && failedOnce.CompareAndSwap(false, true) {
				return consumer.Retryable(errors.New("downstream away, once"))
			}
			_, err := tx.Exec(ctx, `INSERT INTO ledger VALUES ($1)`, id)
			return err
		}),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := obs.Watch(c, tel); err != nil {
		t.Fatal(err)
	}

	// The HTTP API: POST /payments writes a payment and enqueues it in the
	// outbox, in the request's transaction; "slow" waits for hold.
	htel, err := obs.HTTPTelemetry(otelhttpidem.Config{Routes: []string{"POST /payments", "POST /payouts"}})
	if err != nil {
		t.Fatal(err)
	}
	mw, err := httpidem.New(httpidem.Config[pgx.Tx]{Store: store, Observer: htel, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	if err := obs.WatchHTTP("payments", store, htel); err != nil {
		t.Fatal(err)
	}
	hold, holding := make(chan struct{}), make(chan struct{})
	mux := http.NewServeMux()
	mux.Handle("POST /payments", mw.Transactional(httpidem.Route{}, relaytest.PaymentsHandler(ob, "payments", hold, holding)))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	// The relay publishes to a publisher that takes every record.
	var published atomic.Int64
	relay, err := outbox.NewRelay(outbox.RelayConfig{Outbox: ob, PollInterval: 5 * time.Millisecond, Logger: log,
		Publisher: outbox.PublisherFunc(func(_ context.Context, recs []outbox.Record, _ []error) { published.Add(int64(len(recs))) })})
	if err != nil {
		t.Fatal(err)
	}
	if err := obs.WatchRelay(ob, relay); err != nil {
		t.Fatal(err)
	}
	// The effect journal of the same store: its gauges are listed at 0
	// with no step recorded.
	if err := obs.WatchJournal("payments", store); err != nil {
		t.Fatal(err)
	}

	consumerDone, relayDone := make(chan error, 1), make(chan error, 1)
	go func() { consumerDone <- c.Run(ctx) }()
	go func() { relayDone <- relay.Run(ctx) }()

	for i, v := range []string{`{"txn_id":"T1"}`, `{"txn_id":"T2"}`, `{"txn_id":"T1"}`, `{"amount":1}`} {
		src.Push(consumertest.Message("payments", 0, int64(i), "", v))
	}
	post := func(key, body string) int {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/payments", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Idempotency-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Error(err)
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, r := range []struct {
		key, body string
		want      int
	}{
		{"k-p1", `{"id":"p1"}`, http.StatusCreated},
		{"k-p1", `{"id":"p1"}`, http.StatusCreated},             // replayed
		{"k-p1", `{"id":"p2"}`, http.StatusUnprocessableEntity}, // mismatch
	} {
		if got := post(r.key, r.body); got != r.want {
			t.Fatalf("POST %s %s: %d, want %d", r.key, r.body, got, r.want)
		}
	}
	slow := make(chan int, 1)
	go func() { slow <- post("k-slow", `{"id":"slow"}`) }()
	<-holding
	if got := post("k-slow", `{"id":"slow"}`); got != http.StatusConflict {
		t.Fatalf("slow's retry while it runs: %d, want 409", got)
	}
	close(hold)
	if got := <-slow; got != http.StatusCreated {
		t.Fatalf("slow: %d", got)
	}

	// Wait for every message to be counted (a batch's counters are
	// recorded just after its acknowledgement), the two payments to be
	// published, and each histogram to have a sample: a histogram is
	// listed once observed.
	var fams map[string]*dto.MetricFamily
	testenv.WaitUntilProgress(t, time.Minute, "every series the files use to have a sample", func() (bool, string) {
		fams = promtest.Scrape(t, base)
		var missing []string
		for _, name := range []string{
			"idem_consumer_duplicate_age_seconds", "idem_consumer_fetch_to_ack_duration_seconds",
			"idem_consumer_claim_duration_seconds", "idem_consumer_commit_duration_seconds",
			"messaging_process_duration_seconds", "idem_http_replay_age_seconds", "idem_consumer_lane_waiting",
		} {
			if len(fams[name].GetMetric()) == 0 {
				missing = append(missing, name)
			}
		}
		for name, want := range map[string]float64{
			"idem_consumer_applied_total": 2, "idem_consumer_duplicates_total": 1, "idem_consumer_dead_letters_total": 1,
			"idem_consumer_retries_total": 1, "idem_outbox_published_total": 2,
		} {
			if v, _ := promtest.Sum(fams, name, nil); v != want {
				missing = append(missing, fmt.Sprintf("%s %v of %v", name, v, want))
			}
		}
		return len(missing) == 0, strings.Join(missing, ", ")
	})
	if testing.Verbose() {
		_, body := promtest.Get(t, base+"/metrics")
		t.Logf("the scrape:\n%s", body)
	}

	ex := exportedBy(fams)
	for _, check := range []func(exported) (int, error){checkAlerts, checkDashboard} {
		n, err := check(ex)
		if err != nil {
			t.Error(err)
		}
		if n == 0 {
			t.Error("no expression checked")
		}
		t.Logf("%d expressions checked", n)
	}

	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := relay.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	for _, done := range []chan error{consumerDone, relayDone} {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}
