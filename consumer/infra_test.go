package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/memstore"
)

// flakyStore fails its first transactions as if the database were down.
type flakyStore struct {
	*memstore.Store
	down atomic.Int64
}

var errDBDown = errors.New("connection refused")

func (f *flakyStore) InTx(ctx context.Context, fn func(context.Context, *memstore.Tx) error) error {
	if f.down.Add(-1) >= 0 {
		return errDBDown
	}
	return f.Store.InTx(ctx, fn)
}

func (f *flakyStore) ClassifyError(err error) dedup.ErrorClass {
	if errors.Is(err, errDBDown) {
		return dedup.ClassUnavailable
	}
	return dedup.ClassUnknown
}

func TestDatabaseOutageIsWaitedOutNotDeadLettered(t *testing.T) {
	eff := newEffects()
	cfg := baseConfig(eff.apply)
	st := &flakyStore{Store: memstore.New(memstore.Config{})}
	st.down.Store(50) // far more than Retry.MaxAttempts
	cfg.Store = st
	res := consumertest.Run(t, cfg, consumertest.Script{}, payments(2)...)
	eff.check(t, []string{"T00000", "T00001"})
	if len(res.DeadLetters) != 0 {
		t.Fatalf("dead letters during an outage: %+v", res.DeadLetters)
	}
	if res.Stats.Retries < 50 {
		t.Errorf("retries %d, want >= 50", res.Stats.Retries)
	}
}

// conflictStore classifies errDeadlock as the SQL stores classify 40P01.
type conflictStore struct{ *memstore.Store }

var errDeadlock = errors.New("deadlock detected")

func (c conflictStore) ClassifyError(err error) dedup.ErrorClass {
	if errors.Is(err, errDeadlock) {
		return dedup.ClassConflict
	}
	return dedup.ClassUnknown
}

// TestConflictsDoNotUseUpTheRetryBudget: a deadlock with another lane, met
// by the handler's own UPDATE, is not the message's fault; twenty in a row
// (MaxAttempts is 4) still end in the message applied, not dead-lettered.
func TestConflictsDoNotUseUpTheRetryBudget(t *testing.T) {
	eff := newEffects()
	var left atomic.Int64
	left.Store(20)
	cfg := baseConfig(func(ctx context.Context, tx *memstore.Tx, m *consumer.Message) error {
		if left.Add(-1) >= 0 {
			return fmt.Errorf("update accounts: %w", errDeadlock)
		}
		id, _ := consumer.ByJSONField("txn_id")(m)
		eff.add(tx, id)
		return nil
	})
	cfg.Store = conflictStore{memstore.New(memstore.Config{})}
	res := consumertest.Run(t, cfg, consumertest.Script{}, consumertest.Message("pay", 0, 0, "", payment(0)))
	eff.check(t, []string{"T00000"})
	if len(res.DeadLetters) != 0 || res.Stats.Retries < 20 {
		t.Fatalf("dead letters %+v, retries %d", res.DeadLetters, res.Stats.Retries)
	}
}

// readOnlyStore refuses claims as a demoted primary does (25006), which the
// engine must not charge to the messages: no handler ran.
type readOnlyStore struct {
	*memstore.Store
	down atomic.Int64
}

var errReadOnly = errors.New("cannot execute INSERT in a read-only transaction (SQLSTATE 25006)")

func (r *readOnlyStore) Claim(ctx context.Context, tx *memstore.Tx, c []dedup.Claim, res []dedup.Result) error {
	if r.down.Add(-1) >= 0 {
		return errReadOnly
	}
	return r.Store.Claim(ctx, tx, c, res)
}

// TestFailingClaimIsNotTheMessages: a claim that fails with an error the
// store does not call unavailable used to be split down to lone messages,
// which were charged and dead-lettered (found by review): a read-only or full
// database dead-lettered healthy messages. No handler ran; it is waited out.
func TestFailingClaimIsNotTheMessages(t *testing.T) {
	eff := newEffects()
	cfg := baseConfig(eff.apply)
	st := &readOnlyStore{Store: memstore.New(memstore.Config{})}
	st.down.Store(200) // far more than Retry.MaxAttempts
	cfg.Store = st
	res := consumertest.Run(t, cfg, consumertest.Script{}, payments(2)...)
	if len(res.DeadLetters) != 0 {
		t.Fatalf("dead-lettered while the claim failed: %d, %v", len(res.DeadLetters), res.DeadLetters[0].Reason)
	}
	eff.check(t, []string{"T00000", "T00001"})
}

// retries records the Observer's retry events.
type retries struct {
	consumer.NopObserver
	mu     sync.Mutex
	events []string
}

func (r *retries) Retry(_ context.Context, e consumer.RetryEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, fmt.Sprintf("%d lane=%q class=%v: %v", e.N, e.Lane, e.Class, e.Err))
}

func (r *retries) got() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.events...)
}

// outageStore fails Check and RecordFailure while their counters last,
// with errDBDown (unavailable) or, once down, with fail.
type outageStore struct {
	*memstore.Store
	checkDown, recordDown atomic.Int64
	recordErr             error
}

func (s *outageStore) Check(ctx context.Context) error {
	if s.checkDown.Add(-1) >= 0 {
		return errDBDown
	}
	return s.Store.Check(ctx)
}

func (s *outageStore) RecordFailure(ctx context.Context, c dedup.Claim, reason string) error {
	if s.recordDown.Add(-1) >= 0 {
		return s.recordErr
	}
	return s.Store.RecordFailure(ctx, c, reason)
}

func (s *outageStore) ClassifyError(err error) dedup.ErrorClass {
	if errors.Is(err, errDBDown) {
		return dedup.ClassUnavailable
	}
	return dedup.ClassUnknown
}

// memOffsets keeps next offsets in memory; AdvanceOffset fails with
// advanceErr while advanceDown lasts.
type memOffsets struct {
	mu          sync.Mutex
	next        map[dedup.Partition]int64
	advanceDown atomic.Int64
	advanceErr  error
}

func (o *memOffsets) NextOffset(_ context.Context, _ *memstore.Tx, p dedup.Partition) (int64, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.next[p], nil
}

func (o *memOffsets) AdvanceOffset(_ context.Context, tx *memstore.Tx, p dedup.Partition, expected, next int64) (bool, error) {
	if o.advanceDown.Add(-1) >= 0 {
		return false, o.advanceErr
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.next[p] != expected {
		return false, nil
	}
	tx.OnCommit(func() {
		o.mu.Lock()
		o.next[p] = next
		o.mu.Unlock()
	})
	return true, nil
}

func (o *memOffsets) NextOffsets(context.Context, string, string) (map[int32]int64, error) {
	return nil, errors.New("not used")
}

// TestInfraRetriesWaitForAsLongAsItTakes pins the retries no message's
// budget bounds — the store's check, recording a failure, the dead-letter
// sink, advancing the next offset past a dead letter: each waits out more
// failures than Retry.MaxAttempts, on the exponential backoff, and each
// retry is counted and observed with the lane it belongs to and the error
// it follows, named by what failed.
func TestInfraRetriesWaitForAsLongAsItTakes(t *testing.T) {
	const n = 6
	errOffsets := errors.New("offsets: connection reset")
	for _, tc := range []struct {
		name  string
		setup func(cfg *consumer.Config[*memstore.Tx], st *outageStore, dl *consumertest.DeadLetters, o *memOffsets) *consumer.Message
		lane  string
		class dedup.ErrorClass
		err   string // what RetryEvent.Err says
		cause consumer.Cause
	}{{
		name: "store check",
		setup: func(_ *consumer.Config[*memstore.Tx], st *outageStore, _ *consumertest.DeadLetters, _ *memOffsets) *consumer.Message {
			st.checkDown.Store(n)
			return consumertest.Message("pay", 0, 0, "", payment(0))
		},
		class: dedup.ClassUnavailable, err: "store check: connection refused",
	}, {
		name: "record failure",
		setup: func(cfg *consumer.Config[*memstore.Tx], st *outageStore, _ *consumertest.DeadLetters, _ *memOffsets) *consumer.Message {
			st.recordDown.Store(n)
			st.recordErr = errDBDown
			cfg.Handler = consumer.HandlerFunc[*memstore.Tx](func(context.Context, *memstore.Tx, *consumer.Message) error {
				return consumer.Permanent(errors.New("closed account"))
			})
			return consumertest.Message("pay", 0, 0, "", payment(0))
		},
		class: dedup.ClassUnavailable, err: "connection refused", cause: consumer.CausePermanent,
	}, {
		name: "dead letter",
		setup: func(_ *consumer.Config[*memstore.Tx], _ *outageStore, dl *consumertest.DeadLetters, _ *memOffsets) *consumer.Message {
			dl.FailFirst = n
			return consumertest.Message("pay", 0, 0, "", "not json")
		},
		class: dedup.ClassRetryable, err: "dead letter: " + consumertest.ErrSinkDown.Error(), cause: consumer.CauseBadInput,
	}, {
		name: "advance past a dead letter",
		setup: func(cfg *consumer.Config[*memstore.Tx], _ *outageStore, _ *consumertest.DeadLetters, o *memOffsets) *consumer.Message {
			cfg.Offsets, cfg.Key, cfg.MaxPayloadBytes = o, nil, 4
			o.advanceDown.Store(n)
			o.advanceErr = errOffsets
			return consumertest.Message("pay", 0, 0, "", payment(0))
		},
		lane: "pay/0", class: dedup.ClassRetryable, err: "advance the next offset past pay/0/0: " + errOffsets.Error(), cause: consumer.CauseBadInput,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := baseConfig(func(context.Context, *memstore.Tx, *consumer.Message) error { return nil })
			st := &outageStore{Store: memstore.New(memstore.Config{})}
			dl := &consumertest.DeadLetters{}
			o := &memOffsets{next: map[dedup.Partition]int64{}}
			cfg.Store, cfg.DeadLetter = st, dl
			rec, clock := &retries{}, consumertest.NewClock()
			cfg.Observer, cfg.Clock = rec, clock
			// No jitter to speak of; bounds the infra retries must ignore.
			cfg.Retry = consumer.RetryPolicy{Initial: time.Second, Max: 8 * time.Second, Multiplier: 2, Jitter: 1e-9, MaxAttempts: 2, MaxElapsed: time.Second}
			res := consumertest.Run(t, cfg, consumertest.Script{}, tc.setup(&cfg, st, dl, o))

			var want []string
			for i := 1; i <= n; i++ {
				want = append(want, fmt.Sprintf("%d lane=%q class=%v: %s", i, tc.lane, tc.class, tc.err))
			}
			if got := rec.got(); strings.Join(got, "\n") != strings.Join(want, "\n") {
				t.Errorf("retry events\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
			if res.Stats.Retries != n {
				t.Errorf("Stats.Retries %d, want %d", res.Stats.Retries, n)
			}
			wantSleeps := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 8 * time.Second, 8 * time.Second}
			sleeps := clock.Sleeps()
			if len(sleeps) != len(wantSleeps) {
				t.Fatalf("slept %v, want %v", sleeps, wantSleeps)
			}
			for i, d := range sleeps {
				if d < wantSleeps[i]-time.Microsecond || d > wantSleeps[i]+time.Microsecond {
					t.Errorf("sleep %d: %v, want %v", i+1, d, wantSleeps[i])
				}
			}
			switch {
			case tc.cause == 0 && len(res.DeadLetters) != 0:
				t.Errorf("dead letters %v, want none", res.DeadLetters)
			case tc.cause != 0 && (len(res.DeadLetters) != 1 || res.DeadLetters[0].Cause != tc.cause):
				t.Errorf("dead letters %v, want one of cause %v", res.DeadLetters, tc.cause)
			}
			if cfg.Offsets != nil {
				if next := o.next[dedup.Partition{Scope: "payments", Topic: "pay", Partition: 0}]; next != 1 {
					t.Errorf("next offset %d after the dead letter, want 1", next)
				}
			}
		})
	}
}

// TestInfraRetriesStop pins what ends those retries early: a store that
// is not migrated stops Run before it starts; a failure that cannot be
// recorded for good is dead-lettered all the same; an offset that cannot
// be advanced for good stops the consumer. None is retried.
func TestInfraRetriesStop(t *testing.T) {
	t.Run("store not migrated", func(t *testing.T) {
		cfg := baseConfig(func(context.Context, *memstore.Tx, *consumer.Message) error { return nil })
		rec := &retries{}
		cfg.Observer = rec
		cfg.Store = notMigrated{memstore.New(memstore.Config{})}
		res, err := consumertest.Drive(context.Background(), cfg, consumertest.Script{}, consumertest.Message("pay", 0, 0, "", payment(0)))
		if !errors.Is(err, dedup.ErrNotMigrated) || !strings.Contains(err.Error(), "consumer: store not ready") {
			t.Errorf("Drive: %v, want consumer: store not ready: … dedup.ErrNotMigrated", err)
		}
		if res.Stats.Delivered != 0 {
			t.Errorf("%d messages delivered, want none", res.Stats.Delivered)
		}
		if got := rec.got(); len(got) != 0 {
			t.Errorf("retried: %v", got)
		}
	})
	t.Run("record failure refused", func(t *testing.T) {
		cfg := baseConfig(func(context.Context, *memstore.Tx, *consumer.Message) error {
			return consumer.Permanent(errors.New("closed account"))
		})
		rec := &retries{}
		st := &outageStore{Store: memstore.New(memstore.Config{})}
		st.recordDown.Store(1)
		st.recordErr = consumer.Permanent(errors.New("value too long"))
		cfg.Store, cfg.Observer = st, rec
		res := consumertest.Run(t, cfg, consumertest.Script{}, consumertest.Message("pay", 0, 0, "", payment(0)))
		if len(res.DeadLetters) != 1 || res.DeadLetters[0].Cause != consumer.CausePermanent {
			t.Errorf("dead letters %v, want one, permanent", res.DeadLetters)
		}
		if got := rec.got(); len(got) != 0 {
			t.Errorf("retried: %v", got)
		}
	})
	t.Run("advance refused", func(t *testing.T) {
		cfg := baseConfig(func(context.Context, *memstore.Tx, *consumer.Message) error { return nil })
		rec := &retries{}
		o := &memOffsets{next: map[dedup.Partition]int64{}, advanceErr: fmt.Errorf("%w: refused", dedup.ErrContract)}
		o.advanceDown.Store(1)
		cfg.Offsets, cfg.Key, cfg.MaxPayloadBytes, cfg.Observer = o, nil, 4, rec
		res, err := consumertest.Drive(context.Background(), cfg, consumertest.Script{}, consumertest.Message("pay", 0, 0, "", payment(0)))
		if !errors.Is(err, dedup.ErrContract) || !strings.Contains(err.Error(), "advance the next offset past pay/0/0, which was dead-lettered") {
			t.Errorf("Drive: %v, want the consumer stopped over the offset", err)
		}
		if len(res.DeadLetters) != 1 {
			t.Errorf("dead letters %v, want the letter written", res.DeadLetters)
		}
		if got := rec.got(); len(got) != 0 {
			t.Errorf("retried: %v", got)
		}
	})
}

// notMigrated is a store whose table is missing.
type notMigrated struct{ *memstore.Store }

func (notMigrated) Check(context.Context) error {
	return fmt.Errorf("%w: relation \"idem_keys\" does not exist", dedup.ErrNotMigrated)
}
