package redisfront_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/deduptest"
	"github.com/idemkit/idem/dedup/redisfront"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/internal/testenv/ledger"
)

// outcome is what a run left: the reconciliation, each account's balance,
// and which messages were dead-lettered.
type outcome struct {
	report   ledger.Report
	balances map[string]int64
	dead     []string
	applied  int64
}

// ledgerRun runs the consumer on a fresh SQLite database over the ledger
// workload's 300 credits, sent once and then all again (a replay: over half
// of the deliveries are duplicates), each delivery up to twice, with the
// store wrapped by wrap. during, when set, runs beside the consumer; done is
// closed when the consumer settled everything.
func ledgerRun(t *testing.T, wrap func(dedup.Store[*sql.Tx]) dedup.Store[*sql.Tx], during func(done <-chan struct{})) outcome {
	t.Helper()
	inner, db := sqliteInnerDB(t, deduptest.Config{})
	st := wrap(inner)
	ctx := context.Background()
	s := ledger.Generate(300, 11)
	if err := ledger.Setup(ctx, db, s.Accounts); err != nil {
		t.Fatal(err)
	}
	msgs := ledger.Messages("ledger", append(slices.Clone(s.Payloads), s.Payloads...))
	dctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	done, ended := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(ended)
		if during != nil {
			during(done)
		}
	}()
	res, err := consumertest.Drive(dctx, consumer.Config[*sql.Tx]{
		Name: "ledger", Store: st, Handler: ledger.Handler(), Key: consumer.ByJSONField(ledger.KeyField),
		MaxPayloadBytes: ledger.MaxPayload, BatchSize: 10, Logger: quiet,
	}, consumertest.Script{MinDeliveries: 1, MaxDeliveries: 2, CrashAfterCommitEvery: 7, Seed: 3}, msgs...)
	close(done)
	<-ended
	if err != nil {
		t.Fatalf("consumer: %v (%v)", err, res)
	}
	r, err := ledger.Reconcile(ctx, db, `"idem_dedup"`, "ledger", s.Expected)
	if err != nil {
		t.Fatal(err)
	}
	o := outcome{report: r, applied: res.Stats.Applied}
	if o.balances, err = ledger.Balances(ctx, db); err != nil {
		t.Fatal(err)
	}
	dead := map[string]bool{}
	for _, l := range res.DeadLetters {
		// A message's first and second delivery share its payload; the
		// reason's class is what must agree.
		dead[fmt.Sprintf("%s: %v", l.Message.Value[:min(len(l.Message.Value), 40)], reasonClass(l.Reason))] = true
	}
	o.dead = slices.Sorted(maps.Keys(dead))
	t.Log(res)
	return o
}

func reasonClass(err error) string {
	for _, e := range []error{consumer.ErrBadPayload, consumer.ErrNoKey, consumer.ErrPayloadTooLarge, dedup.ErrFingerprintMismatch, ledger.ErrBadCredit} {
		if errors.Is(err, e) {
			return e.Error()
		}
	}
	return "other: " + err.Error()
}

// TestRedisFaultsChangeNothing runs the same stream on the database alone
// and through the front while Redis is killed (and started again, empty),
// flushed, or paused (CLIENT PAUSE, longer than the front's timeout) in
// the middle of it: the tables end the same, every payment once, the same
// messages dead-lettered; the front answered duplicates before the fault
// and after it. The Redis is the test's own (testenv.PrivateRedis): the
// shared one stays up for the other tests.
func TestRedisFaultsChangeNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("kills and pauses Redis")
	}
	srv := testenv.NewPrivateRedis(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1, DialTimeout: time.Second})
	t.Cleanup(func() { c.Close() })
	want := ledgerRun(t, func(st dedup.Store[*sql.Tx]) dedup.Store[*sql.Tx] { return st }, nil)
	if !want.report.OK() || want.applied != 300 {
		t.Fatalf("the database alone: %v, applied %d", want.report, want.applied)
	}
	// wait waits until cond holds or the run ended.
	wait := func(done <-chan struct{}, cond func() bool) bool {
		for !cond() {
			select {
			case <-done:
				return false
			case <-time.After(time.Millisecond):
			}
		}
		return true
	}
	faults := []struct {
		name string
		do   func(done <-chan struct{}, commits func() int64) error
	}{
		{"killed", func(done <-chan struct{}, commits func() int64) error {
			srv.Kill()
			// Down while the consumer commits a few batches.
			at := commits() + 5
			wait(done, func() bool { return commits() >= at })
			return srv.Start("")
		}},
		{"flushed", func(<-chan struct{}, func() int64) error {
			return c.FlushAll(context.Background()).Err()
		}},
		{"paused", func(<-chan struct{}, func() int64) error {
			return c.ClientPause(context.Background(), 500*time.Millisecond).Err()
		}},
	}
	for _, fault := range faults {
		t.Run(fault.name, func(t *testing.T) {
			var f *redisfront.Store[*sql.Tx]
			var inner *counting[*sql.Tx]
			faulted := make(chan error, 1)
			var before redisfront.Stats
			var fired atomic.Bool
			got := ledgerRun(t, func(st dedup.Store[*sql.Tx]) dedup.Store[*sql.Tx] {
				inner = &counting[*sql.Tx]{Store: st}
				cfg := frontConfig(c, nil)
				cfg.Timeout = 50 * time.Millisecond // shorter than the pause
				cfg.RetryAfter = 100 * time.Millisecond
				f = front(t, dedup.Store[*sql.Tx](inner), cfg)
				return f
			}, func(done <-chan struct{}) {
				defer close(faulted)
				// Mid-stream: once the front has answered duplicates.
				if !wait(done, func() bool { return f.Stats().Hits >= 20 }) {
					return
				}
				before = f.Stats()
				fired.Store(true)
				if err := fault.do(done, inner.txs.Load); err != nil {
					faulted <- err
				}
			})
			if err := <-faulted; err != nil {
				t.Fatal(err)
			}
			after := f.Stats()
			t.Logf("front before the fault %+v, after the run %+v; %d database transactions", before, after, inner.txs.Load())
			if !fired.Load() {
				t.Fatal("the fault never fired: the test proved nothing")
			}
			if fault.name != "flushed" && after.Errors == before.Errors {
				t.Errorf("Redis was %s but the front saw no error: the test proved nothing", fault.name)
			}
			if !got.report.OK() || got.applied != want.applied {
				t.Fatalf("%v, applied %d; the database alone: %v, applied %d", got.report, got.applied, want.report, want.applied)
			}
			if !maps.Equal(got.balances, want.balances) {
				t.Fatalf("balances differ from the database alone's")
			}
			if !slices.Equal(got.dead, want.dead) {
				t.Fatalf("dead letters differ:\n%q\nthe database alone:\n%q", got.dead, want.dead)
			}
		})
	}
}
