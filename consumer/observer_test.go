package consumer_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/consumer/source"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/memstore"
)

type ctxKey string

// recorder is an Observer that counts what it sees and checks the order of
// the calls per lane.
type recorder struct {
	t  *testing.T
	mu sync.Mutex

	consumed, acked, released, txs, committed, conflicts, retries int
	outcomes                                                      map[consumer.Outcome]int
	causes                                                        map[consumer.Cause]int
	open                                                          map[string]bool // lanes inside a batch
	ctxSeen                                                       int             // settlements whose ctx carried the batch's value
}

func newRecorder(t *testing.T) *recorder {
	return &recorder{t: t, outcomes: map[consumer.Outcome]int{}, causes: map[consumer.Cause]int{}, open: map[string]bool{}}
}

func (r *recorder) BatchStart(ctx context.Context, b consumer.Batch) context.Context {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.open[b.Lane] {
		r.t.Errorf("lane %s: BatchStart inside a batch", b.Lane)
	}
	r.open[b.Lane] = true
	r.consumed += len(b.Messages)
	for _, m := range b.Messages {
		if m.DeliveredAt.IsZero() {
			r.t.Errorf("%s: DeliveredAt not set", m.Coordinates())
		}
	}
	return context.WithValue(ctx, ctxKey("batch"), b.Lane)
}

func (r *recorder) TxStart(ctx context.Context, n int) context.Context {
	if ctx.Value(ctxKey("batch")) == nil {
		r.t.Error("TxStart without the batch's context")
	}
	return context.WithValue(ctx, ctxKey("tx"), n)
}

func (r *recorder) TxEnd(ctx context.Context, tx consumer.TxEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if ctx.Value(ctxKey("tx")) != tx.Messages {
		r.t.Error("TxEnd without TxStart's context")
	}
	if !tx.Start.After(time.Time{}) || tx.End.Before(tx.Start) {
		r.t.Errorf("transaction times out of order: %+v", tx)
	}
	r.txs++
	if tx.Err == nil {
		r.committed++
		if tx.CommitStart.IsZero() || tx.ClaimEnd.Before(tx.ClaimStart) || tx.CommitStart.Before(tx.ClaimEnd) {
			r.t.Errorf("committed transaction's times: %+v", tx)
		}
	}
	if tx.Class == dedup.ClassConflict {
		r.conflicts++
	}
}

func (r *recorder) Settled(ctx context.Context, s consumer.Settlement) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.outcomes[s.Outcome]++
	if s.Outcome == consumer.OutcomeDeadLettered {
		r.causes[s.Cause]++
	}
	if ctx.Value(ctxKey("batch")) == s.Message.Lane {
		r.ctxSeen++
	}
}

func (r *recorder) Retry(ctx context.Context, e consumer.RetryEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.retries++
}

func (r *recorder) BatchEnd(ctx context.Context, b consumer.Batch) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.open[b.Lane] || ctx.Value(ctxKey("batch")) != b.Lane {
		r.t.Errorf("lane %s: BatchEnd without BatchStart's context", b.Lane)
	}
	r.open[b.Lane] = false
	if len(b.Acked)+len(b.Released) != len(b.Messages) {
		r.t.Errorf("lane %s: %d acked + %d released of %d", b.Lane, len(b.Acked), len(b.Released), len(b.Messages))
	}
	r.acked += len(b.Acked)
	r.released += len(b.Released)
}

// TestObserverSeesWhatStatsCount runs duplicates, a permanent failure, bad
// input, a fingerprint mismatch and a conflict through the engine: the
// Observer's events add up to Stats, and each settlement sees its batch's
// context.
func TestObserverSeesWhatStatsCount(t *testing.T) {
	rec := newRecorder(t)
	var conflicted sync.Once
	cfg := baseConfig(func(ctx context.Context, tx *memstore.Tx, m *consumer.Message) error {
		if ctx.Value(ctxKey("tx")) == nil {
			t.Error("the handler does not run under TxStart's context")
		}
		id, _ := consumer.ByJSONField("txn_id")(m)
		var err error
		switch id {
		case "T00003":
			err = consumer.Permanent(errors.New("account closed"))
		case "T00005":
			conflicted.Do(func() { err = dedup.ErrInFlight })
		}
		return err
	})
	cfg.Observer = rec
	var msgs []*consumer.Message
	for i := range 40 {
		msgs = append(msgs, consumertest.Message("pay", int32(i%2), int64(i), "", payment(i%30)))
	}
	msgs = append(msgs,
		consumertest.Message("pay", 0, 40, "", `{"amount":1}`),                   // no key
		consumertest.Message("pay", 1, 41, "", `{"txn_id":"T00007","amount":9}`), // another payload
	)
	res := consumertest.Run(t, cfg, consumertest.Script{MinDeliveries: 1, MaxDeliveries: 2, CrashAfterCommitEvery: 7}, msgs...)
	s := res.Stats

	rec.mu.Lock()
	defer rec.mu.Unlock()
	if int64(rec.consumed) != s.Delivered || int64(rec.acked+rec.released) != s.Delivered {
		t.Errorf("consumed %d, acked %d + released %d; Stats.Delivered %d", rec.consumed, rec.acked, rec.released, s.Delivered)
	}
	if int64(rec.outcomes[consumer.OutcomeApplied]) != s.Applied || int64(rec.outcomes[consumer.OutcomeDuplicate]) != s.Duplicates ||
		int64(rec.outcomes[consumer.OutcomeDeadLettered]) != s.DeadLettered {
		t.Errorf("outcomes %v, Stats %+v", rec.outcomes, s)
	}
	if int64(rec.committed) != s.Commits || int64(rec.retries) != s.Retries {
		t.Errorf("committed %d, retries %d; Stats %+v", rec.committed, rec.retries, s)
	}
	if rec.conflicts == 0 || rec.txs <= rec.committed {
		t.Errorf("the conflict was not seen: %d conflicts, %d transactions, %d committed", rec.conflicts, rec.txs, rec.committed)
	}
	if rec.causes[consumer.CausePermanent] != 1 || rec.causes[consumer.CauseBadInput] == 0 || rec.causes[consumer.CauseMismatch] == 0 {
		t.Errorf("dead-letter causes: %v", rec.causes)
	}
	if settled := rec.outcomes[consumer.OutcomeApplied] + rec.outcomes[consumer.OutcomeDuplicate] + rec.outcomes[consumer.OutcomeDeadLettered]; rec.ctxSeen != settled {
		t.Errorf("%d of %d settlements saw their batch's context", rec.ctxSeen, settled)
	}
	if s.Applied != 29 { // 30 payments, T00003 failed
		t.Errorf("applied %d, want 29", s.Applied)
	}
}

func TestHealth(t *testing.T) {
	src := consumertest.NewSource(consumertest.Script{})
	store := memstore.New(memstore.Config{})
	c, err := consumer.New(consumer.Config[*memstore.Tx]{
		Name: "health", Source: src, Store: store, DeadLetter: &consumertest.DeadLetters{},
		Handler: consumer.HandlerFunc[*memstore.Tx](func(context.Context, *memstore.Tx, *consumer.Message) error { return nil }),
		Key:     consumer.ByMessageID(), Logger: quiet,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if h := c.Health(ctx); h.Ready() == nil || h.Running {
		t.Errorf("not started, but ready: %+v", h)
	}
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	src.Push(consumertest.Message("t", 0, 0, "", "a"), consumertest.Message("t", 1, 0, "", "b"))
	waitCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := src.WaitIdle(waitCtx); err != nil {
		t.Fatal(err)
	}
	h := c.Health(ctx)
	if err := h.Ready(); err != nil {
		t.Errorf("ready: %v (%+v)", err, h)
	}
	if err := h.Live(time.Minute); err != nil || h.InFlight != 0 || h.LastProgress.IsZero() {
		t.Errorf("live: %v (%+v)", err, h)
	}
	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if h := c.Health(ctx); h.Running || h.Ready() == nil {
		t.Errorf("stopped, but running: %+v", h)
	}
}

// TestStalledLanes: a lane the source reports is stalled when messages of it
// wait with none settled, or when nothing waits and it is not fetched from;
// Live fails for it unless the store is away.
func TestStalledLanes(t *testing.T) {
	now := time.Now()
	h := consumer.Health{Running: true, Lanes: []source.LaneStatus{
		{Lane: "t/0", LastFetch: now, Waiting: 0, LastSettled: now.Add(-time.Hour)},                       // idle, fetched
		{Lane: "t/1", LastFetch: now.Add(-time.Hour), Waiting: 3, LastSettled: now.Add(-time.Second)},     // busy, buffer full
		{Lane: "t/2", LastFetch: now, Waiting: 3, LastSettled: now.Add(-2 * time.Minute)},                 // held
		{Lane: "t/3", LastFetch: now.Add(-2 * time.Minute), Waiting: 0, LastSettled: now.Add(-time.Hour)}, // not fetched
	}}
	got := h.StalledLanes(now, time.Minute)
	if len(got) != 2 || !strings.HasPrefix(got[0], "t/2: 3 messages waiting") || !strings.HasPrefix(got[1], "t/3: not fetched from") {
		t.Fatalf("stalled %q, want t/2 (held) and t/3 (not fetched)", got)
	}
	if err := h.Live(time.Minute); err == nil || !strings.Contains(err.Error(), "lanes stalled: t/2") {
		t.Errorf("Live: %v, want the stalled lanes", err)
	}
	h.Store = errors.New("connection refused")
	if err := h.Live(time.Minute); err != nil {
		t.Errorf("Live with the store away: %v, want nil (Ready's business)", err)
	}
}

// TestStalledLaneHeldElsewhere: a lane the source reports without holding
// it (a queue no process of the group consumes) is stalled in StalledLanes,
// and so on /healthz and the gauge, but does not fail Live: a restart of
// this process is not what it needs.
func TestStalledLaneHeldElsewhere(t *testing.T) {
	now := time.Now()
	h := consumer.Health{Running: true, Lanes: []source.LaneStatus{
		{Lane: "t/0", LastFetch: now, LastSettled: now},
		{Lane: "t/1", Waiting: 3, LastSettled: now.Add(-2 * time.Minute), Elsewhere: true},
	}}
	got := h.StalledLanes(now, time.Minute)
	if len(got) != 1 || !strings.HasPrefix(got[0], "t/1: 3 messages waiting") || !strings.Contains(got[0], "no process here holds it") {
		t.Fatalf("stalled %q, want t/1, held by no process here", got)
	}
	if err := h.Live(time.Minute); err != nil {
		t.Errorf("Live: %v, want nil", err)
	}
	h.Lanes[1].Elsewhere = false
	if err := h.Live(time.Minute); err == nil {
		t.Error("Live: nil for a stalled lane of its own, want an error")
	}
}
