package httpidemtest

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/httpidem"
)

func claimOf(scope, id, payload string) dedup.Claim {
	return dedup.Claim{Key: dedup.Key{Scope: scope, ID: id}, Fingerprint: dedup.FingerprintOf([]byte(payload)), Source: "httpidemtest"}
}

var errRollback = errors.New("httpidemtest: roll back")

// claim runs a request under c; with res it stores res (when the verdict
// is Run), without it the run fails and rolls back.
func claim[TTx any](ctx context.Context, st httpidem.Store[TTx], c dedup.Claim, res *httpidem.Response) (httpidem.Record, error) {
	rec, err := st.RunRequest(ctx, c, time.Hour, func(ctx context.Context, tx TTx) (httpidem.Response, error) {
		if res == nil {
			return httpidem.Response{}, errRollback
		}
		return *res, nil
	})
	if errors.Is(err, errRollback) {
		err = nil
	}
	return rec, err
}

func wantVerdict(t *testing.T, what string, rec httpidem.Record, err error, want httpidem.Verdict) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if rec.Verdict != want {
		t.Fatalf("%s: verdict %v, want %v (%+v)", what, rec.Verdict, want, rec)
	}
}

func (s suite[TTx]) claimSaveReplay(t *testing.T) {
	h, ctx := s.harness(t, Config{}), ctxFor(t)
	st := h.Store
	c := claimOf("POST /payments", "k1", `{"amount":1}`)
	res := httpidem.Response{Status: 201, Header: []byte(`[["Content-Type","application/json"]]`), Body: []byte("{\"id\": 7}\n\x00\xff")}
	rec, err := claim(ctx, st, c, &res)
	wantVerdict(t, "new key", rec, err, httpidem.Run)
	if rec.Token != 1 {
		t.Fatalf("new key: token %d, want 1", rec.Token)
	}
	rec, err = claim(ctx, st, c, nil)
	wantVerdict(t, "finished key", rec, err, httpidem.Replay)
	if rec.State != httpidem.Finished || rec.Response.Status != 201 || string(rec.Response.Body) != string(res.Body) || string(rec.Response.Header) != string(res.Header) {
		t.Fatalf("stored %+v, want %+v", rec.Response, res)
	}
	if rec.FirstAt.IsZero() || time.Since(rec.FirstAt) > time.Hour || time.Until(rec.FirstAt) > time.Hour {
		t.Fatalf("FirstAt %v: want when the key was first claimed", rec.FirstAt)
	}
	rec, err = claim(ctx, st, claimOf("POST /payments", "k1", `{"amount":2}`), nil)
	wantVerdict(t, "another fingerprint", rec, err, httpidem.Mismatch)
	rec, err = claim(ctx, st, claimOf("POST /payments#other", "k1", `{"amount":2}`), nil)
	wantVerdict(t, "another scope", rec, err, httpidem.Run)
}

func (s suite[TTx]) claimRollbackForgets(t *testing.T) {
	h, ctx := s.harness(t, Config{}), ctxFor(t)
	c := claimOf("POST /payments", "k1", "p")
	rec, err := claim(ctx, h.Store, c, nil) // fails: rolled back
	wantVerdict(t, "first run", rec, err, httpidem.Run)
	rec, err = claim(ctx, h.Store, c, nil)
	wantVerdict(t, "run after a failed run", rec, err, httpidem.Run)
}

// keyTaken: a writer that keeps no lock (a consumer's claim of the same
// key, here by the request's own handler) takes the key while the request
// runs: the request's writes roll back, and the verdict is the key's.
func (s suite[TTx]) keyTaken(t *testing.T) {
	h, ctx := s.harness(t, Config{}), ctxFor(t)
	st := h.Store
	c := claimOf("POST /payments", "k1", "p")
	rec, err := st.RunRequest(ctx, c, time.Hour, func(ctx context.Context, tx TTx) (httpidem.Response, error) {
		if err := h.Effect(ctx, tx, "k1"); err != nil {
			return httpidem.Response{}, err
		}
		res := make([]dedup.Result, 1)
		return httpidem.Response{Status: 201}, st.Claim(ctx, tx, []dedup.Claim{c}, res)
	})
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	if rec.Verdict == httpidem.Run {
		t.Fatalf("verdict %v: a run whose key was taken must not report Run", rec.Verdict)
	}
	wantEffects(t, h, "k1", 0)
}

func (s suite[TTx]) leaseFencing(t *testing.T) {
	h, ctx := s.harness(t, Config{}), ctxFor(t)
	st := h.Store
	c := claimOf("POST /payouts", "p1", `{"amount":5}`)
	k := c.Key
	a, err := st.AcquireLease(ctx, c, time.Hour, time.Minute)
	wantVerdict(t, "first acquire", a, err, httpidem.Run)
	if a.Token != 1 || a.TakenOver() || a.LeaseLeft <= 0 || a.LeaseLeft > time.Minute {
		t.Fatalf("first acquire: %+v, want token 1 and a lease of a minute", a)
	}
	b, err := st.AcquireLease(ctx, c, time.Hour, time.Minute)
	wantVerdict(t, "acquire while the lease runs", b, err, httpidem.Busy)
	if b.State != httpidem.Processing || b.LeaseLeft <= 0 || b.LeaseLeft > time.Minute {
		t.Fatalf("busy: %+v, want Processing with the lease's remaining time", b)
	}
	if m, err := st.AcquireLease(ctx, claimOf("POST /payouts", "p1", "other"), time.Hour, time.Minute); err != nil || m.Verdict != httpidem.Mismatch {
		t.Fatalf("acquire with another fingerprint: %+v, %v; want a mismatch", m, err)
	}
	if err := st.ExtendLease(ctx, k, 1, time.Minute); err != nil {
		t.Fatalf("extend by the holder: %v", err)
	}
	if err := st.ExtendLease(ctx, k, 2, time.Minute); !errors.Is(err, httpidem.ErrLeaseLost) {
		t.Fatalf("extend with a token never given: %v, want ErrLeaseLost", err)
	}
	// An operator releases the key: the token grows, the holder is fenced.
	if ok, err := st.ReleaseRequest(ctx, k); err != nil || !ok {
		t.Fatalf("release: %v, %v", ok, err)
	}
	for name, err := range map[string]error{
		"extend":  st.ExtendLease(ctx, k, 1, time.Minute),
		"finish":  st.FinishLease(ctx, k, 1, httpidem.Response{Status: 200}),
		"end":     st.EndLease(ctx, k, 1),
		"unknown": st.FinishLease(ctx, dedup.Key{Scope: k.Scope, ID: "nope"}, 1, httpidem.Response{Status: 200}),
	} {
		if !errors.Is(err, httpidem.ErrLeaseLost) {
			t.Fatalf("%s with a released token: %v, want ErrLeaseLost", name, err)
		}
	}
	c2, err := st.AcquireLease(ctx, c, time.Hour, time.Minute)
	wantVerdict(t, "acquire after release", c2, err, httpidem.Run)
	if c2.Token <= 2 || !c2.TakenOver() {
		t.Fatalf("takeover after release: token %d, want more than 2 (released 2, taken over 3)", c2.Token)
	}
	if err := st.FinishLease(ctx, k, c2.Token, httpidem.Response{Status: 202, Body: []byte("ok")}); err != nil {
		t.Fatalf("finish by the new holder: %v", err)
	}
	if err := st.FinishLease(ctx, k, c2.Token, httpidem.Response{Status: 500}); !errors.Is(err, httpidem.ErrLeaseLost) {
		t.Fatalf("finish twice: %v, want ErrLeaseLost", err)
	}
	d, err := st.AcquireLease(ctx, c, time.Hour, time.Minute)
	wantVerdict(t, "acquire a finished key", d, err, httpidem.Replay)
	if d.Response.Status != 202 || string(d.Response.Body) != "ok" {
		t.Fatalf("replay %+v, want the new holder's response", d.Response)
	}
	if ok, err := st.ReleaseRequest(ctx, k); err != nil || ok {
		t.Fatalf("release of a finished key: %v, %v; want false", ok, err)
	}
	// A transactional claim of a leased key finds the same record.
	rec, err := claim(ctx, st, c, nil)
	wantVerdict(t, "transactional claim of a finished leased key", rec, err, httpidem.Replay)
}

func (s suite[TTx]) leaseExpiry(t *testing.T) {
	h, ctx := s.harness(t, Config{}), ctxFor(t)
	st := h.Store
	c := claimOf("POST /payouts", "p1", "x")
	a, err := st.AcquireLease(ctx, c, time.Hour, time.Millisecond)
	wantVerdict(t, "first acquire", a, err, httpidem.Run)
	other := claimOf("POST /payouts", "live", "x")
	if live, err := st.AcquireLease(ctx, other, time.Hour, time.Hour); err != nil || live.Verdict != httpidem.Run {
		t.Fatalf("acquire a second key: %+v, %v", live, err)
	}
	var stuck []httpidem.Record
	eventually(t, "the lease to run out and the key to be listed as stuck", func() bool {
		var err error
		if stuck, err = st.StuckRequests(ctx, 10); err != nil {
			t.Fatal(err)
		}
		return len(stuck) > 0
	})
	if len(stuck) != 1 || stuck[0].Key != c.Key || stuck[0].Token != 1 || stuck[0].State != httpidem.Processing ||
		stuck[0].LeaseLeft > 0 || stuck[0].FirstAt.IsZero() || stuck[0].LeaseExpires.IsZero() {
		t.Fatalf("stuck %+v, want only %v with token 1, expired", stuck, c.Key)
	}
	b, err := st.AcquireLease(ctx, c, time.Hour, time.Hour)
	wantVerdict(t, "acquire after the lease ran out", b, err, httpidem.Run)
	if b.Token != 2 || !b.TakenOver() {
		t.Fatalf("takeover: token %d, want 2", b.Token)
	}
	if err := st.FinishLease(ctx, c.Key, 1, httpidem.Response{Status: 200}); !errors.Is(err, httpidem.ErrLeaseLost) {
		t.Fatalf("the first holder's late finish: %v, want ErrLeaseLost", err)
	}
	if stuck, err := st.StuckRequests(ctx, 10); err != nil || len(stuck) != 0 {
		t.Fatalf("stuck after the takeover: %+v, %v; want none", stuck, err)
	}
	if err := st.EndLease(ctx, c.Key, 2); err != nil {
		t.Fatalf("end lease: %v", err)
	}
	eventually(t, "the ended lease to be listed as stuck", func() bool {
		stuck, err := st.StuckRequests(ctx, 10)
		if err != nil {
			t.Fatal(err)
		}
		return len(stuck) == 1 && stuck[0].Token == 2
	})
	d, err := st.AcquireLease(ctx, c, time.Hour, time.Hour)
	wantVerdict(t, "acquire after EndLease", d, err, httpidem.Run)
	if d.Token != 3 {
		t.Fatalf("takeover after EndLease: token %d, want 3", d.Token)
	}
}

func (s suite[TTx]) concurrentAcquire(t *testing.T) {
	h, ctx := s.harness(t, Config{}), ctxFor(t)
	c := claimOf("POST /payouts", "p1", "x")
	var wg sync.WaitGroup
	var mu sync.Mutex
	verdicts := map[httpidem.Verdict]int{}
	var errs []error
	for range 100 {
		wg.Go(func() {
			rec, err := h.Store.AcquireLease(ctx, c, time.Hour, time.Hour)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			verdicts[rec.Verdict]++
		})
	}
	wg.Wait()
	for _, err := range errs {
		if !errors.Is(err, dedup.ErrInFlight) && !errors.Is(err, dedup.ErrStoreBusy) {
			t.Fatalf("acquire: %v", err)
		}
	}
	if verdicts[httpidem.Run] != 1 || verdicts[httpidem.Run]+verdicts[httpidem.Busy]+len(errs) != 100 {
		t.Fatalf("verdicts %v, %d in flight: want one run, the rest busy", verdicts, len(errs))
	}
}

func (s suite[TTx]) purge(t *testing.T) {
	h, ctx := s.harness(t, Config{}), ctxFor(t)
	st, p := h.Store, purger(t, h)
	c := claimOf("POST /payments", "short", "x")
	keep := claimOf("POST /payments", "kept", "x")
	res := httpidem.Response{Status: 201, Body: []byte("a")}
	for _, k := range []struct {
		c         dedup.Claim
		retention time.Duration
	}{{c, time.Millisecond}, {keep, 0}} {
		rec, err := st.RunRequest(ctx, k.c, k.retention, func(context.Context, TTx) (httpidem.Response, error) { return res, nil })
		wantVerdict(t, "store "+k.c.Key.ID, rec, err, httpidem.Run)
	}
	leased := claimOf("POST /payouts", "short", "x")
	if rec, err := st.AcquireLease(ctx, leased, time.Millisecond, time.Millisecond); err != nil || rec.Verdict != httpidem.Run {
		t.Fatalf("acquire: %+v, %v", rec, err)
	}
	deleted := 0
	eventually(t, "both short-lived keys to be purged", func() bool {
		n, err := p.Purge(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		deleted += n
		return deleted == 2
	})
	if n, err := p.Purge(ctx, 10); err != nil || n != 0 {
		t.Fatalf("purge after everything expired was deleted: %d, %v", n, err)
	}
	// The purged keys are new again: their records went with them.
	rec, err := claim(ctx, st, c, &res)
	wantVerdict(t, "a purged key", rec, err, httpidem.Run)
	lrec, err := st.AcquireLease(ctx, leased, time.Hour, time.Hour)
	wantVerdict(t, "a purged leased key", lrec, err, httpidem.Run)
	if lrec.Token != 1 {
		t.Fatalf("a purged leased key: token %d, want 1", lrec.Token)
	}
	if stuck, err := st.StuckRequests(ctx, 10); err != nil || len(stuck) != 0 {
		t.Fatalf("stuck after purge: %+v, %v", stuck, err)
	}
	rec, err = claim(ctx, st, keep, nil)
	wantVerdict(t, "a kept key", rec, err, httpidem.Replay)
}
