// Package httpidemtest is the conformance suite of the httpidem middleware
// on a store: the HTTP behaviour matrix of both modes, including 100
// concurrent requests with one key, with and without a failure half-way
// through the handler. The store's own contract (dedup.RequestStore:
// request records, leases, fencing, stuck keys, release, purge) is
// deduptest.RunRequests; every store runs both:
//
//	func TestHTTPConformance(t *testing.T) {
//		httpidemtest.Run(t, func(t *testing.T, cfg httpidemtest.Config) httpidemtest.Harness[pgx.Tx] {
//			return newHarness(t, cfg) // a fresh, empty, migrated store
//		})
//	}
package httpidemtest

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/deduptest"
	"github.com/idemkit/idem/httpidem"
	"github.com/idemkit/idem/internal/poll"
)

// Config is what the suite asks of a fresh store.
type Config struct {
	// LockTimeout bounds the store's waits for a lock (Postgres'
	// lock_timeout, SQLite's busy timeout); 0 means the store's default.
	LockTimeout time.Duration
}

// Harness is one store under test, with a business table the suite writes
// its effects to.
type Harness[TTx any] struct {
	// RequestHarness is the store (fresh, empty, migrated, a dedup.Purger
	// too) and its business table, as deduptest.RunRequests takes them.
	deduptest.RequestHarness[TTx]
	// DropConn, when set, breaks tx's connection to the database from the
	// outside, as a network failure or a killed backend would
	// (pg_terminate_backend). A store without connections leaves it nil;
	// the suite then injects its mid-handler failures as panics only.
	DropConn func(ctx context.Context, tx TTx) error
	// OneWriter says the store's database has one write lock for all keys
	// (SQLite): a request that waits for it past the lock timeout cannot
	// be told the key is in flight and is answered 503, where a store that
	// locks keys one by one answers a duplicate on another instance 409.
	OneWriter bool
}

// Factory returns a Harness on a fresh store for one test, cleaned up by
// t.Cleanup.
type Factory[TTx any] func(t *testing.T, cfg Config) Harness[TTx]

// Run runs the suite.
func Run[TTx any](t *testing.T, newHarness Factory[TTx]) {
	s := suite[TTx]{newHarness: newHarness}
	t.Run("Transactional", func(t *testing.T) {
		t.Run("Matrix", s.txMatrix)
		t.Run("BadKeys", s.badKeys)
		t.Run("KeyFrom", s.txKeyFrom)
		t.Run("BodyLimit", s.bodyLimit)
		t.Run("StoredErrorsReplayed", s.txStoredErrors)
		t.Run("HandlerErrorStoresNothing", s.txHandlerError)
		t.Run("TenantsShareKeys", s.tenants)
		t.Run("FingerprintFields", s.fingerprintFields)
		t.Run("ConcurrentWhileExecuting", s.txBusy)
		t.Run("BusyAcrossInstances", s.txBusyAcrossInstances)
		t.Run("ResponseTooLarge", s.txTooLarge)
		t.Run("Optional", s.txOptional)
		t.Run("Concurrent100", s.txConcurrent)
		t.Run("Concurrent100FailureHalfway", s.txConcurrentFailure)
		t.Run("PathValuesInIdentity", s.txPathValues)
		t.Run("DistinctKeysNeverBusy", s.txDistinctKeys)
	})
	t.Run("Leased", func(t *testing.T) {
		t.Run("Matrix", s.leaseMatrix)
		t.Run("KeyFrom", s.leaseKeyFrom)
		t.Run("UncertainKeepsLease", s.leaseUncertain)
		t.Run("EndLease", s.leaseEnd)
		t.Run("ZombieFenced", s.leaseZombie)
		t.Run("ResponseTooLarge", s.leaseTooLarge)
		t.Run("OptionalStreams", s.leaseOptionalStreams)
		t.Run("Concurrent100", s.leaseConcurrent)
		t.Run("Concurrent100CrashHalfway", s.leaseCrash)
		t.Run("PurgeSparesExtendedLease", s.leasePurge)
	})
}

type suite[TTx any] struct{ newHarness Factory[TTx] }

func (s suite[TTx]) harness(t *testing.T, cfg Config) Harness[TTx] {
	t.Helper()
	h := s.newHarness(t, cfg)
	if h.Store == nil || h.Effect == nil || h.Effects == nil {
		t.Fatal("httpidemtest: the factory's Harness lacks Store, Effect or Effects")
	}
	return h
}

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// quiet discards the middleware's logs: the suite provokes failures.
var quiet = slog.New(slog.DiscardHandler)

func newMiddleware[TTx any](t *testing.T, st dedup.RequestStore[TTx], tenant func(*http.Request) (string, error)) *httpidem.Middleware[TTx] {
	t.Helper()
	m, err := httpidem.New(httpidem.Config[TTx]{Store: st, Tenant: tenant, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// request is one HTTP request of a test.
type request struct {
	method, target, key, body string
	header                    map[string]string
}

func post(key, body string) request {
	return request{method: http.MethodPost, target: "/payments", key: key, body: body}
}

// serve sends req to h and returns the recorded response.
func serve(h http.Handler, req request) *httptest.ResponseRecorder {
	w := recorder()
	h.ServeHTTP(w, httptestRequest(req))
	return w
}

func httptestRequest(req request) *http.Request {
	r := httptest.NewRequest(req.method, req.target, strings.NewReader(req.body))
	if req.key != "" {
		r.Header["Idempotency-Key"] = []string{req.key}
	}
	for k, v := range req.header {
		r.Header.Set(k, v)
	}
	return r
}

func recorder() *httptest.ResponseRecorder { return httptest.NewRecorder() }

// replayed reports whether w is a replay.
func replayed(w *httptest.ResponseRecorder) bool {
	return w.Header().Get("Idempotent-Replayed") == "true"
}

func wantStatus(t *testing.T, what string, w *httptest.ResponseRecorder, status int) {
	t.Helper()
	if w.Code != status {
		t.Fatalf("%s: status %d, want %d; body %q", what, w.Code, status, w.Body.String())
	}
}

// wantProblem checks a problem+json answer.
func wantProblem(t *testing.T, what string, w *httptest.ResponseRecorder, status int) {
	t.Helper()
	wantStatus(t, what, w, status)
	if ct := w.Header().Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("%s: Content-Type %q, want application/problem+json", what, ct)
	}
	if replayed(w) {
		t.Fatalf("%s: a problem marked as a replay", what)
	}
	if status == http.StatusConflict && w.Header().Get("Retry-After") == "" {
		t.Fatalf("%s: 409 without Retry-After", what)
	}
}

func effects[TTx any](t *testing.T, h Harness[TTx], id string) int {
	t.Helper()
	n, err := h.Effects(ctxFor(t), id)
	if err != nil {
		t.Fatalf("count effects of %s: %v", id, err)
	}
	return n
}

func wantEffects[TTx any](t *testing.T, h Harness[TTx], id string, want int) {
	t.Helper()
	if n := effects(t, h, id); n != want {
		t.Fatalf("%d effects of %s, want %d", n, id, want)
	}
}

// eventually polls cond until it holds, or fails the test after a minute:
// a wait on a condition, never on a fixed time.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	poll.Until(t, time.Minute, what, cond)
}

// gate lets a test hold a handler half-way: the handler calls wait, the
// test waits for started and then opens it.
type gate struct {
	started chan struct{}
	open    chan struct{}
	once    sync.Once
}

func newGate(t *testing.T) *gate {
	g := &gate{started: make(chan struct{}, 100), open: make(chan struct{})}
	t.Cleanup(g.release) // never leave a handler blocked
	return g
}

func (g *gate) wait() {
	g.started <- struct{}{}
	<-g.open
}

func (g *gate) release() { g.once.Do(func() { close(g.open) }) }

// serveHeld serves req on srv in the background and returns once its
// handler waits at g; the answer comes on the channel after g.release.
func (g *gate) serveHeld(srv http.Handler, req request) <-chan *httptest.ResponseRecorder {
	done := make(chan *httptest.ResponseRecorder, 1)
	go func() { done <- serve(srv, req) }()
	<-g.started
	return done
}

// concurrent100 serves req 100 times at once and fails the test unless
// one ran and each of the others was answered 409 or with its replay.
func concurrent100(t *testing.T, srv http.Handler, req request) {
	t.Helper()
	var seen statuses
	var wg sync.WaitGroup
	for range 100 {
		wg.Go(func() { seen.add(serve(srv, req)) })
	}
	wg.Wait()
	t.Log(&seen)
	if seen.first != 1 || seen.first+seen.replays+seen.busy != 100 {
		t.Fatalf("100 concurrent requests: %v; want one first run, the rest 409 or a replay", &seen)
	}
}

// statuses counts the answers to concurrent requests.
type statuses struct {
	mu      sync.Mutex
	first   int            // answers that are not replays, 2xx
	replays int            // replays of a 2xx
	busy    int            // 409
	other   map[string]int // anything else, by status and title
}

func (c *statuses) add(w *httptest.ResponseRecorder) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case w.Code/100 == 2 && replayed(w):
		c.replays++
	case w.Code/100 == 2:
		c.first++
	case w.Code == http.StatusConflict:
		c.busy++
	default:
		if c.other == nil {
			c.other = map[string]int{}
		}
		c.other[fmt.Sprintf("%d %s", w.Code, firstLine(w.Body.String()))]++
	}
}

func (c *statuses) String() string {
	return fmt.Sprintf("first %d, replays %d, 409 %d, other %v", c.first, c.replays, c.busy, c.other)
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	if len(s) > 120 {
		s = s[:120]
	}
	return s
}

// readAll reads a handler's request body or fails the request.
func readAll(w http.ResponseWriter, r *http.Request) (string, bool) {
	b, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return "", false
	}
	return string(b), true
}

// purger is a store's Purge.
func purger[TTx any](t *testing.T, h Harness[TTx]) dedup.Purger {
	p, ok := h.Store.(dedup.Purger)
	if !ok {
		t.Fatal("httpidemtest: the store is not a dedup.Purger")
	}
	return p
}

// recordKey is the key of id under scope.
func recordKey(scope, id string) dedup.Key { return dedup.Key{Scope: scope, ID: id} }
