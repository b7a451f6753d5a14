package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
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

// stepsStore is a memstore whose journal's reads steps replaces: LiveSteps,
// in the attempt's transaction.
type stepsStore struct {
	*memstore.Store
	t     *testing.T
	steps func(ctx context.Context, keys []dedup.Key, read func() ([]dedup.StepRecord, error)) ([]dedup.StepRecord, error)
}

// Steps fails the test, and answers: with LiveSteps, the consumer reads
// no steps outside its transaction.
func (s stepsStore) Steps(ctx context.Context, f dedup.StepFilter) ([]dedup.StepRecord, error) {
	s.t.Errorf("Steps(%+v): the consumer read steps outside its transaction", f)
	return s.Store.Steps(ctx, f)
}

func (s stepsStore) LiveSteps(ctx context.Context, tx *memstore.Tx, keys []dedup.Key) ([]dedup.StepRecord, error) {
	return s.steps(ctx, keys, func() ([]dedup.StepRecord, error) { return s.Store.LiveSteps(ctx, tx, keys) })
}

// journalStore is what a store with a journal that is no dedup.TxSteps
// offers the consumer.
type journalStore interface {
	dedup.Store[*memstore.Tx]
	dedup.Watermarks[*memstore.Tx]
	dedup.Journal
}

// apartStore is a memstore seen as a store whose journal reads only in
// transactions of its own (a journal that is no dedup.TxSteps), its Steps
// replaced.
type apartStore struct {
	journalStore
	steps func(ctx context.Context, f dedup.StepFilter) ([]dedup.StepRecord, error)
}

func (s apartStore) Steps(ctx context.Context, f dedup.StepFilter) ([]dedup.StepRecord, error) {
	return s.steps(ctx, f)
}

// TestEntityStaleEventWithProviderSteps: a stale event whose key has a
// step in the journal that is not failed (an earlier attempt called a
// provider) is dead-lettered in doubt, its reason naming the step; one
// whose steps all failed, or whose store keeps no journal, is skipped as
// stale; a journal that fails for a moment is asked again, and one that
// cannot be read dead-letters the event in doubt rather than skip it.
func TestEntityStaleEventWithProviderSteps(t *testing.T) {
	e3 := dedup.Key{Scope: "refunds", ID: "e3"}
	for _, c := range []struct {
		name  string
		state dedup.StepState // of e3's step "refund"; 0: none
		steps func(read func() ([]dedup.StepRecord, error), calls int) ([]dedup.StepRecord, error)
		want  string // in the in_doubt letter's reason; "": skipped as stale
	}{
		{name: "Pending", state: dedup.StepPending,
			want: "provider step refund pending (provider key pk-e3): its effect may have happened and is not booked"},
		{name: "Unknown", state: dedup.StepUnknown, want: "provider step refund unknown (provider key pk-e3)"},
		{name: "Failed", state: dedup.StepFailed},
		{name: "None"},
		{name: "NoJournal", state: dedup.StepSucceeded, steps: func(func() ([]dedup.StepRecord, error), int) ([]dedup.StepRecord, error) {
			return nil, fmt.Errorf("a store in a mode without a journal: %w", dedup.ErrNoJournal)
		}},
		{name: "Unreadable", state: dedup.StepFailed, steps: func(func() ([]dedup.StepRecord, error), int) ([]dedup.StepRecord, error) {
			return nil, consumer.Permanent(errors.New("permission denied for table steps"))
		}, want: "provider steps could not be read (permanent: permission denied for table steps)"},
		{name: "FailsOnce", state: dedup.StepSucceeded, steps: func(read func() ([]dedup.StepRecord, error), calls int) ([]dedup.StepRecord, error) {
			if calls == 1 {
				return nil, errors.New("connection reset")
			}
			return read()
		}, want: "provider step refund succeeded (provider key pk-e3): its effect happened and is not booked"},
	} {
		for _, inTx := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/inTx=%t", c.name, inTx), func(t *testing.T) {
				ctx := context.Background()
				mem := memstore.New(memstore.Config{})
				if c.state != 0 {
					ref := dedup.StepRef{Key: e3, Step: "refund"}
					rec, err := mem.BeginStep(ctx, ref, "pk-e3", dedup.Fingerprint{}, time.Hour)
					if err != nil {
						t.Fatal(err)
					}
					if c.state != dedup.StepPending {
						if err := mem.FinishStep(ctx, ref, rec.Token, dedup.StepOutcome{State: c.state}); err != nil {
							t.Fatal(err)
						}
					}
				}
				var calls atomic.Int32
				answer := func(read func() ([]dedup.StepRecord, error)) ([]dedup.StepRecord, error) {
					n := int(calls.Add(1))
					if c.steps == nil {
						return read()
					}
					return c.steps(read, n)
				}
				var store dedup.Store[*memstore.Tx] = stepsStore{Store: mem, t: t, steps: func(ctx context.Context, keys []dedup.Key, read func() ([]dedup.StepRecord, error)) ([]dedup.StepRecord, error) {
					if !slices.Equal(keys, []dedup.Key{e3}) {
						t.Errorf("LiveSteps(%v), want e3's steps", keys)
					}
					return answer(read)
				}}
				if !inTx {
					store = apartStore{journalStore: mem, steps: func(ctx context.Context, f dedup.StepFilter) ([]dedup.StepRecord, error) {
						if f.Scope != e3.Scope || f.Key != e3.ID || slices.Contains(f.States, dedup.StepFailed) || len(f.States) != 4 {
							t.Errorf("Steps(%+v), want e3's steps in every state but failed", f)
						}
						return answer(func() ([]dedup.StepRecord, error) { return mem.Steps(ctx, f) })
					}}
				}
				log := newTradeLog()
				res := consumertest.Run(t, consumer.Config[*memstore.Tx]{
					Name: "refunds", Store: store, Logger: quiet, BatchSize: 1,
					Key: consumer.ByJSONField("event"), Entity: byTrade, Handler: consumer.HandlerFunc[*memstore.Tx](log.handle),
				}, consumertest.Script{},
					consumertest.Message("refunds", 0, 0, "", tradeEvent("e5", "T", 5)),
					consumertest.Message("refunds", 0, 1, "", tradeEvent("e3", "T", 3)))
				if res.Stats.Applied != 1 || log.calls["e3"] != 0 {
					t.Fatalf("%v, e3 handled %d times: want e5 applied, e3 stale", res, log.calls["e3"])
				}
				if c.name == "FailsOnce" && calls.Load() != 2 {
					t.Errorf("Steps called %d times, want 2: once failing, once answering", calls.Load())
				}
				if c.want == "" {
					if res.Stats.Stale != 1 || len(res.DeadLetters) != 0 {
						t.Fatalf("%v, letters %v: want e3 skipped as stale", res, res.DeadLetters)
					}
					return
				}
				if len(res.DeadLetters) != 1 || res.Stats.Stale != 0 {
					t.Fatalf("%v, letters %v: want e3 dead-lettered in doubt", res, res.DeadLetters)
				}
				l := res.DeadLetters[0]
				reason := l.Reason.Error()
				if l.Key != e3 || l.Cause != consumer.CauseInDoubt || !consumer.IsInDoubt(l.Reason) || !errors.Is(l.Reason, consumer.ErrStale) ||
					!strings.Contains(reason, `stale event of entity "T" (version 3.0 at or below watermark 5.0)`) ||
					!strings.Contains(reason, c.want) {
					t.Fatalf("letter of %s, cause %s: %q; want in_doubt, saying %q", l.Key, l.Cause, reason, c.want)
				}
				// Refused before the commit: its attempt rolled back, the stale
				// record with it; the letter is the record.
				stale, err := mem.StaleEvents(ctx, dedup.StaleFilter{Scope: "refunds"})
				if err != nil || len(stale) != 0 {
					t.Fatalf("stale records %+v, %v: want none, the refusal rolled its attempt back", stale, err)
				}
			})
		}
	}
}

// TestEntityStaleStepsOneReadPerBatch: the steps of a batch's stale events
// are read in one LiveSteps call in the batch's transaction, never with
// Steps on a connection of their own (one for each event, which stalled
// the lanes of a store whose pool had as many connections as lanes): a
// batch of three stale events is one call naming the three; with one of
// them refused in doubt, each later attempt of the batch's messages is a
// call of its own.
func TestEntityStaleStepsOneReadPerBatch(t *testing.T) {
	for _, c := range []struct {
		name    string
		step    bool // f2 has a succeeded step
		applied int
		calls   [][]string // the stale keys of each LiveSteps call
	}{
		{name: "NoSteps", calls: [][]string{{"e3", "f2", "g1"}}},
		// f2 refused, the messages before it and those after it are
		// attempted apart: a call for each of those attempts.
		{name: "OneInDoubt", step: true, calls: [][]string{{"e3", "f2", "g1"}, {"e3"}, {"g1"}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			mem := memstore.New(memstore.Config{})
			if c.step {
				ref := dedup.StepRef{Key: dedup.Key{Scope: "refunds", ID: "f2"}, Step: "refund"}
				rec, err := mem.BeginStep(ctx, ref, "pk-f2", dedup.Fingerprint{}, time.Hour)
				if err != nil {
					t.Fatal(err)
				}
				if err := mem.FinishStep(ctx, ref, rec.Token, dedup.StepOutcome{State: dedup.StepSucceeded}); err != nil {
					t.Fatal(err)
				}
			}
			var mu sync.Mutex
			var calls [][]string
			store := stepsStore{Store: mem, t: t, steps: func(ctx context.Context, keys []dedup.Key, read func() ([]dedup.StepRecord, error)) ([]dedup.StepRecord, error) {
				ids := make([]string, len(keys))
				for i, k := range keys {
					ids[i] = k.ID
				}
				mu.Lock()
				calls = append(calls, ids)
				mu.Unlock()
				return read()
			}}
			log := newTradeLog()
			msgs := []string{tradeEvent("e5", "T", 5), tradeEvent("e3", "T", 3), tradeEvent("f5", "U", 5),
				tradeEvent("f2", "U", 2), tradeEvent("g9", "V", 9), tradeEvent("g1", "V", 1)}
			var script []*consumer.Message
			for i, m := range msgs {
				script = append(script, consumertest.Message("refunds", 0, int64(i), "", m))
			}
			res := consumertest.Run(t, consumer.Config[*memstore.Tx]{
				Name: "refunds", Store: store, Logger: quiet, BatchSize: len(msgs), BatchWait: time.Minute,
				Key: consumer.ByJSONField("event"), Entity: byTrade, Handler: consumer.HandlerFunc[*memstore.Tx](log.handle),
			}, consumertest.Script{}, script...)
			stale, letters := 3, 0
			if c.step {
				stale, letters = 2, 1
			}
			if res.Stats.Applied != 3 || res.Stats.Stale != int64(stale) || len(res.DeadLetters) != letters {
				t.Fatalf("%v: want e5, f5, g9 applied, %d stale, %d dead-lettered in doubt", res, stale, letters)
			}
			mu.Lock()
			defer mu.Unlock()
			if !slices.EqualFunc(calls, c.calls, slices.Equal[[]string]) {
				t.Fatalf("LiveSteps calls %v, want %v: one for each attempt", calls, c.calls)
			}
		})
	}
}
