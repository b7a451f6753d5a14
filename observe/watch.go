package observe

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/idemkit/idem/httpidem/otelhttpidem"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/outbox/oteloutbox"
)

// watchedRelay is one outbox relay /healthz reports on, and its metrics.
type watchedRelay struct {
	o   *outbox.Outbox
	r   *outbox.Relay
	reg metric.Registration
}

// watchedHTTP is one request store /healthz reports on, and its gauge.
type watchedHTTP struct {
	name string
	st   otelhttpidem.StuckCounter
	reg  metric.Registration
}

// HTTPTelemetry returns an httpidem.Observer recording into /metrics:
// otelhttpidem.New with the Server's meter provider (unless cfg has one).
// Set it as httpidem.Config.Observer, and WatchHTTP the middleware's store.
// Its counters are at zero for cfg.Routes from here on.
func (s *Server) HTTPTelemetry(cfg otelhttpidem.Config) (*otelhttpidem.Telemetry, error) {
	if cfg.MeterProvider == nil {
		cfg.MeterProvider = s.mp
	}
	return otelhttpidem.New(cfg)
}

// WatchHTTP adds the request store of an httpidem.Middleware (a
// *pgstore.Store or *sqlitestore.Store) to /healthz under name — ready
// while the store answers, with its stuck requests — and, given the
// Telemetry that is the middleware's Observer, the gauge
// idem.http.requests.stuck to /metrics (otelhttpidem.Telemetry.ObserveStore).
func (s *Server) WatchHTTP(name string, st otelhttpidem.StuckCounter, tel *otelhttpidem.Telemetry) error {
	if st == nil {
		return errors.New("observe: WatchHTTP of a nil store")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errors.New("observe: WatchHTTP after Close")
	}
	for _, w := range s.http {
		if w.name == name {
			return fmt.Errorf("observe: a request store named %q is watched already", name)
		}
	}
	w := watchedHTTP{name: name, st: st}
	if tel != nil {
		reg, err := tel.ObserveStore(st)
		if err != nil {
			return err
		}
		w.reg = reg
	}
	s.http = append(s.http, w)
	return nil
}

// WatchRelay adds an outbox relay to /healthz — ready while it runs, live
// while a round went through within Config.Stall — and its counters and
// the outbox's backlog to /metrics (oteloutbox.Observe: published,
// republished, dead-lettered, failed, rounds, failed rounds, pending, the
// oldest pending row's age), every counter at zero from here on. Call it
// before Run.
func (s *Server) WatchRelay(o *outbox.Outbox, r *outbox.Relay) error {
	if o == nil || r == nil {
		return errors.New("observe: WatchRelay of a nil outbox or relay")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errors.New("observe: WatchRelay after Close")
	}
	for _, w := range s.relays {
		if w.r == r {
			return errors.New("observe: the relay is watched already")
		}
	}
	reg, err := oteloutbox.Observe(oteloutbox.Config{MeterProvider: s.mp}, o, r)
	if err != nil {
		return err
	}
	s.relays = append(s.relays, watchedRelay{o: o, r: r, reg: reg})
	return nil
}

// RelayJSON is one watched relay in /healthz.
type RelayJSON struct {
	Table   string `json:"table"` // the outbox's schema.table
	Running bool   `json:"running"`
	Ready   bool   `json:"ready"` // running
	Live    bool   `json:"live"`  // not running, or a round went through within Config.Stall
	Error   string `json:"error,omitempty"`
	// LastProgress is when a round last went through (an empty one too);
	// null before Run.
	LastProgress *time.Time `json:"last_progress"`
	Rounds       int64      `json:"rounds"`
	FailedRounds int64      `json:"failed_rounds"`
	// FailingRounds are the failed rounds since the last that went through.
	FailingRounds int64 `json:"failing_rounds"`
	// Pending is the outbox's rows not published yet, OldestPendingSec the
	// age of the oldest; both -1 when the outbox did not answer.
	Pending          int64   `json:"pending"`
	OldestPendingSec float64 `json:"oldest_pending_seconds"`
}

// HTTPJSON is one watched request store in /healthz.
type HTTPJSON struct {
	Name  string `json:"name"`
	Ready bool   `json:"ready"` // the store answers
	Error string `json:"error,omitempty"`
	// Stuck counts the Processing keys whose lease ran out, by scope.
	Stuck map[string]int64 `json:"stuck"`
}

// relayHealth is a relay's /healthz entry and its probes' errors.
func (s *Server) relayHealth(ctx context.Context, w watchedRelay, now time.Time) (rj RelayJSON, ready, live error) {
	h := w.r.Health()
	rj = RelayJSON{Table: strings.ReplaceAll(w.o.Table(), `"`, ""), Running: h.Running, LastProgress: timePtr(h.LastProgress),
		Rounds: h.Rounds, FailedRounds: h.FailedRounds, FailingRounds: h.FailingRounds, Pending: -1, OldestPendingSec: -1}
	if !h.Running {
		ready = errors.New("the relay is not running")
	}
	if h.Running && now.Sub(h.LastProgress) > s.cfg.Stall {
		live = fmt.Errorf("no round went through for %s (failing rounds: %d)", now.Sub(h.LastProgress).Round(time.Second), h.FailingRounds)
		if h.LastError != nil {
			live = fmt.Errorf("%w: %v", live, h.LastError)
		}
	}
	if p, err := w.o.Pending(ctx); err == nil {
		rj.Pending, rj.OldestPendingSec = p.Count, p.OldestAge.Seconds()
	} else {
		ready = errors.Join(ready, err)
	}
	rj.Ready, rj.Live = ready == nil, live == nil
	return rj, ready, live
}

// httpHealth is a request store's /healthz entry and its readiness error.
func httpHealth(ctx context.Context, w watchedHTTP) (HTTPJSON, error) {
	hj := HTTPJSON{Name: w.name, Stuck: map[string]int64{}}
	n, err := w.st.CountStuckRequests(ctx)
	if err != nil {
		hj.Error = err.Error()
		return hj, err
	}
	hj.Ready = true
	for k, v := range n {
		hj.Stuck[k] = v
	}
	return hj, nil
}
