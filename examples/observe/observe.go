// Package observe is what the examples use to be operated: /metrics in
// Prometheus' text format and /healthz for probes, served over HTTP.
//
// /metrics is OpenTelemetry's Prometheus exporter (a bridge onto
// client_golang's registry, served by promhttp) reading the meter provider
// that consumer/otelconsumer records into. The instruments are defined once,
// through OpenTelemetry's API; Prometheus is one way to read them, an OTLP
// exporter another, and neither changes the consumer's code. client_golang
// alone would have meant a second set of instruments beside OpenTelemetry's.
package observe

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/idemkit/idem/consumer"
)

// Metrics returns a meter provider and the handler that serves its
// instruments in Prometheus' text format. Shut the provider down when done.
func Metrics() (*sdkmetric.MeterProvider, http.Handler, error) {
	reg := prometheus.NewRegistry()
	exp, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo(), otelprom.WithoutTargetInfo())
	if err != nil {
		return nil, nil, err
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
	return mp, promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), nil
}

// healthJSON is /healthz's body.
type healthJSON struct {
	Ready        bool      `json:"ready"`
	Live         bool      `json:"live"`
	Error        string    `json:"error,omitempty"`
	Running      bool      `json:"running"`
	StoppedLanes []string  `json:"stopped_lanes,omitempty"`
	InFlight     int64     `json:"in_flight"`
	LastProgress time.Time `json:"last_progress"`
}

// Health serves a consumer's health (consumer.Consumer.Health) as JSON:
// 200 when it is ready and live, 503 when not. ?probe=live checks liveness
// only (for a liveness probe: a database away is not a reason to restart),
// ?probe=ready readiness only. stall bounds the time without progress while
// messages are in flight.
func Health(health func(context.Context) consumer.Health, stall time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
		defer cancel()
		h := health(ctx)
		ready, live := h.Ready(), h.Live(stall)
		var err error
		switch r.URL.Query().Get("probe") {
		case "live":
			err = live
		case "ready":
			err = ready
		default:
			err = errors.Join(ready, live)
		}
		body := healthJSON{Ready: ready == nil, Live: live == nil, Running: h.Running, StoppedLanes: h.StoppedLanes, InFlight: h.InFlight, LastProgress: h.LastProgress}
		w.Header().Set("Content-Type", "application/json")
		if err != nil {
			body.Error = err.Error()
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		_ = json.NewEncoder(w).Encode(body)
	})
}

// Serve serves h on addr (":0" picks a port) until the returned stop is
// called, and returns the address it listens on.
func Serve(addr string, h http.Handler) (string, func(), error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	stop := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-done
	}
	return ln.Addr().String(), stop, nil
}
