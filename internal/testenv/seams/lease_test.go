package seams_test

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/dedup/pgstore"
	"github.com/idemkit/idem/httpidem"
	"github.com/idemkit/idem/internal/testenv"
)

// The lease mode: an httpidem Leased route on pgstore's request store, a
// handler that may extend its lease and runs until the test lets it
// finish, clients that retry, leases that run out and are taken over, and
// purges while handlers run. Its model is the runs: which handler runs of
// a key were active at once, with which fencing tokens, and which of them
// stored their response.

const (
	leaseRoute     = "/pay"
	leaseRetention = 300 * time.Millisecond // short: a purge soon finds the row expired
	leaseLength    = 200 * time.Millisecond
	leaseExtended  = 30 * time.Second // what a long handler extends its lease to
)

var leaseKeys = []string{"K1", "K2"}

// A leaseOp is one step of the lease mode.
type leaseOp interface {
	String() string
	apply(ctx context.Context, lr *leaseRunner)
}

// opRequest: a client sends (or retries) a request with key; if its
// handler runs, it extends its lease first when extend is set.
type opRequest struct {
	key    string
	extend bool
}

func (o opRequest) String() string {
	if o.extend {
		return "request " + o.key + ", its handler extends its lease"
	}
	return "request " + o.key
}
func (o opRequest) apply(ctx context.Context, lr *leaseRunner) { lr.request(o.key, o.extend) }

// opFinish lets the oldest running handler of key answer: 200 (stored) or,
// with crash, 500 (the outcome uncertain: nothing stored, the lease runs on).
type opFinish struct {
	key   string
	crash bool
}

func (o opFinish) String() string {
	if o.crash {
		return "the oldest handler of " + o.key + " answers 500"
	}
	return "the oldest handler of " + o.key + " answers 200"
}
func (o opFinish) apply(ctx context.Context, lr *leaseRunner) { lr.finish(o.key, o.crash) }

// opExpire waits until key's lease has run out, when no handler of it
// extended its lease.
type opExpire struct{ key string }

func (o opExpire) String() string                             { return "wait until the lease of " + o.key + " runs out" }
func (o opExpire) apply(ctx context.Context, lr *leaseRunner) { lr.expire(ctx, o.key) }

// opPurge waits until key's row is past its retention (if it has one) and
// purges the store.
type opPurge struct{ key string }

func (o opPurge) String() string                             { return "purge once the row of " + o.key + " is past its retention" }
func (o opPurge) apply(ctx context.Context, lr *leaseRunner) { lr.purge(ctx, o.key) }

func generateLease(seed uint64, steps int) []leaseOp {
	rng := rand.New(rand.NewPCG(seed, seed^0x1ea5e))
	key := func() string { return leaseKeys[rng.IntN(len(leaseKeys))] }
	var ops []leaseOp
	for len(ops) < steps {
		switch x := rng.IntN(100); {
		case x < 35:
			ops = append(ops, opRequest{key: key(), extend: rng.IntN(5) < 3})
		case x < 60:
			ops = append(ops, opFinish{key: key(), crash: rng.IntN(5) == 0})
		case x < 78:
			ops = append(ops, opExpire{key: key()})
		default:
			ops = append(ops, opPurge{key: key()})
		}
	}
	return ops
}

// leaseRun is one run of the handler.
type leaseRun struct {
	req        int
	key        string
	token      int64
	extendedAt time.Time // zero: not extended
	overlaps   []*leaseRun
	gate       chan struct{}
	status     int  // what the handler answers, set before gate opens
	ended      bool // its response arrived
	stored     bool // its response was stored (the client got it, not 409)
}

// leaseReq is one client request.
type leaseReq struct {
	id      int
	key     string
	extend  bool
	entered chan struct{} // closed when its handler runs
	done    chan struct{} // closed when its response arrived
	status  int
	lost    bool // 409 because its lease was taken over
}

type leaseRunner struct {
	t    testing.TB
	rep  *reporter
	pool *pgxpool.Pool
	pg   *pgstore.Store
	srv  *httptest.Server
	cl   *http.Client

	mu   sync.Mutex
	runs []*leaseRun
	reqs map[int]*leaseReq
	n    int
	byID map[int]*leaseRun
}

func newLeaseRunner(t testing.TB, rep *reporter) *leaseRunner {
	pool := pool(t)
	st, err := pgstore.New(pool, pgstore.Config{Schema: testenv.Schema(t, pool)})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	lr := &leaseRunner{t: t, rep: rep, pool: pool, pg: st, reqs: map[int]*leaseReq{}, byID: map[int]*leaseRun{}}
	mw, err := httpidem.New(httpidem.Config[pgx.Tx]{Store: st, Logger: testenv.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST "+leaseRoute, mw.Leased(httpidem.Route{Retention: leaseRetention, Lease: leaseLength})(http.HandlerFunc(lr.handle)))
	lr.srv = httptest.NewServer(mux)
	lr.cl = &http.Client{Timeout: time.Minute}
	return lr
}

// handle is the leased handler: it records its run, extends its lease when
// asked to, and answers when the test lets it.
func (lr *leaseRunner) handle(w http.ResponseWriter, r *http.Request) {
	l := httpidem.LeaseFrom(r.Context())
	id, _ := strconv.Atoi(r.Header.Get("X-Req"))
	lr.mu.Lock()
	req := lr.reqs[id]
	run := &leaseRun{req: id, key: req.key, token: l.Token(), gate: make(chan struct{}), status: http.StatusOK}
	lr.started(run)
	lr.mu.Unlock()
	if req.extend {
		if err := l.Extend(r.Context(), leaseExtended); err == nil {
			lr.mu.Lock()
			run.extendedAt = time.Now()
			lr.mu.Unlock()
		}
	}
	close(req.entered)
	<-run.gate
	w.WriteHeader(run.status)
	fmt.Fprintf(w, "run %d token %d", id, run.token)
}

// started checks a new run against the runs of its key still active.
func (lr *leaseRunner) started(run *leaseRun) {
	for _, o := range lr.runs {
		if o.key != run.key || o.ended {
			continue
		}
		run.overlaps = append(run.overlaps, o)
		if o.token == run.token {
			lr.rep.violation(checkLeaseToken, run.key, "key %s: a second handler run (request %d) with fencing token %d while run of request %d with the same token is active",
				run.key, run.req, run.token, o.req)
		}
		if !o.extendedAt.IsZero() && time.Since(o.extendedAt) < leaseExtended-5*time.Second {
			lr.rep.violation(checkLeaseLive, run.key, "key %s: handler run of request %d (token %d) started while request %d (token %d) holds a lease it extended %v ago to %v",
				run.key, run.req, run.token, o.req, o.token, time.Since(o.extendedAt).Round(time.Millisecond), leaseExtended)
		}
	}
	lr.runs = append(lr.runs, run)
	lr.byID[run.req] = run
}

// request sends a request with key and waits until its handler runs or
// its response arrives.
func (lr *leaseRunner) request(key string, extend bool) {
	lr.mu.Lock()
	lr.n++
	req := &leaseReq{id: lr.n, key: key, extend: extend, entered: make(chan struct{}), done: make(chan struct{})}
	lr.reqs[req.id] = req
	lr.mu.Unlock()
	go func() {
		defer close(req.done)
		hr, err := http.NewRequest(http.MethodPost, lr.srv.URL+leaseRoute, strings.NewReader(`{"k":"`+key+`"}`))
		if err != nil {
			panic(err)
		}
		hr.Header.Set("Idempotency-Key", key)
		hr.Header.Set("X-Req", strconv.Itoa(req.id))
		resp, err := lr.cl.Do(hr)
		if err != nil {
			lr.t.Errorf("request %d: %v", req.id, err)
			return
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		lr.mu.Lock()
		defer lr.mu.Unlock()
		req.status = resp.StatusCode
		req.lost = resp.StatusCode == http.StatusConflict && strings.Contains(string(body), "took it over")
		if run := lr.byID[req.id]; run != nil {
			run.ended = true
			run.stored = resp.StatusCode < 500 && !req.lost
			if run.stored {
				lr.storedCheck(run)
			}
		}
	}()
	select {
	case <-req.entered:
	case <-req.done:
	}
}

// storedCheck: of runs that overlapped, at most one stores its response.
func (lr *leaseRunner) storedCheck(run *leaseRun) {
	for _, o := range lr.runs {
		if o == run || o.key != run.key || !o.stored {
			continue
		}
		if slices.Contains(run.overlaps, o) || slices.Contains(o.overlaps, run) {
			lr.rep.violation(checkLeaseStored, run.key, "key %s: overlapping runs of requests %d (token %d) and %d (token %d) both stored their responses",
				run.key, o.req, o.token, run.req, run.token)
		}
	}
}

// finish lets the oldest active run of key answer and waits for its
// response.
func (lr *leaseRunner) finish(key string, crash bool) {
	lr.mu.Lock()
	var run *leaseRun
	for _, r := range lr.runs {
		if r.key == key && !r.ended && !isClosed(r.gate) {
			run = r
			break
		}
	}
	if run == nil {
		lr.mu.Unlock()
		return
	}
	if crash {
		run.status = http.StatusInternalServerError
	}
	req := lr.reqs[run.req]
	close(run.gate)
	lr.mu.Unlock()
	<-req.done
}

func isClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// row reads key's lease and retention as the database sees them now.
func (lr *leaseRunner) row(ctx context.Context, key string) (exists, leaseOver, expired bool) {
	err := lr.pool.QueryRow(ctx, `SELECT coalesce(lease_expires_at < now(), true), coalesce(expires_at < now(), false)
		FROM `+lr.pg.Table()+` WHERE scope = $1 AND key = $2`, httpidem.Scope(http.MethodPost, leaseRoute, ""), key).Scan(&leaseOver, &expired)
	if err == pgx.ErrNoRows {
		return false, false, false
	}
	if err != nil {
		lr.t.Fatal(err)
	}
	return true, leaseOver, expired
}

// expire waits until key's lease runs out, unless a handler of it extended
// it (the test would wait 30 s).
func (lr *leaseRunner) expire(ctx context.Context, key string) {
	lr.mu.Lock()
	for _, r := range lr.runs {
		if r.key == key && !r.extendedAt.IsZero() && time.Since(r.extendedAt) < leaseExtended {
			lr.mu.Unlock()
			return
		}
	}
	lr.mu.Unlock()
	testenv.WaitUntil(lr.t, 10*time.Second, "the lease of "+key+" runs out", func() bool {
		exists, over, _ := lr.row(ctx, key)
		return !exists || over
	})
}

// purge waits until key's row is past its retention, then purges. A row
// whose extended lease keeps it (a lease is never shorter than its row)
// is made past its retention by hand, as a row written before that rule,
// or under a clock that moved, would be: purge must spare it while its
// lease runs all the same.
func (lr *leaseRunner) purge(ctx context.Context, key string) {
	deadline := time.Now().Add(2 * time.Second)
	for {
		exists, _, expired := lr.row(ctx, key)
		if !exists || expired {
			break
		}
		if time.Now().After(deadline) {
			if _, err := lr.pool.Exec(ctx, `UPDATE `+lr.pg.Table()+` SET expires_at = now() - interval '1 millisecond'
				WHERE scope = $1 AND key = $2`, httpidem.Scope(http.MethodPost, leaseRoute, ""), key); err != nil {
				lr.t.Fatal(err)
			}
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := lr.pg.Purge(ctx, 100); err != nil {
		lr.t.Fatal(err)
	}
}

// run applies the ops, then lets every handler still running answer.
func (lr *leaseRunner) run(ctx context.Context, ops []leaseOp) {
	for i, o := range ops {
		lr.rep.at(i+1, o.String())
		o.apply(ctx, lr)
	}
	lr.rep.at(len(ops)+1, "finish all")
	for {
		lr.mu.Lock()
		var keys []string
		for _, r := range lr.runs {
			if !r.ended && !isClosed(r.gate) {
				keys = append(keys, r.key)
			}
		}
		lr.mu.Unlock()
		if len(keys) == 0 {
			break
		}
		lr.finish(keys[0], false)
	}
	lr.mu.Lock()
	var reqs []*leaseReq
	for _, r := range lr.reqs {
		reqs = append(reqs, r)
	}
	lr.mu.Unlock()
	for _, r := range reqs {
		<-r.done
	}
	lr.srv.Close()
	lr.t.Logf("seams: seed=%d mode=lease: %d requests, %d handler runs", lr.rep.seed, len(reqs), len(lr.runs))
}
