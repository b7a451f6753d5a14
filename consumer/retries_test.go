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
	"github.com/idemkit/idem/consumer/source"
	"github.com/idemkit/idem/consumer/wire"
	"github.com/idemkit/idem/dedup/memstore"
)

// retrySource is a consumertest.Source that reads retry copies: whatever
// retrySink writes comes back on topic "pay.retry", delivered once it is
// due (wire.RetryDue), as the Kafka source does — here the whole
// source waits, which a fake may.
type retrySource struct {
	*consumertest.Source
	lineage bool // honour the copies' lineage (source.Description.RetryOf)
}

func (s *retrySource) Run(ctx context.Context, deliver source.DeliverFunc) error {
	return s.Source.Run(ctx, func(ctx context.Context, m *consumer.Message) error {
		if due, ok := wire.RetryDue(m); ok && m.Topic == "pay.retry" {
			t := time.NewTimer(min(time.Until(due), 20*time.Second))
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			}
		}
		return deliver(ctx, m)
	})
}

func (s *retrySource) Describe() source.Description {
	d := s.Source.Describe()
	d.RetryOf = func(topic string) (string, bool) {
		if s.lineage && topic == "pay.retry" {
			return "pay", true
		}
		return "", false
	}
	return d
}

// retrySink writes retry copies back to its source, as a broker would:
// a new offset and time on the retry topic, the headers of the copy's
// record.
type retrySink struct {
	src     *retrySource
	mu      sync.Mutex
	offset  int64
	letters []consumer.RetryLetter
	edit    func([]consumer.Header) []consumer.Header // when set, rewrites a copy's headers
}

func (s *retrySink) Retry(_ context.Context, r consumer.RetryLetter) error {
	headers, value := wire.Letter(r.Letter).RetryRecord(r.Retry)
	s.mu.Lock()
	s.letters = append(s.letters, r)
	m := consumertest.Message("pay.retry", 0, s.offset, "", string(value))
	m.Time = time.Now() // the broker's time of the copy's record
	s.offset++
	s.mu.Unlock()
	if s.edit != nil {
		headers = s.edit(headers)
	}
	m.Headers = headers
	s.src.Push(m)
	return nil
}

func (s *retrySink) trips() []consumer.RetryLetter {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]consumer.RetryLetter(nil), s.letters...)
}

// drive runs c over src until every message is settled.
func drive(t *testing.T, c *consumer.Consumer[*memstore.Tx], src *consumertest.Source) {
	t.Helper()
	ran := make(chan error, 1)
	go func() { ran <- c.Run(context.Background()) }()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	idleErr := src.WaitIdle(ctx)
	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-ran; err != nil {
		t.Fatal(err)
	}
	if idleErr != nil {
		t.Fatalf("not settled: %v", idleErr)
	}
}

// nonBlockingEngine: set false to watch TestNonBlockingRetryLetsTheLaneGoOn
// fail in the default mode.
var nonBlockingEngine = true

// Two of forty payments of one partition (5%) fail until every other
// payment is applied: with NonBlocking they go to retry and the lane goes
// on; in the default (Blocking) mode the lane would wait for them, they
// would use up their retries and be dead-lettered, and the payments behind
// them would wait.
func TestNonBlockingRetryLetsTheLaneGoOn(t *testing.T) {
	const n = 40
	failing := map[string]bool{"T00003": true, "T00020": true}
	eff := newEffects()
	var good atomic.Int64
	var mu sync.Mutex
	goodBefore := map[string]int64{} // the good payments applied before a failing one was
	cfg := baseConfig(func(ctx context.Context, tx *memstore.Tx, m *consumer.Message) error {
		id, _ := consumer.ByJSONField("txn_id")(m)
		if failing[id] {
			if g := good.Load(); g < n-int64(len(failing)) {
				return consumer.Retryable(fmt.Errorf("%s: the account service is down (%d good applied)", id, g))
			}
			tx.OnCommit(func() {
				mu.Lock()
				goodBefore[id] = good.Load()
				mu.Unlock()
			})
		} else {
			tx.OnCommit(func() { good.Add(1) })
		}
		eff.add(tx, id)
		return nil
	})
	base := consumertest.NewSource(consumertest.Script{})
	src := &retrySource{Source: base, lineage: true}
	sink := &retrySink{src: src}
	dl := &consumertest.DeadLetters{}
	cfg.Source, cfg.DeadLetter, cfg.Clock = src, dl, consumertest.NewClock()
	cfg.BatchSize = 8
	if nonBlockingEngine {
		cfg.Retries = consumer.NonBlocking{Attempts: 2, Delays: []time.Duration{20 * time.Millisecond, 200 * time.Millisecond, 2 * time.Second, 10 * time.Second}, Sink: sink}
	}
	c, err := consumer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	base.Push(payments(n)...)
	drive(t, c, base)

	eff.check(t, txnIDs(n)) // every payment once: the failing ones too, in the end
	for id := range failing {
		if goodBefore[id] != n-int64(len(failing)) {
			t.Errorf("%s applied after %d good payments, want all %d: the lane waited for it", id, goodBefore[id], n-len(failing))
		}
	}
	if l := dl.Letters(); len(l) != 0 {
		t.Errorf("%d dead letters, want none: %v", len(l), l[0].Reason)
	}
	trips := sink.trips()
	if len(trips) < len(failing) {
		t.Fatalf("%d trips to retry, want at least %d", len(trips), len(failing))
	}
	for _, r := range trips {
		if k, _ := r.Message.DedupKey(); r.Key != k {
			t.Errorf("trip %d of %s under key %q", r.Attempt, r.Message.Ref(), r.Key.ID)
		}
		if r.Attempt < 1 || r.Attempt > 4 || r.Due.Sub(r.FirstFailure) < r.Delay-time.Millisecond || !failing[r.Key.ID] {
			t.Errorf("trip %+v", r)
		}
	}
	if got := c.Stats().RetriedLater; got != int64(len(trips)) {
		t.Errorf("Stats.RetriedLater %d, want %d", got, len(trips))
	}
}

// A payment whose handler's effects committed while a failure was reported
// (an unknown COMMIT outcome) goes to retry; its copy comes back under the
// original's key — its message ID with ByMessageID, read from the lineage —
// and is skipped: applied once, never twice.
func TestNonBlockingRetryOfAnAppliedMessageIsSkipped(t *testing.T) {
	for _, lineage := range []bool{true, false} {
		t.Run(fmt.Sprintf("lineage=%v", lineage), func(t *testing.T) {
			eff := newEffects()
			store := &lyingStore{Store: memstore.New(memstore.Config{})}
			cfg := baseConfig(func(ctx context.Context, tx *memstore.Tx, m *consumer.Message) error {
				if m.Offset == 2 && m.Topic == "pay" {
					store.target.Store(true)
				}
				return eff.apply(ctx, tx, m)
			})
			cfg.Key = consumer.ByMessageID()
			base := consumertest.NewSource(consumertest.Script{})
			src := &retrySource{Source: base, lineage: lineage}
			sink := &retrySink{src: src}
			dl := &consumertest.DeadLetters{}
			cfg.Store, cfg.Source, cfg.DeadLetter, cfg.Clock = store, src, dl, consumertest.NewClock()
			cfg.BatchSize = 1
			cfg.Retries = consumer.NonBlocking{Attempts: 1, Delays: []time.Duration{time.Second}, Sink: sink}
			c, err := consumer.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			base.Push(payments(5)...)
			drive(t, c, base)
			if !lineage {
				// The copy keyed as a message of its own: the harness sees
				// the double effect the lineage prevents.
				if got := eff.count("T00002"); got != 2 {
					t.Errorf("without lineage T00002 applied %d times, want 2", got)
				}
				return
			}
			eff.check(t, txnIDs(5))
			if trips := sink.trips(); len(trips) != 1 || trips[0].Key.ID != "pay/0/2" {
				t.Errorf("trips %+v, want one, of pay/0/2", trips)
			}
			if s := c.Stats(); s.Duplicates != 1 {
				t.Errorf("%d duplicates, want 1 (the copy)", s.Duplicates)
			}
		})
	}
}

// lyingStore commits the first transaction that ran the handler of
// payment pay/0/2 and reports a transient failure anyway.
type lyingStore struct {
	*memstore.Store
	target atomic.Bool // the handler of pay/0/2 ran in the transaction
	lied   atomic.Bool
}

func (s *lyingStore) InTx(ctx context.Context, fn func(ctx context.Context, tx *memstore.Tx) error) error {
	s.target.Store(false)
	err := s.Store.InTx(ctx, fn)
	if err == nil && s.target.Load() && s.lied.CompareAndSwap(false, true) {
		return consumer.Retryable(errors.New("connection reset during COMMIT"))
	}
	return err
}

func TestNonBlockingConfig(t *testing.T) {
	cfg := baseConfig(newEffects().apply)
	cfg.Source, cfg.DeadLetter = consumertest.NewSource(consumertest.Script{}), &consumertest.DeadLetters{}
	cfg.Retries = consumer.NonBlocking{Delays: []time.Duration{0}}
	cfg.OnExhausted = consumer.StopLaneOnExhausted
	_, err := consumer.New(cfg)
	for _, want := range []string{"Retries.Sink is nil", "Retries.Delays[0] is 0s", "StopLaneOnExhausted"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("New: %v, want %q", err, want)
		}
	}
}

// A payment that fails for good goes on every trip, then is dead-lettered
// (CauseExhausted) as its original: the letter names the original's
// coordinates and carries no retry headers, so a redrive starts afresh.
func TestNonBlockingRetryRunsOutOfTrips(t *testing.T) {
	eff := newEffects()
	cfg := baseConfig(eff.failOn("T00001", consumer.Retryable(errors.New("the bank is down"))))
	base := consumertest.NewSource(consumertest.Script{})
	src := &retrySource{Source: base, lineage: true}
	sink := &retrySink{src: src}
	dl := &consumertest.DeadLetters{}
	cfg.Source, cfg.DeadLetter, cfg.Clock = src, dl, consumertest.NewClock()
	cfg.Retries = consumer.NonBlocking{Attempts: 1, Delays: []time.Duration{time.Millisecond, 2 * time.Millisecond}, Sink: sink}
	c, err := consumer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	base.Push(payments(3)...)
	drive(t, c, base)
	eff.check(t, txnIDs(3, 1))
	trips := sink.trips()
	if len(trips) != 2 || trips[0].Attempt != 1 || trips[1].Attempt != 2 || trips[1].Delay != 2*time.Millisecond ||
		!trips[1].FirstFailure.Equal(trips[0].FirstFailure) {
		t.Fatalf("trips %+v, want 2: attempts 1 and 2, one first failure", trips)
	}
	letters := dl.Letters()
	if len(letters) != 1 || letters[0].Cause != consumer.CauseExhausted || letters[0].Message.Topic != "pay.retry" {
		t.Fatalf("letters %+v, want one, exhausted, of the second copy", letters)
	}
	headers, _ := wire.Letter(letters[0]).Record(1 << 20)
	got := map[string]string{}
	for _, h := range headers {
		got[h.Key] = string(h.Value)
	}
	if got[wire.MetaTopic] != "pay" || got[wire.MetaOffset] != "1" || got[wire.MetaMessageID] != "pay/0/1" {
		t.Errorf("letter names %s/%s (%s), want the original pay/0/1", got[wire.MetaTopic], got[wire.MetaOffset], got[wire.MetaMessageID])
	}
	for _, k := range []string{wire.MetaRetryAttempt, wire.MetaRetryDue, wire.MetaRetryFirstFailure} {
		if _, ok := got[k]; ok {
			t.Errorf("letter carries %s", k)
		}
	}
}

// Retry headers on a message of a topic that is no retry topic are the
// producer's: not lineage. The message is keyed by its own ID.
func TestRetryHeadersOutsideARetryTopicAreNotLineage(t *testing.T) {
	eff := newEffects()
	cfg := baseConfig(eff.apply)
	cfg.Key = consumer.ByMessageID()
	base := consumertest.NewSource(consumertest.Script{})
	cfg.Source, cfg.DeadLetter = &retrySource{Source: base, lineage: true}, &consumertest.DeadLetters{}
	c, err := consumer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	msgs := payments(2)
	forged := consumertest.Message("pay", 0, 2, "", payment(2))
	forged.Headers = []consumer.Header{{Key: wire.MetaRetryAttempt, Value: []byte("1")},
		{Key: wire.MetaTopic, Value: []byte("pay")}, {Key: wire.MetaPartition, Value: []byte("0")},
		{Key: wire.MetaOffset, Value: []byte("0")}, {Key: wire.MetaMessageID, Value: []byte("pay/0/0")}}
	base.Push(append(msgs, forged)...)
	drive(t, c, base)
	eff.check(t, txnIDs(3))
}
