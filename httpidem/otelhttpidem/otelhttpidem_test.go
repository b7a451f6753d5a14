package otelhttpidem_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/sqlitestore"
	"github.com/idemkit/idem/httpidem"
	"github.com/idemkit/idem/httpidem/otelhttpidem"
	"github.com/idemkit/idem/internal/testenv/sqlitetest"
)

// requests sums idem.http.requests by outcome for a route.
func requests(t *testing.T, reader *sdkmetric.ManualReader, route string) map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "idem.http.requests" {
				continue
			}
			for _, p := range m.Data.(metricdata.Sum[int64]).DataPoints {
				if r, _ := p.Attributes.Value("http.route"); r.AsString() != route {
					continue
				}
				o, _ := p.Attributes.Value(otelhttpidem.AttrOutcome)
				out[o.AsString()] += p.Value
			}
		}
	}
	return out
}

// TestOutcomesAndSpans: the outcomes the Postgres test does not reach —
// a body over the limit, a keyless request of an Optional route, a body
// that cannot be fingerprinted — are counted as such; a request gets a
// SERVER span under its traceparent header, or an INTERNAL child of a span
// its context holds.
func TestOutcomesAndSpans(t *testing.T) {
	st, _ := sqlitetest.Store(t, sqlitestore.Config{})
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background()) //nolint:errcheck
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	defer tp.Shutdown(context.Background()) //nolint:errcheck
	tel, err := otelhttpidem.New(otelhttpidem.Config{MeterProvider: mp, TracerProvider: tp, Routes: []string{"POST /orders"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := otelhttpidem.New(otelhttpidem.Config{Routes: []string{"/orders"}}); err == nil {
		t.Error("a route without a method was accepted")
	}
	if got := requests(t, reader, "/orders"); len(got) != len(httpidem.Outcomes()) || got["executed"] != 0 {
		t.Errorf("at start: %v, want every outcome at 0", got)
	}
	mw, err := httpidem.New(httpidem.Config[*sql.Tx]{Store: st, Observer: tel})
	if err != nil {
		t.Fatal(err)
	}
	fp := func(*http.Request, []byte) (dedup.Fingerprint, error) {
		return dedup.Fingerprint{}, errors.New("no id")
	}
	mux := http.NewServeMux()
	ok := httpidem.TxHandlerFunc[*sql.Tx](func(w http.ResponseWriter, _ *http.Request, _ *sql.Tx) error {
		w.WriteHeader(http.StatusCreated)
		return nil
	})
	mux.Handle("POST /orders", mw.Transactional(httpidem.Route{Optional: true, MaxRequestBytes: 8}, ok))
	mux.Handle("POST /odd", mw.Transactional(httpidem.Route{Fingerprint: fp}, ok))
	tracer := tp.Tracer("test")
	parent, outer := tracer.Start(context.Background(), "router")
	outer.End()
	var sc trace.SpanContext
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Parent") != "" {
			r = r.WithContext(trace.ContextWithSpan(r.Context(), outer))
		}
		mux.ServeHTTP(w, r)
	})
	do := func(path, key, body string, header ...string) int {
		req := httptest.NewRequest(http.MethodPost, path, bytes.NewBufferString(body))
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		w := httptest.NewRecorder()
		handler.ServeHTTP(w, req)
		return w.Code
	}
	client, cspan := tracer.Start(context.Background(), "client")
	cspan.End()
	sc = trace.SpanContextFromContext(client)
	traceparent := "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-01"
	for _, c := range []struct {
		path, key, body string
		header          []string
		want            int
	}{
		{"/orders", "a", `{}`, []string{"Traceparent", traceparent}, http.StatusCreated},
		{"/orders", "b", `{"much":"too long"}`, nil, http.StatusRequestEntityTooLarge},
		{"/orders", "", `{}`, []string{"X-Parent", "1"}, http.StatusCreated},
		{"/odd", "c", `{}`, nil, http.StatusBadRequest},
	} {
		if got := do(c.path, c.key, c.body, c.header...); got != c.want {
			t.Fatalf("%s %q: %d, want %d", c.path, c.key, got, c.want)
		}
	}
	got := requests(t, reader, "/orders")
	if got["executed"] != 1 || got["too_large"] != 1 || got["unkeyed"] != 1 || got["replayed"] != 0 {
		t.Errorf("/orders: %v", got)
	}
	if odd := requests(t, reader, "/odd"); odd["bad_request"] != 1 || len(odd) != 1 {
		t.Errorf("/odd: %v", odd)
	}

	var server, internal []sdktrace.ReadOnlySpan
	for _, s := range spans.Ended() {
		switch s.SpanKind() {
		case trace.SpanKindServer:
			server = append(server, s)
		case trace.SpanKindInternal:
			if s.Name() == "idem POST /orders" {
				internal = append(internal, s)
			}
		}
	}
	if len(server) != 3 || server[0].Name() != "POST /orders" || server[0].Parent().SpanID() != sc.SpanID() ||
		server[0].SpanContext().TraceID() != sc.TraceID() {
		t.Errorf("server spans: %d, the first %q under %v; want 3, the first under the traceparent's %v", len(server), server[0].Name(), server[0].Parent(), sc)
	}
	if !hasAttr(server[0].Attributes(), attribute.Int("http.response.status_code", http.StatusCreated)) ||
		!hasAttr(server[0].Attributes(), otelhttpidem.AttrKey.String("a")) {
		t.Errorf("server span attributes: %v", server[0].Attributes())
	}
	if len(internal) != 1 || internal[0].Parent().SpanID() != trace.SpanContextFromContext(parent).SpanID() ||
		!hasAttr(internal[0].Attributes(), otelhttpidem.AttrOutcome.String("unkeyed")) {
		t.Errorf("internal spans: %v", internal)
	}
}

func hasAttr(attrs []attribute.KeyValue, want attribute.KeyValue) bool {
	for _, a := range attrs {
		if a == want {
			return true
		}
	}
	return false
}
