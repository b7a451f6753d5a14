package httpidem_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/effect"
	"github.com/idemkit/idem/httpidem"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/internal/testenv/pgtest"
)

// TestLeasedRouteStepAfterATakeover (issue 39, seam 39.9): a leased payout
// route calls the provider through the effect journal with its lease's
// key. The first request's holder hangs mid-call after the provider
// executed (a process that died): its HTTP lease and its step's lease run
// out. The client's retry takes the key over; its step must be the same
// one (same provider key), be read back first, and not call again. The
// hung holder's late outcome is refused by the journal. Real Postgres.
func TestLeasedRouteStepAfterATakeover(t *testing.T) {
	pool := testenv.Pool(t)
	store := pgtest.Store(t, pool, testenv.Schema(t, pool))
	m, err := httpidem.New(httpidem.Config[pgx.Tx]{Store: store})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	calls, reads := map[string]int{}, 0
	executed := map[string]bool{}
	hang, hung := make(chan struct{}), make(chan struct{})
	var takenOver []bool
	var leased dedup.Key
	step := effect.Step{Name: "payout", KeyTTL: time.Hour, Lease: 300 * time.Millisecond,
		Call: func(ctx context.Context, c effect.Call) ([]byte, error) {
			mu.Lock()
			calls[c.ProviderKey]++
			executed[c.ProviderKey] = true
			first := calls[c.ProviderKey] == 1
			mu.Unlock()
			if first {
				close(hung)
				<-hang // the holder is gone; its answer comes back far too late
				return []byte("late"), nil
			}
			return []byte("paid"), nil
		},
		ReadBack: func(_ context.Context, c effect.Call) (effect.ReadBack, error) {
			mu.Lock()
			defer mu.Unlock()
			reads++
			if executed[c.ProviderKey] {
				return effect.ReadBack{Status: effect.Executed, Result: []byte("paid")}, nil
			}
			return effect.ReadBack{Status: effect.NotFound}, nil
		}}
	h := m.Leased(httpidem.Route{Lease: 300 * time.Millisecond})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		l := httpidem.LeaseFrom(r.Context())
		mu.Lock()
		takenOver = append(takenOver, l.TakenOver())
		leased = l.Key()
		mu.Unlock()
		res, err := effect.DoKey(r.Context(), store, l.Key(), l.Fingerprint(), step)
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(res)
	}))
	mux := http.NewServeMux()
	mux.Handle("POST /payouts", h)
	send := func() *httptest.ResponseRecorder {
		r := httptest.NewRequest("POST", "/payouts", strings.NewReader(`{"amount":100}`))
		r.Header.Set("Idempotency-Key", "payout-7")
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, r)
		return w
	}

	first := make(chan *httptest.ResponseRecorder, 1)
	go func() { first <- send() }()
	<-hung
	var w *httptest.ResponseRecorder
	testenv.WaitUntil(t, 30*time.Second, "the retry taken over and answered", func() bool {
		w = send()
		return w.Code == http.StatusCreated
	})
	close(hang)
	late := <-first
	if w.Body.String() != "paid" {
		t.Fatalf("the retry answered %d %q, want 201 paid", w.Code, w.Body)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(calls) != 1 || reads < 1 {
		t.Fatalf("provider calls %v, %d reads; want one call and a read-back", calls, reads)
	}
	for k, n := range calls {
		if n != 1 {
			t.Fatalf("provider key %s called %d times, want once", k, n)
		}
	}
	// The step carries the request's identity: its key and the fingerprint
	// the key was claimed with, not an empty one.
	rec, ok, err := store.Step(testenv.Context(t, 10*time.Second), dedup.StepRef{Key: leased, Step: "payout"})
	if err != nil || !ok {
		t.Fatalf("the payout's step in the journal: %v (found %v)", err, ok)
	}
	if rec.Fingerprint == (dedup.Fingerprint{}) {
		t.Fatalf("the payout's step was journaled without the request's fingerprint: %+v", rec)
	}
	if !takenOver[len(takenOver)-1] {
		t.Fatalf("the answered retry's lease was not a takeover: %v", takenOver)
	}
	if !strings.Contains(late.Body.String(), "dropped") {
		t.Fatalf("the hung holder answered %d %q; want its outcome dropped (lease lost)", late.Code, late.Body)
	}
}
