package pgstore_test

import (
	"context"
	"encoding/json"
	"errors"
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

// TestEntityEffectStaleInDoubtLetterSurvivesACrash: as in
// TestEntityEffectStepOfAnEventThatEndsStale, refund r3 called the provider
// (its step succeeded), then ended stale behind r5. The dead-letter sink
// fails, and the process dies before it takes r3's in_doubt letter. r3
// comes back (its offset was never acknowledged): the in_doubt letter must
// still be written, or nothing says the refund happened and is not booked.
// (When the letter was decided after the commit, r3's key was done and the
// redelivery a silent duplicate.)
func TestEntityEffectStaleInDoubtLetterSurvivesACrash(t *testing.T) {
	_, _, st, _ := effectsRig(t, pgstore.Config{})
	ctx := context.Background()
	var calls atomic.Int64
	step := effect.Step{Name: "refund", Call: func(ctx context.Context, c effect.Call) ([]byte, error) {
		calls.Add(1)
		return []byte("ok"), nil
	}}
	type refund struct {
		ID, Trade string
		Seq       int64
	}
	called := make(chan struct{})
	var first atomic.Bool
	h := func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		var r refund
		if err := json.Unmarshal(m.Value, &r); err != nil {
			return consumer.Permanent(err)
		}
		if r.ID == "gate" {
			select {
			case <-called:
			case <-ctx.Done():
				return ctx.Err()
			}
			return nil
		}
		if _, err := effect.Do(ctx, st, m, step); err != nil {
			return err
		}
		if r.ID == "r3" && !first.Swap(true) {
			close(called)
			return consumer.Retryable(errors.New("ledger write timed out"))
		}
		return nil
	}
	marked := func() bool {
		v, ok, err := st.Watermark(ctx, "refunds", "T1")
		return err == nil && ok && v.Major == 5
	}
	cfg := func() consumer.Config[pgx.Tx] {
		return consumer.Config[pgx.Tx]{
			Name: "refunds", Store: st, Logger: quiet, BatchSize: 1,
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
		}
	}
	r3 := func() *consumer.Message {
		return consumertest.Message("refunds", 0, 0, "", `{"ID":"r3","Trade":"T1","Seq":3}`)
	}

	// The first process: the sink refuses r3's letter until the process dies.
	sinkTried := make(chan struct{})
	var tried atomic.Bool
	c1 := cfg()
	src := consumertest.NewSource(consumertest.Script{})
	c1.Source = src
	c1.DeadLetter = consumer.DeadLetterFunc(func(ctx context.Context, l consumer.Letter) error {
		if !tried.Swap(true) {
			close(sinkTried)
		}
		return errors.New("dead-letter topic unavailable")
	})
	c, err := consumer.New(c1)
	if err != nil {
		t.Fatal(err)
	}
	src.Push(r3(),
		consumertest.Message("refunds", 1, 0, "", `{"ID":"gate"}`),
		consumertest.Message("refunds", 1, 1, "", `{"ID":"r5","Trade":"T1","Seq":5}`))
	runCtx, crash := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	select {
	case <-sinkTried:
	case <-time.After(time.Minute):
		t.Fatal("r3 was never dead-lettered: the race this test stages did not happen")
	}
	crash()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("Run did not return after its context ended")
	}
	stale, err := st.StaleEvents(ctx, dedup.StaleFilter{Scope: "refunds"})
	if err != nil {
		t.Fatal(err)
	}
	if len(stale) != 0 || calls.Load() != 2 {
		t.Fatalf("stale records %+v, provider calls %d: want r3 refused in doubt before any commit (no record, its key free), r3 and r5 refunded", stale, calls.Load())
	}

	// The next process: r3 comes back.
	res := consumertest.Run(t, cfg(), consumertest.Script{}, r3())
	t.Log(res)
	var letters []consumer.Letter
	for _, l := range res.DeadLetters {
		if l.Key.ID == "r3" && l.Cause == consumer.CauseInDoubt {
			letters = append(letters, l)
		}
	}
	if len(letters) != 1 {
		t.Fatalf("r3 redelivered after a crash before its in_doubt letter: %s, letters %v; want one in_doubt (the provider refunded it and nothing books it)",
			res, res.DeadLetters)
	}
}
