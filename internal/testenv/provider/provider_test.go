package provider_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptrace"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/poll"
	"github.com/idemkit/idem/internal/testenv/provider"
)

// TestFaults: each fault does what it says, and the ledger tells.
func TestFaults(t *testing.T) {
	var fault atomic.Uint32
	p := provider.Start(t, provider.Config{Fault: func(provider.Request) provider.Fault { return provider.Fault(fault.Load()) }})
	c := &provider.Client{URL: p.URL(), HTTP: newHTTP(300 * time.Millisecond)}
	ctx := context.Background()
	for _, f := range []provider.Fault{provider.TimeoutAfterCommit, provider.DropAfterCommit, provider.Error500AfterCommit, provider.Error500, provider.DropBefore, provider.None} {
		fault.Store(uint32(f))
		no := "r-" + f.String()
		if _, err := c.Refund(ctx, provider.Request{OutRequestNo: no, Amount: 5}, 0); (err == nil) != (f == provider.None) {
			t.Fatalf("%v: Refund = %v", f, err)
		}
		if got, want := p.Executions()[no], map[bool]int{true: 1}[f.Committed()]; got != want {
			t.Fatalf("%v: %d executions, want %d", f, got, want)
		}
		fault.Store(uint32(provider.None))
		// A repeat with the key is answered from it, never executed again.
		res, err := c.Refund(ctx, provider.Request{OutRequestNo: no, Amount: 5}, 0)
		if err != nil || p.Executions()[no] != 1 {
			t.Fatalf("%v: repeat = %s, %v; %d executions", f, res, err, p.Executions()[no])
		}
	}
	var refusal *provider.Refusal
	if _, err := c.Refund(ctx, provider.Request{OutRequestNo: "neg", Amount: -1}, 0); !errors.As(err, &refusal) || p.Executions()["neg"] != 0 {
		t.Fatalf("a refused refund: %v", err)
	}
}

func newHTTP(timeout time.Duration) *http.Client { return &http.Client{Timeout: timeout} }

// TestKeysFencesFlightsAndLag: a forgotten key executes again; a stale
// token is refused; a second request while the first is held is refused
// as in flight; the query shows an execution only after ReadLag queries.
func TestKeysFencesFlightsAndLag(t *testing.T) {
	var mu sync.Mutex
	now := time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	var hold atomic.Bool
	hold.Store(true)
	p := provider.Start(t, provider.Config{KeyTTL: time.Minute, ReadLag: 2, ReadLagFor: time.Second, Now: clock, Fault: func(r provider.Request) provider.Fault {
		if r.OutRequestNo == "held" && hold.Load() {
			return provider.TimeoutAfterCommit
		}
		return provider.None
	}})
	c := &provider.Client{URL: p.URL()}
	ctx := context.Background()
	if _, err := c.Refund(ctx, provider.Request{OutRequestNo: "a", Amount: 1}, 7); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Refund(ctx, provider.Request{OutRequestNo: "a", Amount: 1}, 6); !errors.Is(err, provider.ErrStaleToken) {
		t.Fatalf("a stale token: %v", err)
	}
	mu.Lock()
	now = now.Add(time.Second) // ReadLagFor
	mu.Unlock()
	for i := range 3 {
		_, found, err := c.Query(ctx, "a")
		if err != nil || found != (i == 2) {
			t.Fatalf("query %d: found %v, %v; want found only at the third", i, found, err)
		}
	}
	if _, err := c.Refund(ctx, provider.Request{OutRequestNo: "b", Amount: 1}, 0); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, found, _ := c.Query(ctx, "b"); found {
			t.Fatalf("query %d shows b before ReadLagFor", i)
		}
	}
	mu.Lock()
	now = now.Add(time.Minute)
	mu.Unlock()
	for i := range 3 {
		if _, found, _ := c.Query(ctx, "b"); found != (i == 2) {
			t.Fatalf("query %d of b after ReadLagFor: found %v, want found only at the third", i, found)
		}
	}
	if _, err := c.Refund(ctx, provider.Request{OutRequestNo: "a", Amount: 1}, 8); err != nil || p.Executions()["a"] != 2 {
		t.Fatalf("after the TTL: %v, %d executions; want a second one", err, p.Executions()["a"])
	}
	done := make(chan error, 1)
	go func() { _, err := c.Refund(ctx, provider.Request{OutRequestNo: "held", Amount: 1}, 0); done <- err }()
	for p.Stats().Faults[provider.TimeoutAfterCommit] == 0 {
		time.Sleep(time.Millisecond) // wait for the held request to arrive
	}
	hold.Store(false)
	if _, err := c.Refund(ctx, provider.Request{OutRequestNo: "held", Amount: 1}, 0); err == nil || p.Stats().InFlight != 1 {
		t.Fatalf("a request while one is in flight: %v (stats %+v)", err, p.Stats())
	}
	p.Release()
	if err := <-done; err == nil {
		t.Fatal("the held request was answered")
	}
	if p.Executions()["held"] != 1 {
		t.Fatalf("held: %d executions", p.Executions()["held"])
	}
}

// TestRestart: requests in flight lose their answer, the ledger stays.
func TestRestart(t *testing.T) {
	p := provider.Start(t, provider.Config{})
	c := &provider.Client{URL: p.URL()}
	ctx := context.Background()
	if _, err := c.Refund(ctx, provider.Request{OutRequestNo: "x", Amount: 1}, 0); err != nil {
		t.Fatal(err)
	}
	p.Restart(t)
	c = &provider.Client{URL: p.URL(), HTTP: &http.Client{Transport: &http.Transport{}}} // the pooled connections are gone
	if _, err := c.Refund(ctx, provider.Request{OutRequestNo: "x", Amount: 1}, 0); err != nil || len(p.Ledger()) != 1 {
		t.Fatalf("after a restart: %v, ledger %v", err, p.Ledger())
	}
}

// TestLatency: a refund request and a query each take at least Latency; a
// client that gives up during it leaves nothing executed, and the provider
// counts it abandoned.
func TestLatency(t *testing.T) {
	const latency = 100 * time.Millisecond
	p := provider.Start(t, provider.Config{Latency: latency})
	c := &provider.Client{URL: p.URL()}
	ctx := context.Background()
	start := time.Now()
	if _, err := c.Refund(ctx, provider.Request{OutRequestNo: "slow", Amount: 1}, 0); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < latency {
		t.Errorf("a refund request took %v, less than Latency %v", took, latency)
	}
	start = time.Now()
	if _, found, err := c.Query(ctx, "slow"); err != nil || !found {
		t.Fatalf("query: found %v, %v", found, err)
	}
	if took := time.Since(start); took < latency {
		t.Errorf("a query took %v, less than Latency %v", took, latency)
	}

	// The client gives up as soon as its request is written.
	gone, cancel := context.WithCancel(ctx)
	defer cancel()
	gone = httptrace.WithClientTrace(gone, &httptrace.ClientTrace{WroteRequest: func(httptrace.WroteRequestInfo) { cancel() }})
	if _, err := c.Refund(gone, provider.Request{OutRequestNo: "gone", Amount: 1}, 0); err == nil {
		t.Fatal("a refund request whose client gave up was answered")
	}
	poll.Until(t, 10*time.Second, "the provider to count the cancelled request abandoned", func() bool { return p.Stats().Abandoned == 1 })
	if st := p.Stats(); st.Requests != 1 || st.Queries != 1 || p.Executions()["gone"] != 0 {
		t.Fatalf("after an abandoned request: %+v, executions %v; want it neither counted nor executed", st, p.Executions())
	}
}
