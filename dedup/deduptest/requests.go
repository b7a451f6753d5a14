package deduptest

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/internal/poll"
)

// RequestConfig is what RunRequests asks of a fresh store.
type RequestConfig struct {
	// LockTimeout bounds the store's waits for a lock (Postgres'
	// lock_timeout, SQLite's busy timeout); 0 means the store's default.
	LockTimeout time.Duration
}

// RequestHarness is one dedup.RequestStore under test, with a business
// table the suite writes its effects to.
type RequestHarness[TTx any] struct {
	// Store is fresh, empty and migrated; it must be a dedup.Purger too.
	Store dedup.RequestStore[TTx]
	// Effect writes one business effect named id in tx: an INSERT into a
	// table without a unique constraint, so that a double effect shows.
	Effect func(ctx context.Context, tx TTx, id string) error
	// Effects counts the committed effects named id.
	Effects func(ctx context.Context, id string) (int, error)
}

// RequestFactory returns a RequestHarness on a fresh store for one test,
// cleaned up by t.Cleanup.
type RequestFactory[TTx any] func(t *testing.T, cfg RequestConfig) RequestHarness[TTx]

// RunRequests runs the conformance suite of dedup.RequestStore: a request's
// records (claims, replays, mismatches, a key taken meanwhile), leases and
// their fencing tokens, stuck keys, release and purge. The HTTP middleware's
// own suite (httpidemtest) runs on top of a store that passes it.
func RunRequests[TTx any](t *testing.T, newHarness RequestFactory[TTx]) {
	s := requestSuite[TTx]{newHarness: newHarness}
	t.Run("ClaimSaveReplay", s.claimSaveReplay)
	t.Run("ClaimRollbackForgets", s.claimRollbackForgets)
	t.Run("KeyTakenMeanwhile", s.keyTaken)
	t.Run("LeaseFencing", s.leaseFencing)
	t.Run("LeaseExpiryTakeoverAndStuck", s.leaseExpiry)
	t.Run("ConcurrentAcquireOneWinner", s.concurrentAcquire)
	t.Run("PurgeDeletesRecords", s.purge)
	t.Run("PurgedKeyTokensGrow", s.purgeTokensGrow)
}

type requestSuite[TTx any] struct{ newHarness RequestFactory[TTx] }

func (s requestSuite[TTx]) harness(t *testing.T, cfg RequestConfig) RequestHarness[TTx] {
	t.Helper()
	h := s.newHarness(t, cfg)
	if h.Store == nil || h.Effect == nil || h.Effects == nil {
		t.Fatal("deduptest: the factory's RequestHarness lacks Store, Effect or Effects")
	}
	return h
}

// requestPurger is a request store's Purge.
func requestPurger[TTx any](t *testing.T, h RequestHarness[TTx]) dedup.Purger {
	p, ok := h.Store.(dedup.Purger)
	if !ok {
		t.Fatal("deduptest: the request store is not a dedup.Purger")
	}
	return p
}

func wantEffects[TTx any](t *testing.T, h RequestHarness[TTx], id string, want int) {
	t.Helper()
	n, err := h.Effects(ctxFor(t), id)
	if err != nil {
		t.Fatalf("count effects of %s: %v", id, err)
	}
	if n != want {
		t.Fatalf("%d effects of %s, want %d", n, id, want)
	}
}

// eventually polls cond until it holds, or fails the test after a minute:
// a wait on a condition, never on a fixed time.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	poll.Until(t, time.Minute, what, cond)
}

// runRequest runs a request under c; with res it stores res (when the verdict
// is Run), without it the run fails and rolls back.
func runRequest[TTx any](ctx context.Context, st dedup.RequestStore[TTx], c dedup.Claim, res *dedup.StoredResponse) (dedup.RequestRecord, error) {
	rec, err := st.RunRequest(ctx, c, time.Hour, func(ctx context.Context, tx TTx) (dedup.StoredResponse, error) {
		if res == nil {
			return dedup.StoredResponse{}, errRollback
		}
		return *res, nil
	})
	if errors.Is(err, errRollback) {
		err = nil
	}
	return rec, err
}

func wantVerdict(t *testing.T, what string, rec dedup.RequestRecord, err error, want dedup.Verdict) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if rec.Verdict != want {
		t.Fatalf("%s: verdict %v, want %v (%+v)", what, rec.Verdict, want, rec)
	}
}

func (s requestSuite[TTx]) claimSaveReplay(t *testing.T) {
	h, ctx := s.harness(t, RequestConfig{}), ctxFor(t)
	st := h.Store
	c := Claim("POST /payments", "k1", `{"amount":1}`)
	res := dedup.StoredResponse{Status: 201, Header: []byte(`[["Content-Type","application/json"]]`), Body: []byte("{\"id\": 7}\n\x00\xff")}
	rec, err := runRequest(ctx, st, c, &res)
	wantVerdict(t, "new key", rec, err, dedup.VerdictRun)
	if rec.Token != 1 {
		t.Fatalf("new key: token %d, want 1", rec.Token)
	}
	rec, err = runRequest(ctx, st, c, nil)
	wantVerdict(t, "finished key", rec, err, dedup.VerdictReplay)
	if rec.State != dedup.StateFinished || rec.Response.Status != 201 || string(rec.Response.Body) != string(res.Body) || string(rec.Response.Header) != string(res.Header) {
		t.Fatalf("stored %+v, want %+v", rec.Response, res)
	}
	if rec.FirstAt.IsZero() || time.Since(rec.FirstAt) > time.Hour || time.Until(rec.FirstAt) > time.Hour {
		t.Fatalf("FirstAt %v: want when the key was first claimed", rec.FirstAt)
	}
	rec, err = runRequest(ctx, st, Claim("POST /payments", "k1", `{"amount":2}`), nil)
	wantVerdict(t, "another fingerprint", rec, err, dedup.VerdictMismatch)
	rec, err = runRequest(ctx, st, Claim("POST /payments#other", "k1", `{"amount":2}`), nil)
	wantVerdict(t, "another scope", rec, err, dedup.VerdictRun)
}

func (s requestSuite[TTx]) claimRollbackForgets(t *testing.T) {
	h, ctx := s.harness(t, RequestConfig{}), ctxFor(t)
	c := Claim("POST /payments", "k1", "p")
	rec, err := runRequest(ctx, h.Store, c, nil) // fails: rolled back
	wantVerdict(t, "first run", rec, err, dedup.VerdictRun)
	rec, err = runRequest(ctx, h.Store, c, nil)
	wantVerdict(t, "run after a failed run", rec, err, dedup.VerdictRun)
}

// keyTaken: a writer that keeps no lock (a consumer's claim of the same
// key, here by the request's own handler) takes the key while the request
// runs: the request's writes roll back, and the verdict is the key's.
func (s requestSuite[TTx]) keyTaken(t *testing.T) {
	h, ctx := s.harness(t, RequestConfig{}), ctxFor(t)
	st := h.Store
	c := Claim("POST /payments", "k1", "p")
	rec, err := st.RunRequest(ctx, c, time.Hour, func(ctx context.Context, tx TTx) (dedup.StoredResponse, error) {
		if err := h.Effect(ctx, tx, "k1"); err != nil {
			return dedup.StoredResponse{}, err
		}
		res := make([]dedup.Result, 1)
		return dedup.StoredResponse{Status: 201}, st.Claim(ctx, tx, []dedup.Claim{c}, res)
	})
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	if rec.Verdict == dedup.VerdictRun {
		t.Fatalf("verdict %v: a run whose key was taken must not report Run", rec.Verdict)
	}
	wantEffects(t, h, "k1", 0)
}

func (s requestSuite[TTx]) leaseFencing(t *testing.T) {
	h, ctx := s.harness(t, RequestConfig{}), ctxFor(t)
	st := h.Store
	c := Claim("POST /payouts", "p1", `{"amount":5}`)
	k := c.Key
	a, err := st.AcquireLease(ctx, c, time.Hour, time.Minute)
	wantVerdict(t, "first acquire", a, err, dedup.VerdictRun)
	if a.Token <= 0 || a.TakenOver() || a.LeaseLeft <= 0 || a.LeaseLeft > time.Minute {
		t.Fatalf("first acquire: %+v, want a token, not taken over, and a lease of a minute", a)
	}
	b, err := st.AcquireLease(ctx, c, time.Hour, time.Minute)
	wantVerdict(t, "acquire while the lease runs", b, err, dedup.VerdictBusy)
	if b.State != dedup.StateProcessing || b.LeaseLeft <= 0 || b.LeaseLeft > time.Minute {
		t.Fatalf("busy: %+v, want Processing with the lease's remaining time", b)
	}
	if m, err := st.AcquireLease(ctx, Claim("POST /payouts", "p1", "other"), time.Hour, time.Minute); err != nil || m.Verdict != dedup.VerdictMismatch {
		t.Fatalf("acquire with another fingerprint: %+v, %v; want a mismatch", m, err)
	}
	if err := st.ExtendLease(ctx, k, a.Token, time.Minute); err != nil {
		t.Fatalf("extend by the holder: %v", err)
	}
	if err := st.ExtendLease(ctx, k, a.Token+1, time.Minute); !errors.Is(err, dedup.ErrLeaseLost) {
		t.Fatalf("extend with a token never given: %v, want ErrLeaseLost", err)
	}
	// An operator releases the key with a token it did not see: refused.
	if ok, err := st.ReleaseRequest(ctx, k, a.Token+1); err != nil || ok {
		t.Fatalf("release with another token: %v, %v; want false", ok, err)
	}
	// An operator releases the key: the token grows, the holder is fenced.
	if ok, err := st.ReleaseRequest(ctx, k, a.Token); err != nil || !ok {
		t.Fatalf("release: %v, %v", ok, err)
	}
	for name, err := range map[string]error{
		"extend":  st.ExtendLease(ctx, k, a.Token, time.Minute),
		"finish":  st.FinishLease(ctx, k, a.Token, dedup.StoredResponse{Status: 200}),
		"end":     st.EndLease(ctx, k, a.Token),
		"unknown": st.FinishLease(ctx, dedup.Key{Scope: k.Scope, ID: "nope"}, a.Token, dedup.StoredResponse{Status: 200}),
	} {
		if !errors.Is(err, dedup.ErrLeaseLost) {
			t.Fatalf("%s with a released token: %v, want ErrLeaseLost", name, err)
		}
	}
	c2, err := st.AcquireLease(ctx, c, time.Hour, time.Minute)
	wantVerdict(t, "acquire after release", c2, err, dedup.VerdictRun)
	if c2.Token <= a.Token+1 || !c2.TakenOver() {
		t.Fatalf("takeover after release: token %d, want more than %d (the first's token, grown by the release and the takeover)", c2.Token, a.Token+1)
	}
	if err := st.FinishLease(ctx, k, c2.Token, dedup.StoredResponse{Status: 202, Body: []byte("ok")}); err != nil {
		t.Fatalf("finish by the new holder: %v", err)
	}
	if err := st.FinishLease(ctx, k, c2.Token, dedup.StoredResponse{Status: 500}); !errors.Is(err, dedup.ErrLeaseLost) {
		t.Fatalf("finish twice: %v, want ErrLeaseLost", err)
	}
	d, err := st.AcquireLease(ctx, c, time.Hour, time.Minute)
	wantVerdict(t, "acquire a finished key", d, err, dedup.VerdictReplay)
	if d.Response.Status != 202 || string(d.Response.Body) != "ok" {
		t.Fatalf("replay %+v, want the new holder's response", d.Response)
	}
	if ok, err := st.ReleaseRequest(ctx, k, 0); err != nil || ok {
		t.Fatalf("release of a finished key: %v, %v; want false", ok, err)
	}
	// A transactional claim of a leased key finds the same record.
	rec, err := runRequest(ctx, st, c, nil)
	wantVerdict(t, "transactional claim of a finished leased key", rec, err, dedup.VerdictReplay)
}

func (s requestSuite[TTx]) leaseExpiry(t *testing.T) {
	h, ctx := s.harness(t, RequestConfig{}), ctxFor(t)
	st := h.Store
	c := Claim("POST /payouts", "p1", "x")
	a, err := st.AcquireLease(ctx, c, time.Hour, time.Millisecond)
	wantVerdict(t, "first acquire", a, err, dedup.VerdictRun)
	other := Claim("POST /payouts", "live", "x")
	if live, err := st.AcquireLease(ctx, other, time.Hour, time.Hour); err != nil || live.Verdict != dedup.VerdictRun {
		t.Fatalf("acquire a second key: %+v, %v", live, err)
	}
	var stuck []dedup.RequestRecord
	eventually(t, "the lease to run out and the key to be listed as stuck", func() bool {
		var err error
		if stuck, err = st.StuckRequests(ctx, 10); err != nil {
			t.Fatal(err)
		}
		return len(stuck) > 0
	})
	if len(stuck) != 1 || stuck[0].Key != c.Key || stuck[0].Token != a.Token || stuck[0].State != dedup.StateProcessing ||
		stuck[0].LeaseLeft > 0 || stuck[0].FirstAt.IsZero() || stuck[0].LeaseExpires.IsZero() {
		t.Fatalf("stuck %+v, want only %v with token %d, expired", stuck, c.Key, a.Token)
	}
	if n, err := st.CountStuckRequests(ctx); err != nil || len(n) != 1 || n[c.Key.Scope] != 1 {
		t.Fatalf("count stuck: %v, %v; want 1 in %q", n, err, c.Key.Scope)
	}
	b, err := st.AcquireLease(ctx, c, time.Hour, time.Hour)
	wantVerdict(t, "acquire after the lease ran out", b, err, dedup.VerdictRun)
	if b.Token <= a.Token || !b.TakenOver() {
		t.Fatalf("takeover: token %d, taken over %v; want more than %d, taken over", b.Token, b.TakenOver(), a.Token)
	}
	if err := st.FinishLease(ctx, c.Key, a.Token, dedup.StoredResponse{Status: 200}); !errors.Is(err, dedup.ErrLeaseLost) {
		t.Fatalf("the first holder's late finish: %v, want ErrLeaseLost", err)
	}
	if stuck, err := st.StuckRequests(ctx, 10); err != nil || len(stuck) != 0 {
		t.Fatalf("stuck after the takeover: %+v, %v; want none", stuck, err)
	}
	if n, err := st.CountStuckRequests(ctx); err != nil || len(n) != 0 {
		t.Fatalf("count stuck after the takeover: %v, %v; want none", n, err)
	}
	if err := st.EndLease(ctx, c.Key, b.Token); err != nil {
		t.Fatalf("end lease: %v", err)
	}
	eventually(t, "the ended lease to be listed as stuck", func() bool {
		stuck, err := st.StuckRequests(ctx, 10)
		if err != nil {
			t.Fatal(err)
		}
		return len(stuck) == 1 && stuck[0].Token == b.Token
	})
	d, err := st.AcquireLease(ctx, c, time.Hour, time.Hour)
	wantVerdict(t, "acquire after EndLease", d, err, dedup.VerdictRun)
	if d.Token <= b.Token || !d.TakenOver() {
		t.Fatalf("takeover after EndLease: token %d, want more than %d, taken over", d.Token, b.Token)
	}
}

func (s requestSuite[TTx]) concurrentAcquire(t *testing.T) {
	h, ctx := s.harness(t, RequestConfig{}), ctxFor(t)
	c := Claim("POST /payouts", "p1", "x")
	var wg sync.WaitGroup
	var mu sync.Mutex
	verdicts := map[dedup.Verdict]int{}
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
	if verdicts[dedup.VerdictRun] != 1 || verdicts[dedup.VerdictRun]+verdicts[dedup.VerdictBusy]+len(errs) != 100 {
		t.Fatalf("verdicts %v, %d in flight: want one run, the rest busy", verdicts, len(errs))
	}
}

func (s requestSuite[TTx]) purge(t *testing.T) {
	h, ctx := s.harness(t, RequestConfig{}), ctxFor(t)
	st, p := h.Store, requestPurger(t, h)
	c := Claim("POST /payments", "short", "x")
	keep := Claim("POST /payments", "kept", "x")
	res := dedup.StoredResponse{Status: 201, Body: []byte("a")}
	for _, k := range []struct {
		c         dedup.Claim
		retention time.Duration
	}{{c, time.Millisecond}, {keep, 0}} {
		rec, err := st.RunRequest(ctx, k.c, k.retention, func(context.Context, TTx) (dedup.StoredResponse, error) { return res, nil })
		wantVerdict(t, "store "+k.c.Key.ID, rec, err, dedup.VerdictRun)
	}
	leased := Claim("POST /payouts", "short", "x")
	first, err := st.AcquireLease(ctx, leased, time.Millisecond, time.Millisecond)
	wantVerdict(t, "acquire", first, err, dedup.VerdictRun)
	// A lease that runs longer than its key's retention: the key is not
	// purged while it runs.
	held := Claim("POST /payouts", "held", "x")
	if rec, err := st.AcquireLease(ctx, held, time.Millisecond, time.Hour); err != nil || rec.Verdict != dedup.VerdictRun {
		t.Fatalf("acquire a held key: %+v, %v", rec, err)
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
	rec, err := runRequest(ctx, st, c, &res)
	wantVerdict(t, "a purged key", rec, err, dedup.VerdictRun)
	lrec, err := st.AcquireLease(ctx, leased, time.Hour, time.Hour)
	wantVerdict(t, "a purged leased key", lrec, err, dedup.VerdictRun)
	if lrec.Token <= first.Token || lrec.TakenOver() {
		t.Fatalf("a purged leased key: token %d, taken over %v; want more than %d, not taken over", lrec.Token, lrec.TakenOver(), first.Token)
	}
	if rec, err := st.AcquireLease(ctx, held, time.Hour, time.Hour); err != nil || rec.Verdict != dedup.VerdictBusy || rec.LeaseLeft <= 0 {
		t.Fatalf("the held key after purges: %+v, %v; want it busy, its lease running", rec, err)
	}
	if stuck, err := st.StuckRequests(ctx, 10); err != nil || len(stuck) != 0 {
		t.Fatalf("stuck after purge: %+v, %v", stuck, err)
	}
	rec, err = runRequest(ctx, st, keep, nil)
	wantVerdict(t, "a kept key", rec, err, dedup.VerdictReplay)
}

// purgeTokensGrow: a leased key is taken over, released, and purged once
// its retention and its lease have run out; the key claimed again gets a
// token larger than every one handed out before, so that a holder of an
// old one — alive still, as time does not fence — is refused by the store
// and by a system that checks tokens (DESIGN.md §8: tokens only grow).
func (s requestSuite[TTx]) purgeTokensGrow(t *testing.T) {
	h, ctx := s.harness(t, RequestConfig{}), ctxFor(t)
	st, p := h.Store, requestPurger(t, h)
	c := Claim("POST /payouts", "p1", "x")
	a, err := st.AcquireLease(ctx, c, time.Millisecond, time.Millisecond)
	wantVerdict(t, "first acquire", a, err, dedup.VerdictRun)
	if a.TakenOver() {
		t.Fatalf("first acquire: %+v, a new key is not taken over", a)
	}
	var b dedup.RequestRecord
	eventually(t, "the first lease to run out and be taken over", func() bool {
		b, err = st.AcquireLease(ctx, c, time.Millisecond, time.Millisecond)
		if err != nil {
			t.Fatalf("takeover: %v", err)
		}
		return b.Verdict == dedup.VerdictRun
	})
	if b.Token <= a.Token || !b.TakenOver() {
		t.Fatalf("takeover: %+v after token %d, want a larger token, taken over", b, a.Token)
	}
	if ok, err := st.ReleaseRequest(ctx, c.Key, 0); err != nil || !ok {
		t.Fatalf("release: %v, %v", ok, err)
	}
	eventually(t, "the released key to be purged", func() bool {
		n, err := p.Purge(ctx, 10)
		if err != nil {
			t.Fatal(err)
		}
		return n == 1
	})
	d, err := st.AcquireLease(ctx, c, time.Hour, time.Hour)
	wantVerdict(t, "acquire after the purge", d, err, dedup.VerdictRun)
	if d.Token <= b.Token {
		t.Fatalf("the purged key claimed again: token %d, want more than %d (tokens handed out before: %d, %d and a release)", d.Token, b.Token, a.Token, b.Token)
	}
	for _, old := range []int64{a.Token, b.Token} {
		if err := st.ExtendLease(ctx, c.Key, old, time.Hour); !errors.Is(err, dedup.ErrLeaseLost) {
			t.Fatalf("extend with token %d from before the purge: %v, want ErrLeaseLost", old, err)
		}
		if err := st.FinishLease(ctx, c.Key, old, dedup.StoredResponse{Status: 200}); !errors.Is(err, dedup.ErrLeaseLost) {
			t.Fatalf("finish with token %d from before the purge: %v, want ErrLeaseLost", old, err)
		}
	}
	if err := st.FinishLease(ctx, c.Key, d.Token, dedup.StoredResponse{Status: 201}); err != nil {
		t.Fatalf("finish by the new holder: %v", err)
	}
}
