package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/memstore"
)

// stepsStore is a memstore whose journal listing steps replaces.
type stepsStore struct {
	*memstore.Store
	steps func(ctx context.Context, f dedup.StepFilter) ([]dedup.StepRecord, error)
}

func (s stepsStore) Steps(ctx context.Context, f dedup.StepFilter) ([]dedup.StepRecord, error) {
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
		steps func(s *memstore.Store, calls int) ([]dedup.StepRecord, error)
		want  string // in the in_doubt letter's reason; "": skipped as stale
	}{
		{name: "Pending", state: dedup.StepPending,
			want: "provider step refund pending (provider key pk-e3): its effect may have happened and is not booked"},
		{name: "Unknown", state: dedup.StepUnknown, want: "provider step refund unknown (provider key pk-e3)"},
		{name: "Failed", state: dedup.StepFailed},
		{name: "None"},
		{name: "NoJournal", state: dedup.StepSucceeded, steps: func(*memstore.Store, int) ([]dedup.StepRecord, error) {
			return nil, fmt.Errorf("a store in a mode without a journal: %w", dedup.ErrNoJournal)
		}},
		{name: "Unreadable", state: dedup.StepFailed, steps: func(*memstore.Store, int) ([]dedup.StepRecord, error) {
			return nil, consumer.Permanent(errors.New("permission denied for table steps"))
		}, want: "provider steps could not be read (permanent: permission denied for table steps)"},
		{name: "FailsOnce", state: dedup.StepSucceeded, steps: func(s *memstore.Store, calls int) ([]dedup.StepRecord, error) {
			if calls == 1 {
				return nil, errors.New("connection reset")
			}
			return s.Steps(context.Background(), dedup.StepFilter{Scope: e3.Scope, Key: e3.ID, States: []dedup.StepState{dedup.StepSucceeded}})
		}, want: "provider step refund succeeded (provider key pk-e3): its effect happened and is not booked"},
	} {
		t.Run(c.name, func(t *testing.T) {
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
			var store dedup.Store[*memstore.Tx] = mem
			var calls atomic.Int32
			if c.steps != nil {
				store = stepsStore{Store: mem, steps: func(ctx context.Context, f dedup.StepFilter) ([]dedup.StepRecord, error) {
					if f.Scope != e3.Scope || f.Key != e3.ID || slices.Contains(f.States, dedup.StepFailed) || len(f.States) != 4 {
						t.Errorf("Steps(%+v), want e3's steps in every state but failed", f)
					}
					return c.steps(mem, int(calls.Add(1)))
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
