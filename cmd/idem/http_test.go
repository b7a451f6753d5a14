package main

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/httpidem"
	"github.com/idemkit/idem/httpidem/otelhttpidem"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/internal/testenv/pgtest"
	"github.com/idemkit/idem/observe"
)

// replayHistogram is otelhttpidem's replay-age histogram as /metrics has
// it, for one route: cumulative counts per bucket bound.
func replayHistogram(method, route string, cumulative map[string]int) string {
	return histogram(replayAgeMetric, fmt.Sprintf(`http_request_method=%q,http_route=%q`, method, route), cumulative)
}

// TestHTTPScopeStatusAndRetention: an HTTP service on Postgres whose
// requests executed, replayed and left a leased key stuck, beside a
// consumer's scope. `idem status` tells the HTTP scope apart by its rows'
// states and counts them, the stuck one too; `idem retention` speaks of
// the scope's retries, read from the service's own /metrics, and of the
// consumer's duplicates.
func TestHTTPScopeStatusAndRetention(t *testing.T) {
	pool, schema := testenv.SchemaPool(t)
	ctx := testenv.Context(t, time.Minute)
	store := pgtest.Store(t, pool, schema)
	if err := store.RecordFailure(ctx, dedup.Claim{Key: dedup.Key{Scope: "payments", ID: "P1"}, Fingerprint: dedup.FingerprintOf([]byte("P1"))}, "closed"); err != nil {
		t.Fatal(err)
	}
	obs, err := observe.New(observe.Config{Logger: testenv.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer obs.Close(context.Background()) //nolint:errcheck
	tel, err := obs.HTTPTelemetry(otelhttpidem.Config{Routes: []string{"POST /orders"}})
	if err != nil {
		t.Fatal(err)
	}
	mw, err := httpidem.New(httpidem.Config[pgx.Tx]{Store: store, Observer: tel, Logger: testenv.Logger(t),
		Tenant: func(*http.Request) (string, error) { return "acme", nil }})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /orders", mw.Transactional(httpidem.Route{Retention: time.Hour}, httpidem.TxHandlerFunc[pgx.Tx](
		func(w http.ResponseWriter, _ *http.Request, _ pgx.Tx) error {
			w.WriteHeader(http.StatusCreated)
			return nil
		})))
	mux.Handle("POST /refunds", mw.Leased(httpidem.Route{Retention: time.Hour, Lease: time.Millisecond})(http.HandlerFunc(
		func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusBadGateway) })))
	mux.Handle("GET /metrics", obs.Handler())
	srv := httptest.NewServer(mux)
	defer srv.Close()
	post := func(path, key string) int {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+path, bytes.NewBufferString(`{}`))
		req.Header.Set("Idempotency-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	// o1 executed, then replayed twice; o2 executed; r1 answers 502 and
	// its lease of a millisecond runs out: stuck.
	for _, k := range []string{"o1", "o1", "o1", "o2"} {
		if code := post("/orders", k); code != http.StatusCreated {
			t.Fatalf("order %s: %d", k, code)
		}
	}
	if code := post("/refunds", "r1"); code != http.StatusBadGateway {
		t.Fatalf("refund: %d", code)
	}
	testenv.WaitUntil(t, time.Minute, "r1 to be stuck", func() bool {
		n, err := store.CountStuckRequests(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return n["POST /refunds#acme"] == 1
	})

	envs := map[string]string{"IDEM_PG_URL": testenv.PostgresURL(t), "IDEM_PG_SCHEMA": schema}
	code, out, _ := idem(t, "", envs, "status", "--json")
	kinds := map[string]summaryJSON{}
	for _, s := range decode[[]summaryJSON](t, out) {
		kinds[s.Scope] = s
	}
	if s := kinds["POST /orders#acme"]; code != exitOK || s.Kind != "http" || s.Finished != 2 || s.Processing != 0 || s.Stuck != 0 {
		t.Errorf("status, orders: %d %+v", code, s)
	}
	if s := kinds["POST /refunds#acme"]; s.Kind != "http" || s.Processing != 1 || s.Stuck != 1 {
		t.Errorf("status, refunds: %+v", s)
	}
	if s := kinds["payments"]; s.Kind != "consumer" || s.Finished+s.Processing+s.Stuck != 0 {
		t.Errorf("status, payments: %+v", s)
	}
	code, out, _ = idem(t, "", envs, "status")
	if code != exitOK || !strings.Contains(out, "HTTP SCOPE") || !strings.Contains(out, "1 stuck: requests whose lease ran out") ||
		strings.Contains(out[strings.Index(out, "HTTP SCOPE"):], "payments") {
		t.Errorf("status: %d %q", code, out)
	}

	// Without metrics: each kind is told where its ages come from.
	code, out, _ = idem(t, "", envs, "retention", "--json")
	adv := map[string]retentionJSON{}
	for _, r := range decode[[]retentionJSON](t, out) {
		adv[r.Scope] = r
	}
	if r := adv["POST /orders#acme"]; code != exitOK || r.Kind != "http" || r.Advice != "no_data" || !strings.Contains(r.AdviceText, "no retry ages") || !strings.Contains(r.AdviceText, "otelhttpidem") {
		t.Errorf("retention without metrics, orders: %d %+v", code, r)
	}
	if r := adv["payments"]; r.Kind != "consumer" || !strings.Contains(r.AdviceText, "no duplicate ages") {
		t.Errorf("retention without metrics, payments: %+v", r)
	}

	// The service's own /metrics: o1's two replays came within a second of
	// it, well inside an hour. Nothing was replayed on /refunds, and the
	// consumer's scope has no consumer there.
	code, out, _ = idem(t, "", envs, "retention", "--json", "--metrics", srv.URL+"/metrics")
	adv = map[string]retentionJSON{}
	for _, r := range decode[[]retentionJSON](t, out) {
		adv[r.Scope] = r
	}
	if r := adv["POST /orders#acme"]; code != exitOK || r.Advice != "ok" || r.Duplicates != 2 || r.AdviceText != "99.9% of retries arrive within 1s" {
		t.Errorf("retention, orders: %d %+v", code, r)
	}
	if r := adv["POST /refunds#acme"]; r.Advice != "no_data" || r.AdviceText != "no retry with this scope's keys was answered from a stored response yet" {
		t.Errorf("retention, refunds: %+v", r)
	}
	if r := adv["payments"]; r.Advice != "no_data" || r.AdviceText != "the consumer has seen no duplicates yet" {
		t.Errorf("retention, payments: %+v", r)
	}

	// Retries six hours late on a route that keeps its keys an hour.
	late := map[string]int{"1": 10, "10": 10, "60": 10, "600": 10, "3600": 10, "21600": 1000, "86400": 1000, "604800": 1000, "2.592e+06": 1000, "7.776e+06": 1000, "+Inf": 1000}
	body := replayHistogram("POST", "/orders", late)
	metrics := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, body) }))
	defer metrics.Close()
	code, out, _ = idem(t, "", envs, "retention", "--metrics", metrics.URL)
	if code != exitPartial || !strings.Contains(out, "too_short: 99.9% of retries arrive within 6h0m: keep keys at least 12h0m (×2) (httpidem.Route.Retention)") ||
		strings.Count(out, "the consumer has seen no duplicates yet") != 1 {
		t.Errorf("retention, late retries: %d %q", code, out)
	}
}
