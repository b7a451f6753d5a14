package observe_test

import (
	"bytes"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	dto "github.com/prometheus/client_model/go"

	"github.com/idemkit/idem/httpidem"
	"github.com/idemkit/idem/httpidem/otelhttpidem"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/internal/testenv/kafkatest"
	"github.com/idemkit/idem/internal/testenv/pgtest"
	"github.com/idemkit/idem/internal/testenv/promtest"
	"github.com/idemkit/idem/internal/testenv/relaytest"
	"github.com/idemkit/idem/observe"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/outbox/kafkapub"
)

// httpCounters are the HTTP series a scrape lists at 0 for a route of
// otelhttpidem.Config.Routes, with their extra labels.
func httpCounters() map[string][]map[string]string {
	c := map[string][]map[string]string{"idem_http_lease_takeovers_total": {{}}}
	for _, o := range httpidem.Outcomes() {
		c["idem_http_requests_total"] = append(c["idem_http_requests_total"], map[string]string{"idem_http_outcome": o.String()})
	}
	for _, op := range []string{"finish", "extend", "end"} {
		c["idem_http_lease_fenced_total"] = append(c["idem_http_lease_fenced_total"], map[string]string{"idem_lease_operation": op})
	}
	return c
}

// outboxSeries are the outbox's series, counters and gauges, all at 0
// before anything is enqueued.
var outboxSeries = []string{
	"idem_outbox_published_total", "idem_outbox_republished_total", "idem_outbox_dead_lettered_total",
	"idem_outbox_failed_total", "idem_outbox_rounds_total", "idem_outbox_failed_rounds_total",
	"idem_outbox_pending", "idem_outbox_oldest_pending_age_seconds",
}

func with(base map[string]string, kv ...string) map[string]string {
	out := map[string]string{}
	for k, v := range base {
		out[k] = v
	}
	for i := 0; i+1 < len(kv); i += 2 {
		out[kv[i]] = kv[i+1]
	}
	return out
}

// TestHTTPAndOutboxMetrics serves an idempotent payments API whose
// handler writes a payment and enqueues an outbox message in the request's
// transaction, and a relay publishing the outbox to Kafka, behind one
// Server. A scrape right after start lists every HTTP series of the
// declared routes and every outbox series at 0. Then requests of each
// outcome — executed, replayed, 409 in flight, 422 mismatch, 400 bad key,
// a leased request left stuck, taken over and fenced — and the relay's
// publishing: the series equal what happened, counted on the payments
// table, the outbox and the topic.
func TestHTTPAndOutboxMetrics(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	pool, schema := testenv.SchemaPool(t)
	ctx := testenv.Context(t, 3*time.Minute)
	admin := kafkatest.NewAdmin(t, brokers)
	topic := testenv.Name(t, "observe_outbox")
	admin.CreateTopic(t, topic, 1)
	if _, err := pool.Exec(ctx, `CREATE TABLE payments (id text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	store := pgtest.Store(t, pool, schema)
	ob := relaytest.OutboxIn(t, pool, schema)

	obs, err := observe.New(observe.Config{Logger: testenv.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	tel, err := obs.HTTPTelemetry(otelhttpidem.Config{Routes: []string{"POST /payments", "POST /payouts"}})
	if err != nil {
		t.Fatal(err)
	}
	mw, err := httpidem.New(httpidem.Config[pgx.Tx]{Store: store, Observer: tel, Logger: testenv.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := obs.WatchHTTP("payments", store, tel); err != nil {
		t.Fatal(err)
	}
	pub, err := kafkapub.New(kafkapub.Config{Brokers: brokers})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	relay, err := outbox.NewRelay(outbox.RelayConfig{Outbox: ob, Publisher: pub, PollInterval: 5 * time.Millisecond, Logger: testenv.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := obs.WatchRelay(ob, relay); err != nil {
		t.Fatal(err)
	}
	if err := obs.WatchRelay(ob, relay); err == nil {
		t.Error("the same relay watched twice")
	}

	// POST /payments: transactional. The payment "slow" waits for hold to
	// close, to be in flight when its retry comes.
	hold, holding := make(chan struct{}), make(chan struct{})
	mux := http.NewServeMux()
	mux.Handle("POST /payments", mw.Transactional(httpidem.Route{}, relaytest.PaymentsHandler(ob, topic, hold, holding)))
	// POST /payouts: leased, with a lease of 50ms. The first call of a
	// key answers 503 (the outcome is uncertain: the lease runs on and
	// the key is stuck once it ran out) or, for "zombie", waits for
	// release and answers 200 after its lease was taken over; the calls
	// after the first answer 200.
	var mu sync.Mutex
	calls := map[string]int{}
	release, waiting := make(chan struct{}), make(chan struct{})
	mux.Handle("POST /payouts", mw.Leased(httpidem.Route{Lease: 50 * time.Millisecond})(http.HandlerFunc(
		func(w http.ResponseWriter, r *http.Request) {
			id := httpidem.LeaseFrom(r.Context()).Key().ID
			mu.Lock()
			calls[id]++
			n := calls[id]
			mu.Unlock()
			switch {
			case n == 1 && id == "zombie":
				close(waiting)
				<-release
			case n == 1:
				w.WriteHeader(http.StatusServiceUnavailable)
				return
			}
			w.WriteHeader(http.StatusOK)
		})))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	post := func(path, key, body string) *http.Response {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+path, bytes.NewBufferString(body))
		if err != nil {
			t.Fatal(err)
		}
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	base := promtest.Serve(t, obs)
	payments := map[string]string{"http_request_method": "POST", "http_route": "/payments"}
	payouts := map[string]string{"http_request_method": "POST", "http_route": "/payouts"}
	table := map[string]string{"idem_outbox_table": schema + ".idem_outbox"}

	// Right after start: every series, at 0.
	fams := promtest.Scrape(t, base)
	for _, route := range []map[string]string{payments, payouts} {
		for name, sets := range httpCounters() {
			if f := fams[name]; f == nil || f.GetType() != dto.MetricType_COUNTER {
				t.Errorf("%s: not listed as a counter", name)
				continue
			}
			for _, extra := range sets {
				where := with(route)
				for k, v := range extra {
					where[k] = v
				}
				if v, n := promtest.Sum(fams, name, where); n != 1 || v != 0 {
					t.Errorf("%s%v: %d samples, sum %v; want one at 0", name, where, n, v)
				}
			}
		}
		if v, n := promtest.Sum(fams, "idem_http_requests_stuck", route); n != 1 || v != 0 {
			t.Errorf("idem_http_requests_stuck%v: %d samples, %v; want one at 0", route, n, v)
		}
	}
	for _, name := range outboxSeries {
		if v, n := promtest.Sum(fams, name, table); n != 1 || v != 0 {
			t.Errorf("%s: %d samples, sum %v; want one at 0", name, n, v)
		}
	}

	done := make(chan error, 1)
	go func() { done <- relay.Run(ctx) }()

	// Executed: three payments; replayed: two retries of p1; 422: p1's
	// key with another body; 400: no key, and a key too long.
	for _, id := range []string{"p1", "p2", "p3"} {
		if resp := post("/payments", "k-"+id, `{"id":"`+id+`"}`); resp.StatusCode != http.StatusCreated {
			t.Fatalf("payment %s: %s", id, resp.Status)
		}
	}
	for range 2 {
		if resp := post("/payments", "k-p1", `{"id":"p1"}`); resp.StatusCode != http.StatusCreated || resp.Header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("retry of p1: %s %v", resp.Status, resp.Header)
		}
	}
	if resp := post("/payments", "k-p1", `{"id":"p9"}`); resp.StatusCode != http.StatusUnprocessableEntity {
		t.Fatalf("p1's key for another body: %s", resp.Status)
	}
	if resp := post("/payments", "", `{"id":"p8"}`); resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("no key: %s", resp.Status)
	}
	if resp := post("/payments", string(bytes.Repeat([]byte("k"), 300)), `{"id":"p7"}`); resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("a key too long: %s", resp.Status)
	}
	// 409: "slow" in flight, its retry meanwhile; then "slow" executes.
	slow := make(chan *http.Response, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/payments", bytes.NewBufferString(`{"id":"slow"}`))
		req.Header.Set("Idempotency-Key", "k-slow")
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		slow <- resp
	}()
	<-holding
	if resp := post("/payments", "k-slow", `{"id":"slow"}`); resp.StatusCode != http.StatusConflict {
		t.Fatalf("slow's retry while it runs: %s", resp.Status)
	}
	close(hold)
	if resp := <-slow; resp == nil || resp.StatusCode != http.StatusCreated {
		t.Fatalf("slow: %v", resp)
	}

	// Leased: "crash" answers 503 and its lease runs out: a stuck key.
	if resp := post("/payouts", "crash", `{}`); resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("payout crash: %s", resp.Status)
	}
	testenv.WaitUntilProgress(t, time.Minute, "the stuck gauge to show crash", func() (bool, string) {
		v, _ := promtest.Sum(promtest.Scrape(t, base), "idem_http_requests_stuck", payouts)
		return v == 1, fmt.Sprintf("stuck %v", v)
	})
	// Its retry takes it over and finishes it.
	if resp := post("/payouts", "crash", `{}`); resp.StatusCode != http.StatusOK {
		t.Fatalf("payout crash, retried: %s", resp.Status)
	}
	// "zombie" waits past its lease; a retry takes it over and finishes;
	// zombie's own finish is fenced: 409.
	zombie := make(chan *http.Response, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/payouts", bytes.NewBufferString(`{}`))
		req.Header.Set("Idempotency-Key", "zombie")
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		zombie <- resp
	}()
	<-waiting
	testenv.WaitUntilProgress(t, time.Minute, "zombie's lease to run out", func() (bool, string) {
		stuck, err := store.StuckRequests(ctx, 10)
		if err != nil {
			t.Fatal(err)
		}
		return len(stuck) == 1, fmt.Sprintf("%d stuck", len(stuck))
	})
	if resp := post("/payouts", "zombie", `{}`); resp.StatusCode != http.StatusOK {
		t.Fatalf("zombie's retry: %s", resp.Status)
	}
	close(release)
	if resp := <-zombie; resp == nil || resp.StatusCode != http.StatusConflict {
		t.Fatalf("zombie, fenced: %v", resp)
	}

	// What the tables and the topic say.
	var rows int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM payments`).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != 4 {
		t.Fatalf("payments: %d rows, want 4 (p1, p2, p3, slow)", rows)
	}
	testenv.WaitUntilProgress(t, time.Minute, "the relay to publish every payment", func() (bool, string) {
		p, err := ob.Pending(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return p.Count == 0 && relay.Stats().Published == int64(rows), fmt.Sprintf("%d pending, %+v", p.Count, relay.Stats())
	})
	if got := len(admin.ReadAll(t, topic)); got != rows {
		t.Fatalf("topic: %d messages, want %d", got, rows)
	}

	// What the metrics say: the same. The request counters are recorded
	// as the responses are sent: poll.
	want := []struct {
		route   map[string]string
		outcome string
		n       float64
	}{
		{payments, "executed", 4}, {payments, "replayed", 2}, {payments, "mismatch", 1}, {payments, "bad_key", 2},
		{payments, "in_flight", 1}, {payments, "failed", 0}, {payments, "unkeyed", 0},
		{payouts, "executed", 2}, {payouts, "failed", 1}, {payouts, "lease_lost", 1}, {payouts, "in_flight", 0},
	}
	testenv.WaitUntilProgress(t, time.Minute, "the series to show what happened", func() (bool, string) {
		fams = promtest.Scrape(t, base)
		for _, w := range want {
			if v, _ := promtest.Sum(fams, "idem_http_requests_total", with(w.route, "idem_http_outcome", w.outcome)); v != w.n {
				return false, fmt.Sprintf("%v %s: %v, want %v", w.route, w.outcome, v, w.n)
			}
		}
		published, _ := promtest.Sum(fams, "idem_outbox_published_total", table)
		pending, _ := promtest.Sum(fams, "idem_outbox_pending", table)
		return published == float64(rows) && pending == 0, fmt.Sprintf("published %v, pending %v", published, pending)
	})
	checks := []struct {
		name  string
		where map[string]string
		want  float64
	}{
		{"idem_http_lease_takeovers_total", payouts, 2},
		{"idem_http_lease_fenced_total", with(payouts, "idem_lease_operation", "finish"), 1},
		{"idem_http_lease_takeovers_total", payments, 0},
		{"idem_http_requests_stuck", payouts, 0},
		{"idem_outbox_republished_total", table, 0},
		{"idem_outbox_dead_lettered_total", table, 0},
		{"idem_outbox_failed_total", table, 0},
		{"idem_outbox_failed_rounds_total", table, 0},
		{"idem_outbox_oldest_pending_age_seconds", table, 0},
	}
	for _, c := range checks {
		if v, n := promtest.Sum(fams, c.name, c.where); n != 1 || v != c.want {
			t.Errorf("%s%v: %d samples, %v; want %v", c.name, c.where, n, v, c.want)
		}
	}
	if v, _ := promtest.Sum(fams, "idem_outbox_rounds_total", table); v < 1 || v > float64(rows) {
		t.Errorf("rounds %v, want 1 to %d", v, rows)
	}
	if h := fams["idem_http_replay_age_seconds"]; h == nil || h.GetType() != dto.MetricType_HISTOGRAM || h.GetMetric()[0].GetHistogram().GetSampleCount() != 2 {
		t.Errorf("replay ages: %v, want a histogram of the 2 replays", h)
	}
	code, hz := healthz(t, base, "")
	if code != http.StatusOK || len(hz.Relays) != 1 || !hz.Relays[0].Running || hz.Relays[0].Pending != 0 || hz.Relays[0].LastProgress == nil ||
		len(hz.HTTP) != 1 || !hz.HTTP[0].Ready {
		t.Errorf("healthz: %d %+v", code, hz)
	}

	if err := relay.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if code, hz := healthz(t, base, "?probe=ready"); code != http.StatusServiceUnavailable || len(hz.Relays) != 1 || hz.Relays[0].Running {
		t.Errorf("relay stopped, ready probe: %d %+v", code, hz)
	}
}
