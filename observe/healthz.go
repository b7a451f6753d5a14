package observe

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/idemkit/idem/consumer/source"
)

// HealthJSON is /healthz's body.
type HealthJSON struct {
	Ready bool `json:"ready"`
	Live  bool `json:"live"`
	// Error says why the probe fails; empty when it passes.
	Error     string         `json:"error,omitempty"`
	Consumers []ConsumerJSON `json:"consumers"`
	// Relays are the watched outbox relays (WatchRelay), HTTP the watched
	// request stores (WatchHTTP); [] when there are none.
	Relays []RelayJSON `json:"relays"`
	HTTP   []HTTPJSON  `json:"http"`
}

// ConsumerJSON is one watched consumer in /healthz.
type ConsumerJSON struct {
	Name    string `json:"name"`
	System  string `json:"system,omitempty"` // consumer.SourceInfo
	Group   string `json:"group,omitempty"`
	Running bool   `json:"running"`
	Ready   bool   `json:"ready"` // consumer.Health.Ready
	Live    bool   `json:"live"`  // consumer.Health.Live(Config.Stall)
	Error   string `json:"error,omitempty"`
	// Misconfigured is a configuration the messages contradict
	// (consumer.Health.Misconfigured: a key function that failed on most of
	// the first messages). It fails neither probe — a restart does not fix
	// a configuration — but says what to fix.
	Misconfigured string `json:"misconfigured,omitempty"`
	// StoppedLanes are the lanes stopped until a restart
	// (StopLaneOnExhausted, a broken deployment); StalledLanes the lanes
	// the source reports with no progress for longer than Config.Stall,
	// "lane: why" (consumer.Health.StalledLanes). Both are [] when there
	// are none.
	StoppedLanes []string   `json:"stopped_lanes"`
	StalledLanes []string   `json:"stalled_lanes"`
	InFlight     int64      `json:"in_flight"`
	LastProgress *time.Time `json:"last_progress"` // null before Run
	Lanes        []LaneJSON `json:"lanes"`
}

// LaneJSON is a lane as the source reports it (source.LaneStatus).
type LaneJSON struct {
	Lane        string     `json:"lane"`
	Waiting     int64      `json:"waiting"`
	LastFetch   *time.Time `json:"last_fetch"`
	LastSettled *time.Time `json:"last_settled"`
}

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	t = t.UTC()
	return &t
}

// healthz serves /healthz: 200 when every watched consumer passes the
// probe, 503 when one does not (or none is watched). ?probe=ready checks
// readiness only, ?probe=live liveness only, neither both.
func (s *Server) healthz(w http.ResponseWriter, r *http.Request) {
	probe := r.URL.Query().Get("probe")
	if probe != "" && probe != "ready" && probe != "live" {
		http.Error(w, fmt.Sprintf("observe: probe %q: want ready, live or none", probe), http.StatusBadRequest)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	s.mu.Lock()
	ws := append([]watched(nil), s.watched...)
	rs := append([]watchedRelay(nil), s.relays...)
	hs := append([]watchedHTTP(nil), s.http...)
	s.mu.Unlock()

	body := HealthJSON{Ready: true, Live: true, Consumers: make([]ConsumerJSON, 0, len(ws)),
		Relays: make([]RelayJSON, 0, len(rs)), HTTP: make([]HTTPJSON, 0, len(hs))}
	var failed []error
	pick := func(ready, live error) error {
		switch probe {
		case "ready":
			return ready
		case "live":
			return live
		}
		return errors.Join(ready, live)
	}
	if len(ws)+len(rs)+len(hs) == 0 {
		// Not ready: nothing does the work. Live all the same: a restart
		// would not watch one either.
		body.Ready = false
		if probe != "live" {
			failed = append(failed, errors.New("observe: no consumer, relay or request store is watched"))
		}
	}
	now := time.Now()
	for _, wc := range ws {
		h := wc.c.Health(ctx)
		ready, live := h.Ready(), h.Live(s.cfg.Stall)
		info := wc.c.SourceInfo()
		cj := ConsumerJSON{
			Name: wc.c.Name(), System: info.System, Group: info.Group, Running: h.Running,
			Ready: ready == nil, Live: live == nil,
			StoppedLanes: nonNil(h.StoppedLanes), StalledLanes: nonNil(h.StalledLanes(now, s.cfg.Stall)),
			InFlight: h.InFlight, LastProgress: timePtr(h.LastProgress), Lanes: lanes(h.Lanes),
		}
		if h.Misconfigured != nil {
			cj.Misconfigured = h.Misconfigured.Error()
		}
		if err := pick(ready, live); err != nil {
			cj.Error = err.Error()
			failed = append(failed, fmt.Errorf("%s: %w", cj.Name, err))
		}
		body.Ready = body.Ready && cj.Ready
		body.Live = body.Live && cj.Live
		body.Consumers = append(body.Consumers, cj)
	}
	for _, wr := range rs {
		rj, ready, live := s.relayHealth(ctx, wr, now)
		if err := pick(ready, live); err != nil {
			rj.Error = err.Error()
			failed = append(failed, fmt.Errorf("relay %s: %w", rj.Table, err))
		}
		body.Ready = body.Ready && rj.Ready
		body.Live = body.Live && rj.Live
		body.Relays = append(body.Relays, rj)
	}
	for _, wh := range hs {
		hj, ready := httpHealth(ctx, wh)
		if err := pick(ready, nil); err != nil {
			failed = append(failed, fmt.Errorf("request store %s: %w", hj.Name, err))
		}
		body.Ready = body.Ready && hj.Ready
		body.HTTP = append(body.HTTP, hj)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	if err := errors.Join(failed...); err != nil {
		body.Error = err.Error()
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(body)
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func lanes(ls []source.LaneStatus) []LaneJSON {
	out := make([]LaneJSON, 0, len(ls))
	for _, l := range ls {
		out = append(out, LaneJSON{Lane: l.Lane, Waiting: l.Waiting, LastFetch: timePtr(l.LastFetch), LastSettled: timePtr(l.LastSettled)})
	}
	return out
}
