package httpidemtest

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/httpidem"
)

// bank is the suite's system outside the database: it pays once per call,
// and, as a system that honours fencing tokens does, refuses a call whose
// token is older than one it has seen for the key.
type bank struct {
	mu       sync.Mutex
	payments map[string][]int64 // key -> tokens that paid
	maxToken map[string]int64
}

var errFenced = errors.New("bank: stale fencing token")

func newBank() *bank { return &bank{payments: map[string][]int64{}, maxToken: map[string]int64{}} }

func (b *bank) pay(key string, token int64) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if token < b.maxToken[key] {
		return 0, errFenced
	}
	b.maxToken[key] = token
	b.payments[key] = append(b.payments[key], token)
	return len(b.payments[key]), nil
}

// paid reports whether key was paid, for a holder that took over.
func (b *bank) paid(key string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.payments[key]) > 0
}

// tokens returns the tokens that paid key.
func (b *bank) tokens(key string) []int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]int64(nil), b.payments[key]...)
}

func (b *bank) count(key string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.payments[key])
}

// payouts is the suite's leased endpoint. before and after, when set, run
// before and after the payment (after sees whether it paid); after's
// return value true means it answered itself.
type payouts struct {
	bank   *bank
	runs   atomic.Int32
	before func(w http.ResponseWriter, r *http.Request, l *httpidem.Lease, run int32) bool
	after  func(w http.ResponseWriter, r *http.Request, l *httpidem.Lease, run int32) bool
}

func (p *payouts) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	run := p.runs.Add(1)
	l := httpidem.LeaseFrom(r.Context())
	if _, ok := readAll(w, r); !ok {
		return
	}
	if p.before != nil && p.before(w, r, l, run) {
		return
	}
	key := l.Key().ID
	switch {
	case l.TakenOver() && p.bank.paid(key):
		// An earlier holder paid and left no outcome: answer with its payment.
	default:
		if _, err := p.bank.pay(key, l.Token()); err != nil {
			http.Error(w, err.Error(), http.StatusConflict)
			return
		}
	}
	if p.after != nil && p.after(w, r, l, run) {
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"key":%q,"token":%d,"run":%d}`, key, l.Token(), run)
}

func (s suite[TTx]) leaseRoute(t *testing.T, h Harness[TTx], route httpidem.Route, p *payouts) http.Handler {
	if route.Name == "" {
		route.Name = "/payouts"
	}
	return newMiddleware(t, h.Store, nil).Leased(route)(p)
}

func payout(key, body string) request {
	return request{method: http.MethodPost, target: "/payouts", key: key, body: body}
}

func (s suite[TTx]) leaseMatrix(t *testing.T) {
	h := s.harness(t, Config{})
	p := &payouts{bank: newBank()}
	g := newGate(t)
	p.before = func(w http.ResponseWriter, r *http.Request, l *httpidem.Lease, run int32) bool {
		if l.Token() <= 0 || l.TakenOver() || l.Key().ID != "p1" || !strings.HasPrefix(l.Key().Scope, "POST /payouts") {
			t.Errorf("lease %v token %d", l.Key(), l.Token())
		}
		if run == 1 {
			g.wait()
		}
		return false
	}
	srv := s.leaseRoute(t, h, httpidem.Route{}, p)
	done := g.serveHeld(srv, payout("p1", body100))
	busy := serve(srv, payout("p1", body100))
	wantProblem(t, "duplicate while the lease runs", busy, http.StatusConflict)
	g.release()
	first := <-done
	wantStatus(t, "new key", first, http.StatusCreated)
	again := serve(srv, payout("p1", body100))
	if again.Code != http.StatusCreated || !replayed(again) || again.Body.String() != first.Body.String() ||
		again.Header().Get("Content-Type") != first.Header().Get("Content-Type") {
		t.Fatalf("finished key: %d replayed %v %q, want %q replayed", again.Code, replayed(again), again.Body, first.Body)
	}
	wantProblem(t, "changed body", serve(srv, payout("p1", `{"amount":1}`)), http.StatusUnprocessableEntity)
	wantProblem(t, "missing key", serve(srv, payout("", body100)), http.StatusBadRequest)
	wantProblem(t, "bad key", serve(srv, payout("a\x01", body100)), http.StatusBadRequest)
	if n := p.bank.count("p1"); n != 1 || p.runs.Load() != 1 {
		t.Fatalf("%d payments in %d runs, want 1", n, p.runs.Load())
	}
	// A lease that is still running is no takeover: the stuck list is empty.
	if stuck, err := h.Store.StuckRequests(ctxFor(t), 10); err != nil || len(stuck) != 0 {
		t.Fatalf("stuck: %+v, %v", stuck, err)
	}
}

// leaseUncertain: a 5xx or a panic leaves the outcome uncertain: nothing
// is stored, the lease runs on (409), and after a release the next request
// takes over with a larger token and finds out what happened.
func (s suite[TTx]) leaseUncertain(t *testing.T) {
	for _, how := range []string{"502", "panic"} {
		t.Run(how, func(t *testing.T) {
			h, ctx := s.harness(t, Config{}), ctxFor(t)
			p := &payouts{bank: newBank()}
			p.after = func(w http.ResponseWriter, r *http.Request, l *httpidem.Lease, run int32) bool {
				if run > 1 {
					return false
				}
				if how == "panic" {
					panic("the bank's answer was lost")
				}
				http.Error(w, "bank timed out", http.StatusBadGateway)
				return true
			}
			srv := s.leaseRoute(t, h, httpidem.Route{Lease: time.Hour}, p)
			first := serve(srv, payout("p1", body100))
			if first.Code/100 != 5 || replayed(first) {
				t.Fatalf("uncertain: %d, replayed %v", first.Code, replayed(first))
			}
			busy := serve(srv, payout("p1", body100))
			wantProblem(t, "retry while the lease runs", busy, http.StatusConflict)
			if ra := busy.Header().Get("Retry-After"); ra == "1" || ra == "" {
				t.Fatalf("Retry-After %q, want the lease's remaining hour", ra)
			}
			k := httpidem.Scope(http.MethodPost, "/payouts", "")
			key := recordKey(k, "p1")
			if ok, err := h.Store.ReleaseRequest(ctx, key, 0); err != nil || !ok {
				t.Fatalf("release: %v, %v", ok, err)
			}
			taken := serve(srv, payout("p1", body100))
			wantStatus(t, "takeover after release", taken, http.StatusCreated)
			if first := p.bank.tokens("p1"); len(first) != 1 || tokenOf(t, taken) <= first[0] {
				t.Fatalf("takeover: %s, want a token larger than the first holder's %v", taken.Body, first)
			}
			if n := p.bank.count("p1"); n != 1 {
				t.Fatalf("%d payments, want 1: the taker found the first payment", n)
			}
			if w := serve(srv, payout("p1", body100)); !replayed(w) || w.Body.String() != taken.Body.String() {
				t.Fatalf("after the takeover: %d %q, want its response replayed", w.Code, w.Body)
			}
		})
	}
}

func (s suite[TTx]) leaseEnd(t *testing.T) {
	h := s.harness(t, Config{})
	p := &payouts{bank: newBank()}
	var first int64
	p.before = func(w http.ResponseWriter, r *http.Request, l *httpidem.Lease, run int32) bool {
		if run > 1 {
			return false
		}
		first = l.Token()
		// The bank refused before doing anything: give the key up.
		if err := l.End(r.Context()); err != nil {
			t.Errorf("end: %v", err)
		}
		http.Error(w, "bank unavailable, nothing done", http.StatusServiceUnavailable)
		return true
	}
	srv := s.leaseRoute(t, h, httpidem.Route{Lease: time.Hour}, p)
	wantStatus(t, "ended lease", serve(srv, payout("p1", body100)), http.StatusServiceUnavailable)
	w := serve(srv, payout("p1", body100))
	if w.Code != http.StatusCreated || replayed(w) || tokenOf(t, w) <= first {
		t.Fatalf("retry after End: %d %s, want a takeover at once (a token larger than %d)", w.Code, w.Body, first)
	}
}

// tokenOf reads the token of a payouts answer.
func tokenOf(t *testing.T, w *httptest.ResponseRecorder) int64 {
	t.Helper()
	var v struct{ Token int64 }
	if err := json.Unmarshal(w.Body.Bytes(), &v); err != nil {
		t.Fatalf("payouts answer %q: %v", w.Body, err)
	}
	return v.Token
}

// leaseZombie: a holder is released by an operator while it still runs;
// the next request takes over. The zombie's late effect is refused by the
// bank (its token is older) and its late response by the store.
func (s suite[TTx]) leaseZombie(t *testing.T) {
	for _, when := range []string{"paid before it stalled", "stalled before it paid"} {
		t.Run(when, func(t *testing.T) {
			h, ctx := s.harness(t, Config{}), ctxFor(t)
			p := &payouts{bank: newBank()}
			g := newGate(t)
			stall := func(l *httpidem.Lease, run int32) {
				if run == 1 {
					g.wait()
				}
			}
			if when == "paid before it stalled" {
				p.after = func(_ http.ResponseWriter, _ *http.Request, l *httpidem.Lease, run int32) bool {
					stall(l, run)
					return false
				}
			} else {
				p.before = func(_ http.ResponseWriter, _ *http.Request, l *httpidem.Lease, run int32) bool {
					stall(l, run)
					return false
				}
			}
			srv := s.leaseRoute(t, h, httpidem.Route{Lease: time.Hour}, p)
			done := g.serveHeld(srv, payout("p1", body100))
			if ok, err := h.Store.ReleaseRequest(ctx, recordKey(httpidem.Scope(http.MethodPost, "/payouts", ""), "p1"), 0); err != nil || !ok {
				t.Fatalf("release: %v, %v", ok, err)
			}
			// Another process takes over (this one still executes the key).
			other := s.leaseRoute(t, h, httpidem.Route{Lease: time.Hour}, p)
			taken := serve(other, payout("p1", body100))
			wantStatus(t, "takeover", taken, http.StatusCreated)
			g.release()
			zombie := <-done
			if zombie.Code != http.StatusConflict {
				t.Fatalf("the zombie's answer: %d %s, want 409 (its lease was taken over)", zombie.Code, zombie.Body)
			}
			if n := p.bank.count("p1"); n != 1 {
				t.Fatalf("%d payments, want 1", n)
			}
			if w := serve(srv, payout("p1", body100)); !replayed(w) || w.Body.String() != taken.Body.String() {
				t.Fatalf("stored: %q, want the taker's %q", w.Body, taken.Body)
			}
		})
	}
}

func (s suite[TTx]) leaseTooLarge(t *testing.T) {
	h := s.harness(t, Config{})
	p := &payouts{bank: newBank()}
	p.after = func(w http.ResponseWriter, _ *http.Request, _ *httpidem.Lease, _ int32) bool {
		w.WriteHeader(http.StatusOK)
		_, err := w.Write([]byte(strings.Repeat("r", 100)))
		if !errors.Is(err, httpidem.ErrResponseTooLarge) {
			t.Errorf("write: %v, want ErrResponseTooLarge", err)
		}
		return true
	}
	srv := s.leaseRoute(t, h, httpidem.Route{MaxResponseBytes: 16}, p)
	first := serve(srv, payout("p1", body100))
	wantProblem(t, "response too large", first, http.StatusInternalServerError)
	again := serve(srv, payout("p1", body100))
	if again.Code != http.StatusInternalServerError || !replayed(again) || again.Body.String() != first.Body.String() {
		t.Fatalf("again: %d replayed %v, want the stored problem replayed", again.Code, replayed(again))
	}
	if n := p.bank.count("p1"); n != 1 {
		t.Fatalf("%d payments, want 1: the effects happened once, and are not repeated", n)
	}
}

// leaseOptionalStreams: a keyless request of an Optional leased route, and
// a route without the middleware on the same mux, reach the connection
// directly: their chunks arrive while the handler still runs.
func (s suite[TTx]) leaseOptionalStreams(t *testing.T) {
	h := s.harness(t, Config{})
	m := newMiddleware(t, h.Store, nil)
	g := newGate(t)
	stream := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "first chunk")
		http.NewResponseController(w).Flush()
		<-g.open
		fmt.Fprintln(w, "last chunk")
	})
	mux := http.NewServeMux()
	mux.Handle("POST /events", m.Leased(httpidem.Route{Optional: true})(stream))
	mux.Handle("GET /stream", stream)
	mux.Handle("POST /payouts", m.Leased(httpidem.Route{})(&payouts{bank: newBank()}))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	client := srv.Client()
	defer client.CloseIdleConnections()
	for _, req := range []struct{ method, path string }{{"POST", "/events"}, {"GET", "/stream"}} {
		r, err := http.NewRequestWithContext(ctxFor(t), req.method, srv.URL+req.path, nil)
		if err != nil {
			t.Fatal(err)
		}
		res, err := client.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		line, err := bufio.NewReader(res.Body).ReadString('\n')
		if err != nil || line != "first chunk\n" {
			t.Fatalf("%s %s: %q, %v: want the first chunk before the handler ends", req.method, req.path, line, err)
		}
		res.Body.Close()
	}
	g.release()
	// The idempotent route on the same mux still works, with the
	// mux's pattern as its route.
	r, err := http.NewRequestWithContext(ctxFor(t), "POST", srv.URL+"/payouts", strings.NewReader(body100))
	if err != nil {
		t.Fatal(err)
	}
	r.Header.Set("Idempotency-Key", "p1")
	res, err := client.Do(r)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusCreated {
		t.Fatalf("the idempotent route: %d", res.StatusCode)
	}
	if stuck, err := h.Store.ReleaseRequest(ctxFor(t), recordKey("POST /payouts", "p1"), 0); err != nil || stuck {
		t.Fatalf("the key of the mux's pattern: released %v, %v; want it finished under scope %q", stuck, err, "POST /payouts")
	}
}

func (s suite[TTx]) leaseConcurrent(t *testing.T) {
	h := s.harness(t, Config{})
	p := &payouts{bank: newBank()}
	srv := s.leaseRoute(t, h, httpidem.Route{}, p)
	concurrent100(t, srv, payout("p1", body100))
	if n := p.bank.count("p1"); n != 1 {
		t.Fatalf("%d payments, want 1", n)
	}
}

// leaseCrash: the first holder dies half-way — it stops and never answers,
// as a killed process would — and 100 clients retry. They get 409 until its
// short lease runs out; one takes over, the rest get its response. When the
// dead holder comes back as a zombie, neither its payment nor its response
// is accepted.
func (s suite[TTx]) leaseCrash(t *testing.T) {
	for _, when := range []string{"after paying", "before paying"} {
		t.Run(when, func(t *testing.T) {
			h := s.harness(t, Config{})
			p := &payouts{bank: newBank()}
			g := newGate(t)
			crash := func(_ http.ResponseWriter, _ *http.Request, _ *httpidem.Lease, run int32) bool {
				if run == 1 {
					g.wait() // the process is gone, as far as anyone can tell
				}
				return false
			}
			if when == "after paying" {
				p.after = crash
			} else {
				p.before = crash
			}
			srv := s.leaseRoute(t, h, httpidem.Route{Lease: 200 * time.Millisecond}, p)
			var seen statuses
			var wg sync.WaitGroup
			var finished atomic.Int32
			for range 100 {
				wg.Go(func() {
					retryUntilDone(t, srv, payout("p1", body100), &seen)
					finished.Add(1)
				})
			}
			// Every client but the dead holder's gets an answer.
			eventually(t, "99 clients to finish", func() bool { return finished.Load() == 99 })
			g.release()
			wg.Wait()
			t.Log(&seen)
			if seen.first != 1 || seen.busy == 0 {
				t.Fatalf("%v: want 409s while the lease ran, then one takeover", &seen)
			}
			if n := p.bank.count("p1"); n != 1 {
				t.Fatalf("%d payments, want 1", n)
			}
			if stuck, err := h.Store.StuckRequests(context.Background(), 10); err != nil || len(stuck) != 0 {
				t.Fatalf("stuck after the takeover: %+v, %v", stuck, err)
			}
		})
	}
}

// leasePurge: a leased handler extends its lease past its key's retention
// and keeps running; purges meanwhile spare the key (its lease runs), a
// retry is answered 409 instead of running the handler a second time under
// a fresh row, and the holder's response is stored and replayed. Over HTTP,
// counting the handler's runs and the bank's payments.
func (s suite[TTx]) leasePurge(t *testing.T) {
	h, ctx := s.harness(t, Config{}), ctxFor(t)
	p := &payouts{bank: newBank()}
	g := newGate(t)
	var liveRuns atomic.Int32
	p.before = func(w http.ResponseWriter, r *http.Request, l *httpidem.Lease, run int32) bool {
		if l.Key().ID != "live" || liveRuns.Add(1) > 1 {
			return false
		}
		if err := l.Extend(r.Context(), time.Hour); err != nil {
			t.Errorf("extend: %v", err)
		}
		g.wait()
		return false
	}
	const retention = 200 * time.Millisecond
	srv := httptest.NewServer(s.leaseRoute(t, h, httpidem.Route{Retention: retention, Lease: 100 * time.Millisecond}, p))
	defer srv.Close()
	defer g.release() // before Close, which waits for the handler
	done := make(chan httpAnswer, 1)
	go func() { done <- sendHTTP(t, srv.URL+"/payouts", "live", body100) }()
	<-g.started
	// A key stored after the live one with the same retention: once a
	// purge has deleted it, the live key's own retention has run out too.
	if a := sendHTTP(t, srv.URL+"/payouts", "later", body100); a.status != http.StatusCreated {
		t.Fatalf("later key: %+v", a)
	}
	eventually(t, "the later key to expire and be purged", func() bool {
		if _, err := purger(t, h).Purge(ctx, 100); err != nil {
			t.Fatal(err)
		}
		return !sendHTTP(t, srv.URL+"/payouts", "later", body100).replayed
	})
	retry := sendHTTP(t, srv.URL+"/payouts", "live", body100)
	if retry.status != http.StatusConflict || retry.retryAfter == "" {
		t.Fatalf("retry while the extended lease runs: %+v, want 409 with Retry-After", retry)
	}
	if n := liveRuns.Load(); n != 1 {
		t.Fatalf("the handler ran %d times for the live key, want once", n)
	}
	g.release()
	first := <-done
	if first.status != http.StatusCreated || first.replayed {
		t.Fatalf("the holder's answer: %+v, want 201", first)
	}
	again := sendHTTP(t, srv.URL+"/payouts", "live", body100)
	if again.status != http.StatusCreated || !again.replayed || again.body != first.body {
		t.Fatalf("after the holder finished: %+v, want its response %q replayed", again, first.body)
	}
	if n := p.bank.count("live"); n != 1 || liveRuns.Load() != 1 {
		t.Fatalf("%d payments and %d runs for the live key, want 1 and 1", n, liveRuns.Load())
	}
}

// httpAnswer is a response over HTTP.
type httpAnswer struct {
	status     int
	replayed   bool
	retryAfter string
	body       string
}

// sendHTTP posts body with key to url through a real connection.
func sendHTTP(t *testing.T, url, key, body string) httpAnswer {
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Error(err)
		return httpAnswer{}
	}
	req.Header.Set("Idempotency-Key", key)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Errorf("POST %s: %v", url, err)
		return httpAnswer{}
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Errorf("POST %s: %v", url, err)
	}
	return httpAnswer{status: res.StatusCode, replayed: res.Header.Get("Idempotent-Replayed") == "true",
		retryAfter: res.Header.Get("Retry-After"), body: string(b)}
}
