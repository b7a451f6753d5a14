package httpidem

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/idemkit/idem/dedup"
)

// An Observer sees each request of the middleware's routes: when it starts,
// how it ended, and the lease writes the store refused. Telemetry is a view
// of these events: httpidem/otelhttpidem turns them into OpenTelemetry
// metrics and spans. Config.Observer; default none.
//
// Requests call concurrently. An Observer must be quick (the request waits
// for it). Embed NopObserver to implement only some methods.
type Observer interface {
	// RequestStart returns the request's context: the store's work and the
	// handler run under it, so that a tracer's span for the request is
	// their parent.
	RequestStart(ctx context.Context, r RequestInfo) context.Context
	// RequestEnd is called with RequestStart's context once the response
	// was written.
	RequestEnd(ctx context.Context, e RequestEvent)
	// LeaseFenced is called when the store refused a lease's write
	// (dedup.ErrLeaseLost): its holder's lease was taken over or released,
	// and the write (op: "finish", "extend" or "end") changed nothing.
	LeaseFenced(ctx context.Context, k dedup.Key, op string)
}

// RequestInfo is a request as it reaches a route.
type RequestInfo struct {
	Request *http.Request
	Method  string
	// Route is the route's name (Route.Name, or the http.ServeMux pattern
	// without its method and host); empty when it has none.
	Route  string
	Leased bool // a Leased route, not a Transactional one
}

// Outcome is how the middleware answered a request.
type Outcome uint8

const (
	OutcomeExecuted    Outcome = iota + 1 // the handler ran under the key; its response was sent
	OutcomeReplayed                       // a stored response was sent again
	OutcomeInFlight                       // 409: the key is executing elsewhere, or its lease runs
	OutcomeMismatch                       // 422: the key was used for another request
	OutcomeBadKey                         // 400: the key is missing or malformed
	OutcomeBadRequest                     // 400: the body could not be read or fingerprinted
	OutcomeTooLarge                       // 413: the body is over Route.MaxRequestBytes
	OutcomeUnavailable                    // 503: the store's database is away
	OutcomeStoreBusy                      // 503: the store is busy (a lock held past its timeout, a collision)
	OutcomeFailed                         // 500: the handler failed or panicked, or the store failed
	OutcomeLeaseLost                      // 409: the lease was taken over before the response was stored
	OutcomeUnkeyed                        // no key on an Optional route: the handler ran without idempotency
	OutcomeStale                          // the request's entity was at or past its version (Route.Entity): answered by Route.Stale, the handler did not run
)

var outcomeNames = [...]string{
	OutcomeExecuted:    "executed",
	OutcomeReplayed:    "replayed",
	OutcomeInFlight:    "in_flight",
	OutcomeMismatch:    "mismatch",
	OutcomeBadKey:      "bad_key",
	OutcomeBadRequest:  "bad_request",
	OutcomeTooLarge:    "too_large",
	OutcomeUnavailable: "unavailable",
	OutcomeStoreBusy:   "store_busy",
	OutcomeFailed:      "failed",
	OutcomeLeaseLost:   "lease_lost",
	OutcomeUnkeyed:     "unkeyed",
	OutcomeStale:       "stale",
}

func (o Outcome) String() string {
	if int(o) < len(outcomeNames) && outcomeNames[o] != "" {
		return outcomeNames[o]
	}
	return "unknown"
}

// Outcomes lists every Outcome, in their order.
func Outcomes() []Outcome {
	out := make([]Outcome, 0, len(outcomeNames)-1)
	for o := OutcomeExecuted; o <= OutcomeStale; o++ {
		out = append(out, o)
	}
	return out
}

// RequestEvent is a request's end.
type RequestEvent struct {
	RequestInfo
	Key     dedup.Key // zero without a valid key
	Outcome Outcome
	Status  int // the status sent
	// Err says why for OutcomeFailed, OutcomeUnavailable and
	// OutcomeStoreBusy, when there is an error to tell.
	Err        error
	Start, End time.Time
	// OutcomeReplayed: when the key was first requested (the store's
	// clock), and how long after that this retry came.
	FirstAt time.Time
	Age     time.Duration
	// Takeover: the request took the key's lease over from an earlier
	// holder that left no outcome (Leased routes).
	Takeover bool
}

// NopObserver observes nothing. Embed it to implement some of Observer's
// methods.
type NopObserver struct{}

func (NopObserver) RequestStart(ctx context.Context, _ RequestInfo) context.Context { return ctx }
func (NopObserver) RequestEnd(context.Context, RequestEvent)                        {}
func (NopObserver) LeaseFenced(context.Context, dedup.Key, string)                  {}

var _ Observer = NopObserver{}

// observation is a request's event as the middleware fills it in; the
// request's context carries it when there is an Observer.
type observation struct {
	ev RequestEvent
}

type observationKey struct{}

// observe starts observing a request: it returns the request to go on with
// (its context the Observer's) and the function that ends the observation.
// Without an Observer it returns r and a no-op.
func (m *Middleware[TTx]) observe(w http.ResponseWriter, r *http.Request, rt *route, leased bool) (http.ResponseWriter, *http.Request, func()) {
	if m.obs == nil {
		return w, r, func() {}
	}
	name, _ := rt.name(r)
	o := &observation{ev: RequestEvent{RequestInfo: RequestInfo{Request: r, Method: r.Method, Route: name, Leased: leased}, Start: time.Now()}}
	ctx := m.obs.RequestStart(r.Context(), o.ev.RequestInfo)
	r = r.WithContext(context.WithValue(ctx, observationKey{}, o))
	sw := &statusWriter{ResponseWriter: w}
	return sw, r, func() {
		o.ev.End = time.Now()
		o.ev.Status = sw.status
		if o.ev.Outcome == 0 {
			o.ev.Outcome = OutcomeExecuted
		}
		m.obs.RequestEnd(ctx, o.ev)
	}
}

// noted returns the request's observation, nil when it has none.
func noted(r *http.Request) *observation {
	o, _ := r.Context().Value(observationKey{}).(*observation)
	return o
}

// note records how the request was answered; a later note overrides it.
func note(r *http.Request, out Outcome, err error) {
	if o := noted(r); o != nil {
		o.ev.Outcome, o.ev.Err = out, err
	}
}

// noteKey records the request's key and the record the store gave for it.
func noteKey(r *http.Request, rec dedup.RequestRecord) {
	o := noted(r)
	if o == nil {
		return
	}
	if rec.Key != (dedup.Key{}) {
		o.ev.Key = rec.Key
	}
	o.ev.Takeover = o.ev.Takeover || rec.Takeover
	if rec.Verdict == dedup.VerdictReplay && !rec.FirstAt.IsZero() {
		o.ev.FirstAt = rec.FirstAt
		o.ev.Age = max(time.Since(rec.FirstAt), 0)
	}
}

// fencedStore reports the lease writes its store refuses.
type fencedStore struct {
	leaseStore
	obs Observer
}

func (f fencedStore) ExtendLease(ctx context.Context, k dedup.Key, token int64, lease time.Duration) error {
	return f.fenced(ctx, k, "extend", f.leaseStore.ExtendLease(ctx, k, token, lease))
}

func (f fencedStore) EndLease(ctx context.Context, k dedup.Key, token int64) error {
	return f.fenced(ctx, k, "end", f.leaseStore.EndLease(ctx, k, token))
}

func (f fencedStore) fenced(ctx context.Context, k dedup.Key, op string, err error) error {
	if errors.Is(err, dedup.ErrLeaseLost) {
		f.obs.LeaseFenced(ctx, k, op)
	}
	return err
}

// fenced reports a lease write the store refused.
func (m *Middleware[TTx]) fenced(ctx context.Context, k dedup.Key, op string) {
	if m.obs != nil {
		m.obs.LeaseFenced(ctx, k, op)
	}
}

// leaseStore is the store a Lease writes through.
func (m *Middleware[TTx]) leaseStore() leaseStore {
	if m.obs == nil {
		return m.store
	}
	return fencedStore{leaseStore: m.store, obs: m.obs}
}

// statusWriter remembers the status sent.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (s *statusWriter) WriteHeader(code int) {
	if s.status == 0 && code >= 200 {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusWriter) Write(p []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	return s.ResponseWriter.Write(p)
}

// Unwrap gives http.ResponseController the connection's writer.
func (s *statusWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// Flush flushes the connection's writer, when it can (a keyless request
// of an Optional leased route streams).
func (s *statusWriter) Flush() { _ = http.NewResponseController(s.ResponseWriter).Flush() }
