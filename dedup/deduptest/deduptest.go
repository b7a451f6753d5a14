// Package deduptest is the conformance suite of dedup.Store. Every store runs
// it; a store that passes keeps idem's promise: one committed claim per key.
// RunOffsets, RunEpochs, RunAdmin, RunRequests, RunJournal,
// RunWatermarks and RunParking are the suites of the other contracts a
// store may implement (dedup.OffsetStore, EpochStore, Admin, RequestStore,
// Journal, Watermarks, Parking).
//
//	func TestConformance(t *testing.T) {
//		deduptest.Run(t, func(t *testing.T, cfg deduptest.Config) dedup.Store[pgx.Tx] {
//			return newStoreForTest(t, cfg) // a fresh, empty store
//		})
//	}
package deduptest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/dedup"
)

// Config is what the suite asks of a fresh store.
type Config struct {
	// LockTimeout bounds the wait on a concurrent uncommitted claim.
	LockTimeout time.Duration
	// ScopeRetention sets the retention of the scopes it names; other scopes
	// keep their rows forever (or for a long default).
	ScopeRetention map[string]time.Duration
}

// Factory returns a fresh, empty store for one test, cleaned up by t.Cleanup.
type Factory[TTx any] func(t *testing.T, cfg Config) dedup.Store[TTx]

// Options adapt the suite to a store.
type Options struct {
	// Serializable says the store runs claims under SERIALIZABLE isolation
	// (a distributed SQL database's default). There a claim that meets a
	// key another transaction committed after its snapshot fails with a
	// conflict (dedup.ClassConflict) instead of reporting a duplicate, and
	// the consumer retries it. The suite then retries conflicts where it
	// otherwise wants every claim of concurrent batches to succeed the first
	// time; it still wants every key new exactly once.
	Serializable bool
}

// Run runs the conformance suite.
func Run[TTx any](t *testing.T, newStore Factory[TTx]) {
	RunWith(t, newStore, Options{})
}

// RunWith runs the conformance suite with options.
func RunWith[TTx any](t *testing.T, newStore Factory[TTx], opts Options) {
	s := suite[TTx]{newStore: newStore, opts: opts}
	t.Run("NewThenDuplicate", s.newThenDuplicate)
	t.Run("RollbackForgetsClaim", s.rollbackForgets)
	t.Run("SameKeyTwiceInBatch", s.sameKeyTwiceInBatch)
	t.Run("FingerprintMismatch", s.fingerprintMismatch)
	t.Run("ScopesIsolated", s.scopesIsolated)
	t.Run("CancelledContextConsumesNoClaim", s.cancelledContext)
	t.Run("ConcurrentClaimsOneWinner", s.concurrentClaims)
	t.Run("InFlightWaitIsBounded", s.inFlightBounded)
	t.Run("WaiterSeesRollback", s.waiterSeesRollback)
	t.Run("RecordFailure", s.recordFailure)
	t.Run("PurgeRemovesOnlyExpired", s.purge)
	t.Run("LargeBatch", s.largeBatch)
	t.Run("ResultsBufferReused", s.resultsReused)
	t.Run("OverlappingBatchesDoNotDeadlock", s.overlappingBatches)
	t.Run("CheckAfterMigrate", s.checkAfterMigrate)
	t.Run("RetentionAsConfigured", s.retentionAsConfigured)
}

// retentionAsConfigured: Retention says the retention the store was given
// (the consumer holds non-blocking retries to it), for ever for the scopes
// it was not, and a caller that changes the map it got changes nothing.
func (s suite[TTx]) retentionAsConfigured(t *testing.T) {
	const short = 42 * time.Minute
	st := s.store(t, Config{ScopeRetention: map[string]time.Duration{"short": short, "kept": 0}})
	def, perScope := st.Retention()
	if got, ok := perScope["short"]; !ok || got != short {
		t.Fatalf("Retention() per scope = %v: want scope \"short\" kept %v, as configured", perScope, short)
	}
	if got, ok := perScope["kept"]; ok && got > 0 || !ok && def > 0 {
		t.Fatalf("Retention() = %v, %v: scope \"kept\" was configured 0 (for ever)", def, perScope)
	}
	if def > 0 && def <= short {
		t.Fatalf("Retention() default = %v: the scopes not configured keep their keys for ever or a long default, "+
			"not less than the %v of a configured scope", def, short)
	}
	perScope["short"] = time.Nanosecond
	if _, again := st.Retention(); again["short"] != short {
		t.Fatalf("Retention() per scope after the caller changed the map it got = %v: want scope \"short\" still %v", again, short)
	}
}

// checkAfterMigrate: the factory's store is migrated, so Check passes.
func (s suite[TTx]) checkAfterMigrate(t *testing.T) {
	st, ctx := s.store(t, Config{}), ctxFor(t)
	if err := st.Check(ctx); err != nil {
		t.Fatalf("Check of a migrated store: %v", err)
	}
}

type suite[TTx any] struct {
	newStore Factory[TTx]
	opts     Options
}

func (s suite[TTx]) store(t *testing.T, cfg Config) dedup.Store[TTx] {
	if cfg.LockTimeout == 0 {
		cfg.LockTimeout = 5 * time.Second
	}
	return s.newStore(t, cfg)
}

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// Claim makes a claim of key id in scope with a fingerprint of payload.
func Claim(scope, id, payload string) dedup.Claim {
	return dedup.Claim{Key: dedup.Key{Scope: scope, ID: id}, Fingerprint: dedup.FingerprintOf([]byte(payload)), Source: "deduptest"}
}

// claimTx claims cs in one committed transaction and returns the statuses.
func claimTx[TTx any](ctx context.Context, st dedup.Store[TTx], cs ...dedup.Claim) ([]dedup.Result, error) {
	res := make([]dedup.Result, len(cs))
	err := st.InTx(ctx, func(ctx context.Context, tx TTx) error {
		return st.Claim(ctx, tx, cs, res)
	})
	if err == nil {
		err = checkSet(res)
	}
	return res, err
}

// checkSet fails a claim that left a result without a valid status, or a
// known key without the time it was first claimed.
func checkSet(res []dedup.Result) error {
	for i, r := range res {
		if !r.Status.Valid() {
			return fmt.Errorf("claim %d of %d: result left unset (status %d): every result must be set", i, len(res), r.Status)
		}
		if r.Status != dedup.StatusNew && (r.FirstAt.IsZero() || time.Since(r.FirstAt) > 24*time.Hour || time.Until(r.FirstAt) > time.Hour) {
			return fmt.Errorf("claim %d of %d: %v with FirstAt %v: want when the key was first claimed", i, len(res), r.Status, r.FirstAt)
		}
	}
	return nil
}

func mustStatus(t *testing.T, res []dedup.Result, err error, want ...dedup.Status) {
	t.Helper()
	if err != nil {
		t.Fatalf("claim: %v", err)
	}
	for i, w := range want {
		if res[i].Status != w {
			t.Fatalf("claim %d: status %v, want %v (all: %v)", i, res[i].Status, w, res)
		}
	}
}

var errRollback = errors.New("deduptest: roll back")

func (s suite[TTx]) newThenDuplicate(t *testing.T) {
	st, ctx := s.store(t, Config{}), ctxFor(t)
	c := Claim("orders", "k1", `{"amount":1}`)
	res, err := claimTx(ctx, st, c)
	mustStatus(t, res, err, dedup.StatusNew)
	res, err = claimTx(ctx, st, c)
	mustStatus(t, res, err, dedup.StatusDuplicate)
	// The canonical form makes key order and number spelling irrelevant.
	res, err = claimTx(ctx, st, Claim("orders", "k1", `{ "amount" : 1.0 }`))
	mustStatus(t, res, err, dedup.StatusDuplicate)
}

func (s suite[TTx]) rollbackForgets(t *testing.T) {
	st, ctx := s.store(t, Config{}), ctxFor(t)
	c := Claim("orders", "k1", "p")
	err := st.InTx(ctx, func(ctx context.Context, tx TTx) error {
		res := make([]dedup.Result, 1)
		if err := st.Claim(ctx, tx, []dedup.Claim{c}, res); err != nil {
			return err
		}
		if res[0].Status != dedup.StatusNew {
			t.Errorf("first claim: %v, want new", res[0].Status)
		}
		return errRollback
	})
	if !errors.Is(err, errRollback) {
		t.Fatalf("InTx returned %v, want the function's error", err)
	}
	res, err := claimTx(ctx, st, c)
	mustStatus(t, res, err, dedup.StatusNew)
}

func (s suite[TTx]) sameKeyTwiceInBatch(t *testing.T) {
	st, ctx := s.store(t, Config{}), ctxFor(t)
	res, err := claimTx(ctx, st,
		Claim("orders", "k1", "p"), Claim("orders", "k1", "p"), Claim("orders", "k1", "other"), Claim("orders", "k2", "p"))
	mustStatus(t, res, err, dedup.StatusNew, dedup.StatusDuplicate, dedup.StatusMismatch, dedup.StatusNew)
	res, err = claimTx(ctx, st, Claim("orders", "k1", "p"), Claim("orders", "k2", "p"))
	mustStatus(t, res, err, dedup.StatusDuplicate, dedup.StatusDuplicate)
	// Repeats of a key committed before compare with the stored row, each.
	res, err = claimTx(ctx, st, Claim("orders", "k1", "other"), Claim("orders", "k1", "p"))
	mustStatus(t, res, err, dedup.StatusMismatch, dedup.StatusDuplicate)
	res, err = claimTx(ctx, st, Claim("orders", "k1", "other"), Claim("orders", "k1", "other"))
	mustStatus(t, res, err, dedup.StatusMismatch, dedup.StatusMismatch)
	if err := st.RecordFailure(ctx, Claim("orders", "f1", "p"), "bad"); err != nil {
		t.Fatal(err)
	}
	res, err = claimTx(ctx, st, Claim("orders", "f1", "other"), Claim("orders", "f1", "p"))
	mustStatus(t, res, err, dedup.StatusMismatch, dedup.StatusFailed)
}

func (s suite[TTx]) fingerprintMismatch(t *testing.T) {
	st, ctx := s.store(t, Config{}), ctxFor(t)
	res, err := claimTx(ctx, st, Claim("pay", "txn-1", `{"amount":100}`))
	mustStatus(t, res, err, dedup.StatusNew)
	res, err = claimTx(ctx, st, Claim("pay", "txn-1", `{"amount":101}`))
	mustStatus(t, res, err, dedup.StatusMismatch)
}

func (s suite[TTx]) scopesIsolated(t *testing.T) {
	st, ctx := s.store(t, Config{}), ctxFor(t)
	res, err := claimTx(ctx, st, Claim("pay/tenant-a", "k", "p"), Claim("pay/tenant-b", "k", "p"))
	mustStatus(t, res, err, dedup.StatusNew, dedup.StatusNew)
	res, err = claimTx(ctx, st, Claim("other", "k", "p"))
	mustStatus(t, res, err, dedup.StatusNew)
}

func (s suite[TTx]) cancelledContext(t *testing.T) {
	st := s.store(t, Config{})
	c := Claim("orders", "k1", "p")
	cctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := claimTx(cctx, st, c)
	if err == nil {
		t.Fatal("claim with a cancelled context succeeded")
	}
	// Cancelled between claim and commit.
	cctx, cancel = context.WithCancel(context.Background())
	err = st.InTx(cctx, func(ctx context.Context, tx TTx) error {
		res := make([]dedup.Result, 1)
		if err := st.Claim(ctx, tx, []dedup.Claim{c}, res); err != nil {
			return err
		}
		cancel()
		return nil
	})
	if err == nil {
		t.Fatal("InTx committed although its context was cancelled before commit")
	}
	res, err := claimTx(ctxFor(t), st, c)
	mustStatus(t, res, err, dedup.StatusNew)
}

// concurrentClaims: 100 transactions claim one key at once; each retries on a
// retryable error, as the consumer does. Exactly one wins, none deadlocks.
func (s suite[TTx]) concurrentClaims(t *testing.T) {
	st, ctx := s.store(t, Config{LockTimeout: 2 * time.Second}), ctxFor(t)
	const n = 100
	var wins, dups atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range n {
		wg.Go(func() {
			for attempt := 0; ; attempt++ {
				res, err := claimTx(ctx, st, Claim("orders", "hot", "p"))
				if err == nil {
					switch res[0].Status {
					case dedup.StatusNew:
						wins.Add(1)
					case dedup.StatusDuplicate:
						dups.Add(1)
					default:
						errs <- fmt.Errorf("status %v", res[0].Status)
					}
					return
				}
				if !st.ClassifyError(err).NotTheMessage() && st.ClassifyError(err) != dedup.ClassRetryable && !errors.Is(err, dedup.ErrInFlight) && !errors.Is(err, dedup.ErrStoreBusy) || attempt > 50 {
					errs <- err
					return
				}
				time.Sleep(time.Duration(attempt+1) * time.Millisecond)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("claim: %v", err)
	}
	if wins.Load() != 1 || dups.Load() != n-1 {
		t.Fatalf("%d new and %d duplicate claims, want 1 and %d", wins.Load(), dups.Load(), n-1)
	}
}

// holdClaim claims c in a transaction that stays open until release is
// closed; it commits unless rollback is set. ready is closed once claimed.
func holdClaim[TTx any](ctx context.Context, st dedup.Store[TTx], c dedup.Claim, rollback bool, ready, release chan struct{}) <-chan error {
	done := make(chan error, 1)
	go func() {
		done <- st.InTx(ctx, func(ctx context.Context, tx TTx) error {
			res := make([]dedup.Result, 1)
			if err := st.Claim(ctx, tx, []dedup.Claim{c}, res); err != nil {
				close(ready)
				return err
			}
			close(ready)
			<-release
			if rollback {
				return errRollback
			}
			return nil
		})
	}()
	return done
}

func (s suite[TTx]) inFlightBounded(t *testing.T) {
	st, ctx := s.store(t, Config{LockTimeout: 200 * time.Millisecond}), ctxFor(t)
	c := Claim("orders", "k1", "p")
	ready, release := make(chan struct{}), make(chan struct{})
	done := holdClaim(ctx, st, c, false, ready, release)
	<-ready
	_, err := claimTx(ctx, st, c)
	// A store whose lock is the database's (SQLite) cannot tell this key
	// from another: it reports the database busy instead.
	if !errors.Is(err, dedup.ErrInFlight) && !errors.Is(err, dedup.ErrStoreBusy) {
		t.Errorf("claim of a key held by an open transaction: %v, want ErrInFlight (or ErrStoreBusy)", err)
	}
	if err != nil && st.ClassifyError(err) == dedup.ClassPermanent {
		t.Errorf("in-flight error classified permanent: %v", err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatalf("holder: %v", err)
	}
	res, err := claimTx(ctx, st, c)
	mustStatus(t, res, err, dedup.StatusDuplicate)
}

func (s suite[TTx]) waiterSeesRollback(t *testing.T) {
	st, ctx := s.store(t, Config{LockTimeout: 10 * time.Second}), ctxFor(t)
	c := Claim("orders", "k1", "p")
	ready, release := make(chan struct{}), make(chan struct{})
	done := holdClaim(ctx, st, c, true, ready, release)
	<-ready
	type out struct {
		res []dedup.Result
		err error
	}
	waiter := make(chan out, 1)
	go func() {
		res, err := claimTx(ctx, st, c)
		waiter <- out{res, err}
	}()
	time.Sleep(50 * time.Millisecond) // let the waiter block on the held key
	close(release)
	if err := <-done; !errors.Is(err, errRollback) {
		t.Fatalf("holder: %v", err)
	}
	o := <-waiter
	mustStatus(t, o.res, o.err, dedup.StatusNew)
}

func (s suite[TTx]) recordFailure(t *testing.T) {
	st, ctx := s.store(t, Config{}), ctxFor(t)
	c := Claim("pay", "txn-9", `{"amount":5}`)
	if err := st.RecordFailure(ctx, c, "handler: amount is negative"); err != nil {
		t.Fatalf("RecordFailure: %v", err)
	}
	res, err := claimTx(ctx, st, c)
	mustStatus(t, res, err, dedup.StatusFailed)
	if res[0].Reason != "handler: amount is negative" {
		t.Errorf("reason %q", res[0].Reason)
	}
	// A committed key is not overwritten by a later failure record.
	ok := Claim("pay", "txn-10", "p")
	res, err = claimTx(ctx, st, ok)
	mustStatus(t, res, err, dedup.StatusNew)
	if err := st.RecordFailure(ctx, ok, "late"); err != nil {
		t.Fatalf("RecordFailure of a committed key: %v", err)
	}
	res, err = claimTx(ctx, st, ok)
	mustStatus(t, res, err, dedup.StatusDuplicate)
}

func (s suite[TTx]) purge(t *testing.T) {
	st := s.store(t, Config{ScopeRetention: map[string]time.Duration{"short": time.Millisecond}})
	purger, ok := st.(dedup.Purger)
	if !ok {
		t.Skip("the store keeps rows for ever: it is not a dedup.Purger")
	}
	ctx := ctxFor(t)
	var cs []dedup.Claim
	for i := range 25 {
		cs = append(cs, Claim("short", fmt.Sprint("s", i), "p"), Claim("long", fmt.Sprint("l", i), "p"))
	}
	res, err := claimTx(ctx, st, cs...)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if r.Status != dedup.StatusNew {
			t.Fatalf("claim %d: %v", i, r.Status)
		}
	}
	time.Sleep(100 * time.Millisecond) // the short rows expire
	total := 0
	for {
		n, err := purger.Purge(ctx, 10)
		if err != nil {
			t.Fatalf("Purge: %v", err)
		}
		if n > 10 {
			t.Fatalf("Purge(10) deleted %d rows", n)
		}
		total += n
		if n < 10 {
			break
		}
	}
	if total != 25 {
		t.Fatalf("purged %d rows, want the 25 expired ones", total)
	}
	res, err = claimTx(ctx, st, Claim("short", "s0", "p"), Claim("long", "l0", "p"))
	mustStatus(t, res, err, dedup.StatusNew, dedup.StatusDuplicate)
}

func (s suite[TTx]) largeBatch(t *testing.T) {
	st, ctx := s.store(t, Config{}), ctxFor(t)
	// 10,000 is the consumer's largest BatchSize: a store must take it in one
	// Claim (SQLite, for one, splits it under its variable limit).
	cs := make([]dedup.Claim, 10000)
	for i := range cs {
		cs[i] = Claim("bulk", fmt.Sprint("k", i), fmt.Sprint(i))
	}
	res, err := claimTx(ctx, st, cs...)
	if err != nil {
		t.Fatal(err)
	}
	for i := range res {
		if res[i].Status != dedup.StatusNew {
			t.Fatalf("claim %d: %v", i, res[i].Status)
		}
	}
	// Half old, half new, interleaved.
	mixed := make([]dedup.Claim, 0, len(cs))
	for i := 0; i < len(cs); i += 2 {
		mixed = append(mixed, cs[i], Claim("bulk", fmt.Sprint("new", i), "x"))
	}
	res, err = claimTx(ctx, st, mixed...)
	if err != nil {
		t.Fatal(err)
	}
	for i := range res {
		want := dedup.StatusDuplicate
		if i%2 == 1 {
			want = dedup.StatusNew
		}
		if res[i].Status != want {
			t.Fatalf("mixed claim %d: %v, want %v", i, res[i].Status, want)
		}
	}
}

// resultsReused passes a results slice still holding an earlier batch's
// statuses, as a caller that reuses its buffers does.
func (s suite[TTx]) resultsReused(t *testing.T) {
	st, ctx := s.store(t, Config{}), ctxFor(t)
	if _, err := claimTx(ctx, st, Claim("orders", "old", "p")); err != nil {
		t.Fatal(err)
	}
	res := []dedup.Result{{Status: dedup.StatusNew}, {Status: dedup.StatusNew}, {Status: dedup.StatusFailed, Reason: "stale"}}
	err := st.InTx(ctx, func(ctx context.Context, tx TTx) error {
		return st.Claim(ctx, tx, []dedup.Claim{Claim("orders", "old", "p"), Claim("orders", "fresh", "p"), Claim("orders", "old", "other")}, res)
	})
	if err == nil {
		err = checkSet(res)
	}
	mustStatus(t, res, err, dedup.StatusDuplicate, dedup.StatusNew, dedup.StatusMismatch)
}

// overlappingBatches: concurrent transactions claim overlapping key sets in
// different orders. A store that takes its keys in one canonical order never
// deadlocks (nor times out) on them, and every key is new exactly once.
func (s suite[TTx]) overlappingBatches(t *testing.T) {
	st, ctx := s.store(t, Config{LockTimeout: 20 * time.Second}), ctxFor(t)
	const workers, rounds, keys, perBatch = 6, 12, 40, 20
	news := make([]atomic.Int64, keys)
	var conflicts atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers*rounds)
	for w := range workers {
		wg.Go(func() {
			for r := range rounds {
				perm := rand.New(rand.NewPCG(uint64(w), uint64(r))).Perm(keys)[:perBatch]
				cs := make([]dedup.Claim, perBatch)
				for i, k := range perm {
					cs[i] = Claim("overlap", fmt.Sprint("k", k), "p")
				}
				res, err := claimTx(ctx, st, cs...)
				for attempt := 0; err != nil && s.opts.Serializable && st.ClassifyError(err) == dedup.ClassConflict && attempt < 100; attempt++ {
					conflicts.Add(1)
					time.Sleep(time.Duration(attempt+1) * time.Millisecond)
					res, err = claimTx(ctx, st, cs...)
				}
				if err != nil {
					errs <- err
					return
				}
				for i, k := range perm {
					if res[i].Status == dedup.StatusNew {
						news[k].Add(1)
					}
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if s.opts.Serializable {
		t.Logf("%d serialization conflicts retried", conflicts.Load())
	}
	for err := range errs {
		t.Errorf("claim of overlapping batches: %v", err)
	}
	for k := range news {
		if n := news[k].Load(); n > 1 {
			t.Errorf("key k%d claimed new %d times", k, n)
		}
	}
}
