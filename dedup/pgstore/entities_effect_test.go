package pgstore_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/pgstore"
	"github.com/idemkit/idem/effect"
)

// waitClock is a clock whose Sleep returns once until says so (or 10 s).
type waitClock struct {
	consumertest.Clock
	until func() bool
}

func (c *waitClock) Sleep(ctx context.Context, d time.Duration) error {
	deadline := time.Now().Add(10 * time.Second)
	for !c.until() && time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
	return nil
}

// TestEntityEffectStepOfAnEventThatEndsStale: refund r3 (trade T1, seq 3)
// calls the provider in its first attempt, then fails transiently; while
// it waits to retry, refund r5 (seq 5) of the same trade commits on
// another partition. The retry finds r3 stale: never applied. When the
// provider refunded it (the step succeeded), the refund happened and
// nothing books it: r3 is dead-lettered in doubt, whatever Config.Stale
// says, its reason naming the entity, both versions and the step. When the
// provider refused it (the step failed), nothing happened: r3 is skipped
// as stale. Either way its stale record stays and r5 applies.
func TestEntityEffectStepOfAnEventThatEndsStale(t *testing.T) {
	for _, c := range []struct {
		name   string
		refuse bool
		stale  consumer.StalePolicy
	}{
		{"Succeeded", false, consumer.StaleSkip},
		{"SucceededStaleDeadLetter", false, consumer.StaleDeadLetter},
		{"Failed", true, consumer.StaleSkip},
	} {
		t.Run(c.name, func(t *testing.T) {
			entityEffectStale(t, c.refuse, c.stale)
		})
	}
}

func entityEffectStale(t *testing.T, refuse bool, policy consumer.StalePolicy) {
	_, _, st, _ := effectsRig(t, pgstore.Config{})
	ctx := context.Background()
	var calls sync.Map // provider key -> calls
	called := make(chan struct{})
	var once sync.Once
	step := effect.Step{Name: "refund", Call: func(ctx context.Context, c effect.Call) ([]byte, error) {
		n, _ := calls.LoadOrStore(c.ProviderKey, new(atomic.Int64))
		n.(*atomic.Int64).Add(1)
		if refuse {
			return nil, effect.Refused(errors.New("card closed"), []byte("refused"))
		}
		return []byte("ok"), nil
	}}
	type refund struct {
		ID, Trade string
		Seq       int64
	}
	var first atomic.Bool
	h := func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		var r refund
		if err := json.Unmarshal(m.Value, &r); err != nil {
			return consumer.Permanent(err)
		}
		if r.ID == "gate" { // holds partition 1 until r3 called the provider
			select {
			case <-called:
			case <-ctx.Done():
				return ctx.Err()
			}
			return nil
		}
		if _, err := effect.Do(ctx, st, m, step); err != nil && !errors.Is(err, effect.ErrRefused) {
			return err
		}
		if r.ID == "r3" && !first.Swap(true) {
			once.Do(func() { close(called) })
			return consumer.Retryable(errors.New("ledger write timed out"))
		}
		return nil
	}
	marked := func() bool {
		v, ok, err := st.Watermark(ctx, "refunds", "T1")
		return err == nil && ok && v.Major == 5
	}
	res := consumertest.Run(t, consumer.Config[pgx.Tx]{
		Name: "refunds", Store: st, Logger: quiet, BatchSize: 1, Stale: policy,
		Key: consumer.ByJSONField("ID"),
		Entity: func(m *consumer.Message) (consumer.Entity, error) {
			var r refund
			err := json.Unmarshal(m.Value, &r)
			if r.Trade == "" {
				return consumer.Entity{}, err
			}
			return consumer.Entity{Name: r.Trade, Version: dedup.Version{Major: r.Seq}}, err
		},
		Handler: consumer.HandlerFunc[pgx.Tx](h),
		Clock:   &waitClock{Clock: *consumertest.NewClock(), until: marked},
	}, consumertest.Script{},
		consumertest.Message("refunds", 0, 0, "", `{"ID":"r3","Trade":"T1","Seq":3}`),
		consumertest.Message("refunds", 1, 0, "", `{"ID":"gate"}`),
		consumertest.Message("refunds", 1, 1, "", `{"ID":"r5","Trade":"T1","Seq":5}`))
	t.Log(res)
	stale, err := st.StaleEvents(ctx, dedup.StaleFilter{Scope: "refunds"})
	if err != nil {
		t.Fatal(err)
	}
	if res.Stats.Applied != 2 {
		t.Fatalf("applied %d, want the gate and r5", res.Stats.Applied)
	}
	r3 := dedup.Key{Scope: "refunds", ID: "r3"}
	pk := effect.DefaultProviderKey(r3, "refund")
	n, ok := calls.Load(pk)
	if !ok || n.(*atomic.Int64).Load() != 1 {
		t.Fatalf("the provider was not called once for r3: the first attempt must have called it")
	}
	var letters []consumer.Letter
	for _, l := range res.DeadLetters {
		if l.Key.ID == "r3" {
			letters = append(letters, l)
		}
	}
	if refuse {
		// An ordinary stale event: recorded with the commit.
		if len(stale) != 1 || stale[0].Key != r3 {
			t.Fatalf("stale records %+v, want r3's alone (r5 committed first): the race this test stages did not happen", stale)
		}
		// Nothing happened at the provider: an ordinary stale event.
		want := 0
		if policy == consumer.StaleDeadLetter {
			want = 1
		}
		if len(letters) != want || want == 1 && letters[0].Cause != consumer.CauseStale {
			t.Fatalf("refused refund r3 ended stale with letters %v, want %d of cause stale", letters, want)
		}
		return
	}
	// Refused in doubt before the commit: the attempt rolled back, its
	// stale record with it, and the key stays free — the letter is the
	// record, written before the offset moves.
	if len(letters) != 1 || letters[0].Cause != consumer.CauseInDoubt {
		t.Fatalf("refund r3 ended stale (stale records %+v), and the provider was called %d times for it; letters %v, want one in_doubt",
			stale, n.(*atomic.Int64).Load(), letters)
	}
	if len(stale) != 0 {
		t.Errorf("stale records %+v: want none, the in_doubt refusal rolled its attempt back", stale)
	}
	l := letters[0]
	reason := l.Reason.Error()
	for _, want := range []string{`entity "T1"`, "version 3.0 at or below watermark 5.0", "provider step refund succeeded (provider key " + pk + ")", "not booked"} {
		if !strings.Contains(reason, want) {
			t.Errorf("letter reason %q: want it to say %q", reason, want)
		}
	}
	if !consumer.IsInDoubt(l.Reason) || !errors.Is(l.Reason, consumer.ErrStale) || l.Entity.Name != "T1" {
		t.Errorf("letter %+v: want IsInDoubt and ErrStale, entity T1", l)
	}
	if res.Stats.Stale != 0 || res.Stats.DeadLettered != 1 {
		t.Errorf("stats %+v: want r3 dead-lettered, not counted as skipped", res.Stats)
	}
}
