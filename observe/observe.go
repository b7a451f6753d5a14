package observe

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/idemkit/idem/consumer/otelconsumer"
)

// Config configures a Server. Zero values take the defaults.
type Config struct {
	// Stall bounds how long a consumer that holds messages, or a lane its
	// source reports, may make no progress before /healthz says it is not
	// live (consumer.Health.Live, StalledLanes) and the lanes.stalled gauge
	// counts the lane; default 1 minute.
	Stall time.Duration
	// Registry is the Prometheus registry /metrics serves, for an
	// application that has one already; default a new registry with the Go
	// runtime and process collectors on it (collectors.NewGoCollector,
	// NewProcessCollector). A given registry is left as it is: register
	// them yourself if it lacks them.
	Registry *prometheus.Registry
	// Logger receives what the HTTP server cannot answer; default
	// slog.Default().
	Logger *slog.Logger
}

// Server serves a process's consumers: /metrics and /healthz. Safe for
// concurrent use.
type Server struct {
	cfg Config
	reg *prometheus.Registry
	mp  *sdkmetric.MeterProvider
	mux *http.ServeMux

	mu       sync.Mutex
	watched  []watched
	relays   []watchedRelay
	http     []watchedHTTP
	journals []watchedJournal
	closed   bool
}

// watched is one consumer /healthz reports on, and its gauges.
type watched struct {
	c   otelconsumer.HealthReporter
	reg metric.Registration // nil without a Telemetry
}

// New returns a Server whose meter provider records into /metrics.
// Close it when done.
func New(cfg Config) (*Server, error) {
	if cfg.Stall < 0 {
		return nil, fmt.Errorf("observe: Config.Stall is negative (%v)", cfg.Stall)
	}
	if cfg.Stall == 0 {
		cfg.Stall = time.Minute
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	reg := cfg.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	exp, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo(), otelprom.WithoutTargetInfo())
	if err != nil {
		return nil, fmt.Errorf("observe: the Prometheus exporter: %w", err)
	}
	s := &Server{cfg: cfg, reg: reg, mp: sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp)), mux: http.NewServeMux()}
	s.mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		ErrorLog: promLogger{cfg.Logger}, ErrorHandling: promhttp.ContinueOnError,
	}))
	s.mux.Handle("/healthz", http.HandlerFunc(s.healthz))
	return s, nil
}

// MeterProvider is the provider whose instruments /metrics serves. Give it
// to whatever else should appear there (otelpgx, an HTTP middleware).
func (s *Server) MeterProvider() *sdkmetric.MeterProvider { return s.mp }

// Registry is the Prometheus registry /metrics serves.
func (s *Server) Registry() *prometheus.Registry { return s.reg }

// Telemetry returns a consumer.Observer recording into /metrics:
// otelconsumer.New with the Server's meter provider (unless cfg has one).
// Use one per consumer, and Watch the consumer with it.
func (s *Server) Telemetry(cfg otelconsumer.Config) (*otelconsumer.Telemetry, error) {
	if cfg.MeterProvider == nil {
		cfg.MeterProvider = s.mp
	}
	return otelconsumer.New(cfg)
}

// Watch adds a consumer (a *consumer.Consumer[TTx]) to /healthz, and, given
// the Telemetry that is its Observer, its health gauges and every counter
// at zero to /metrics (otelconsumer.Telemetry.Observe). Call it before Run:
// a scrape from then on lists every counter.
func (s *Server) Watch(c otelconsumer.HealthReporter, tel *otelconsumer.Telemetry) error {
	if c == nil {
		return errors.New("observe: Watch of a nil consumer")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errors.New("observe: Watch after Close")
	}
	for _, w := range s.watched {
		if w.c.Name() == c.Name() {
			return fmt.Errorf("observe: a consumer named %q is watched already", c.Name())
		}
	}
	w := watched{c: c}
	if tel != nil {
		reg, err := tel.Observe(c, s.cfg.Stall)
		if err != nil {
			return err
		}
		w.reg = reg
	}
	s.watched = append(s.watched, w)
	return nil
}

// Handler serves /metrics (Prometheus' text format) and /healthz (see
// package doc). Mount it on a mux of your own, or use Serve.
func (s *Server) Handler() http.Handler { return s.mux }

// Serve serves Handler on ln until ctx ends, then shuts the HTTP server
// down (bounded by 5 seconds) and returns nil; otherwise it returns why it
// stopped serving.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{Handler: s.mux, ReadHeaderTimeout: 5 * time.Second,
		ErrorLog: slog.NewLogLogger(s.cfg.Logger.Handler(), slog.LevelWarn)}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("observe: serve %s: %w", ln.Addr(), err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	err := srv.Shutdown(sctx)
	if serr := <-errc; !errors.Is(serr, http.ErrServerClosed) && serr != nil {
		err = errors.Join(err, serr)
	}
	return err
}

// ListenAndServe listens on addr (host:port) and serves as Serve does.
func (s *Server) ListenAndServe(ctx context.Context, addr string) error {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("observe: %w", err)
	}
	return s.Serve(ctx, ln)
}

// Close unregisters the gauges of what it watches and shuts the meter provider
// down (what /metrics serves stops moving). A second call does nothing.
func (s *Server) Close(ctx context.Context) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	ws, rs, hs, js := s.watched, s.relays, s.http, s.journals
	s.mu.Unlock()
	var errs []error
	for _, w := range ws {
		if w.reg != nil {
			errs = append(errs, w.reg.Unregister())
		}
	}
	for _, w := range rs {
		errs = append(errs, w.reg.Unregister())
	}
	for _, w := range hs {
		if w.reg != nil {
			errs = append(errs, w.reg.Unregister())
		}
	}
	for _, w := range js {
		errs = append(errs, w.reg.Unregister())
	}
	errs = append(errs, s.mp.Shutdown(ctx))
	return errors.Join(errs...)
}

// promLogger puts promhttp's errors into slog.
type promLogger struct{ l *slog.Logger }

func (p promLogger) Println(v ...any) {
	p.l.Warn("observe: /metrics", slog.String("error", fmt.Sprint(v...)))
}
