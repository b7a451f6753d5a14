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
	"github.com/idemkit/idem/consumer/wire"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/memstore"
)

// parkInStore: set false to watch TestKeyOrderedAcrossARestart fail with
// the keys parked in the consumer's memory (a store without Parking).
var parkInStore = true

// memoryOnly hides the Parking of a store: KeyOrdered then parks keys in
// the consumer's memory, as it does over a store that keeps none.
type memoryOnly struct{ dedup.Store[*memstore.Tx] }

// order records, per record key, the txn_ids applied, in commit order.
type order struct {
	mu    sync.Mutex
	byKey map[string][]string
}

func (o *order) apply(_ context.Context, tx *memstore.Tx, m *consumer.Message) error {
	id, _ := consumer.ByJSONField("txn_id")(m)
	tx.OnCommit(func() {
		o.mu.Lock()
		defer o.mu.Unlock()
		if o.byKey == nil {
			o.byKey = map[string][]string{}
		}
		o.byKey[string(m.Key)] = append(o.byKey[string(m.Key)], id)
	})
	return nil
}

func (o *order) of(key string) []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.byKey[key])
}

// heldSink keeps the retry copies a consumer writes, as records of the
// retry topic "pay.retry", until the test delivers them.
type heldSink struct {
	mu     sync.Mutex
	copies []*consumer.Message
}

func (s *heldSink) Retry(_ context.Context, r consumer.RetryLetter) error {
	headers, value := wire.Letter(r.Letter).RetryRecord(r.Retry)
	s.mu.Lock()
	defer s.mu.Unlock()
	m := consumertest.Message("pay.retry", 0, int64(len(s.copies)), string(r.Message.Key), string(value))
	m.Headers = headers
	s.copies = append(s.copies, m)
	return nil
}

func (s *heldSink) taken() []*consumer.Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.copies)
}

// keyOrderedConfig is a KeyOrdered consumer of store over src, a message
// tried once in its lane before it goes to retry.
func keyOrderedConfig(store dedup.Store[*memstore.Tx], h consumer.HandlerFunc[*memstore.Tx], src *retrySource, sink consumer.RetrySink, dl consumer.DeadLetter) consumer.Config[*memstore.Tx] {
	cfg := baseConfig(h)
	cfg.Store, cfg.Source, cfg.DeadLetter = store, src, dl
	cfg.BatchSize = 1
	cfg.Retry = consumer.RetryPolicy{MaxAttempts: 1}
	cfg.Retries = consumer.NonBlocking{Attempts: 1, Delays: []time.Duration{10 * time.Millisecond, 10 * time.Millisecond}, Sink: sink, KeyOrdered: true}
	return cfg
}

// TestKeyOrderedAcrossARestart: a1 fails into retry and a2 follows it
// there; the consumer stops. A new consumer over the same store — nothing
// of the first in its memory — reads a3, a new message of the key, before
// the copies come back: a3 must follow them, and the key's payments are
// applied in production order. With the keys parked in memory (a store
// without Parking) the new consumer knows of no parked key and applies a3
// first.
func TestKeyOrderedAcrossARestart(t *testing.T) {
	ms := memstore.New(memstore.Config{})
	var store dedup.Store[*memstore.Tx] = ms
	if !parkInStore {
		store = memoryOnly{ms}
	}
	a := func(i int64) *consumer.Message { return consumertest.Message("pay", 0, i, "acct-a", payment(int(i))) }

	// The first consumer: a1 fails, a2 follows it into retry.
	src1 := &retrySource{Source: consumertest.NewSource(consumertest.Script{}), lineage: true}
	held := &heldSink{}
	fail := func(context.Context, *memstore.Tx, *consumer.Message) error {
		return consumer.Retryable(errors.New("the account service is down"))
	}
	c1, err := consumer.New(keyOrderedConfig(store, fail, src1, held, &consumertest.DeadLetters{}))
	if err != nil {
		t.Fatal(err)
	}
	src1.Push(a(1), a(2))
	drive(t, c1, src1.Source)
	if n := len(held.taken()); n != 2 {
		t.Fatalf("%d copies in retry, want a1's and a2's", n)
	}

	// A new consumer, the same store: a3 is read before the copies.
	var got order
	src2 := &retrySource{Source: consumertest.NewSource(consumertest.Script{}), lineage: true}
	sink2 := &keyedRetrySink{retrySink{src: src2}}
	dl := &consumertest.DeadLetters{}
	c2, err := consumer.New(keyOrderedConfig(store, got.apply, src2, sink2, dl))
	if err != nil {
		t.Fatal(err)
	}
	if parkInStore {
		if h := c2.Health(context.Background()); h.Parked == nil || h.Parked.Keys != 1 {
			t.Errorf("Health.Parked %+v (%v) before the new consumer ran, want 1 key", h.Parked, h.ParkedErr)
		}
	}
	ran := make(chan error, 1)
	go func() { ran <- c2.Run(context.Background()) }()
	src2.Push(a(3))
	waitFor(t, func() bool { return c2.Stats().Applied+c2.Stats().RetriedLater > 0 })
	src2.Push(held.taken()...)
	waitFor(t, func() bool { return len(got.of("acct-a")) == 3 })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := src2.WaitIdle(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c2.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-ran; err != nil {
		t.Fatal(err)
	}
	if want := []string{"T00001", "T00002", "T00003"}; !slices.Equal(got.of("acct-a"), want) {
		t.Errorf("acct-a applied %v, want %v: the new consumer forgot the parked key", got.of("acct-a"), want)
	}
	if n := len(dl.Letters()); n != 0 {
		t.Errorf("%d dead letters, want none", n)
	}
	if s, err := ms.ParkStats(ctx); err != nil || s.Keys != 0 {
		t.Errorf("ParkStats %+v, %v after every payment applied, want no key parked", s, err)
	}
}

// TestKeyOrderedParkedTooLong: MaxParkedDepth 2. a1 fails into retry, a2
// follows it; a3 would make the key deeper than 2: the key has outlived
// its limits, and a3, a1 and a2 are dead-lettered with
// CauseParkedTooLong — the parked ones in their order — and never tried
// again; the key is released, and a4 is applied.
func TestKeyOrderedParkedTooLong(t *testing.T) {
	store := memstore.New(memstore.Config{})
	var got order
	h := func(ctx context.Context, tx *memstore.Tx, m *consumer.Message) error {
		if id, _ := consumer.ByJSONField("txn_id")(m); id == "T00001" {
			return consumer.Retryable(errors.New("the account service is down"))
		}
		return got.apply(ctx, tx, m)
	}
	src := &retrySource{Source: consumertest.NewSource(consumertest.Script{}), lineage: true}
	sink := &keyedRetrySink{retrySink{src: src}}
	dl := &consumertest.DeadLetters{}
	cfg := keyOrderedConfig(store, h, src, sink, dl)
	nb := cfg.Retries.(consumer.NonBlocking)
	nb.MaxParkedDepth = 2
	cfg.Retries = nb
	c, err := consumer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	a := func(i int64) *consumer.Message { return consumertest.Message("pay", 0, i, "acct-a", payment(int(i))) }
	src.Push(a(1), a(2), a(3))
	drive(t, c, src.Source)

	var ids []string
	for _, l := range dl.Letters() {
		if l.Cause != consumer.CauseParkedTooLong || !errors.Is(l.Reason, consumer.ErrParkedTooLong) {
			t.Errorf("letter of %s: cause %v, reason %v; want parked_too_long", l.Key.ID, l.Cause, l.Reason)
		}
		ids = append(ids, l.Key.ID)
	}
	if want := []string{"T00003", "T00001", "T00002"}; !slices.Equal(ids, want) {
		t.Errorf("dead letters %v, want %v: a3 in hand, then the parked ones in order", ids, want)
	}
	if n := len(got.of("acct-a")); n != 0 {
		t.Errorf("acct-a applied %v, want nothing before the key is released", got.of("acct-a"))
	}
	if s, err := store.ParkStats(context.Background()); err != nil || s.Keys != 0 {
		t.Fatalf("ParkStats %+v, %v after the key's messages were dead-lettered, want it released", s, err)
	}

	c2, err := consumer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	src.Push(a(4))
	drive(t, c2, src.Source)
	if want := []string{"T00004"}; !slices.Equal(got.of("acct-a"), want) {
		t.Errorf("acct-a applied %v after its key was released, want %v", got.of("acct-a"), want)
	}
}

// waitFor waits until cond holds, for up to 10 seconds.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatal("timed out waiting")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// failingUnpark is a store whose Unpark fails while fail is set.
type failingUnpark struct {
	*memstore.Store
	mu    sync.Mutex
	fail  bool
	tries int
}

func (s *failingUnpark) Unpark(ctx context.Context, ref dedup.ParkRef, now time.Time) error {
	s.mu.Lock()
	s.tries++
	fail := s.fail
	s.mu.Unlock()
	if fail {
		return errors.New("the database is away")
	}
	return s.Store.Unpark(ctx, ref, now)
}

func (s *failingUnpark) setFail(v bool) { s.mu.Lock(); s.fail = v; s.mu.Unlock() }

func (s *failingUnpark) triesSoFar() int { s.mu.Lock(); defer s.mu.Unlock(); return s.tries }

// TestKeyOrderedUnparkFailing: a1's copy comes back from retry and is
// applied while Unpark fails. Its offset must not be acknowledged before
// its key lets it go — a crash then would leave the key parked behind a
// head that never comes back — so the lane waits out the failing Unpark,
// and a2, behind it, is applied after it once Unpark works again.
func TestKeyOrderedUnparkFailing(t *testing.T) {
	store := &failingUnpark{Store: memstore.New(memstore.Config{})}
	var got order
	var failed sync.Once
	h := func(ctx context.Context, tx *memstore.Tx, m *consumer.Message) error {
		err := error(nil)
		failed.Do(func() { err = consumer.Retryable(errors.New("the account service is down")) })
		if err != nil {
			return err
		}
		return got.apply(ctx, tx, m)
	}
	src := &retrySource{Source: consumertest.NewSource(consumertest.Script{}), lineage: true}
	held := &heldSink{}
	cfg := keyOrderedConfig(store, h, src, held, &consumertest.DeadLetters{})
	cfg.Retry.Initial, cfg.Retry.Max = time.Millisecond, 5*time.Millisecond
	c, err := consumer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	a := func(i int64) *consumer.Message { return consumertest.Message("pay", 0, i, "acct-a", payment(int(i))) }
	ran := make(chan error, 1)
	go func() { ran <- c.Run(context.Background()) }()
	src.Push(a(1), a(2))
	waitFor(t, func() bool { return len(held.taken()) == 2 })

	store.setFail(true)
	copies := held.taken()
	src.Push(copies[0])
	waitFor(t, func() bool {
		return len(got.of("acct-a")) == 1 && (store.triesSoFar() >= 3 || src.Acked(copies[0].ID) > 0)
	})
	if n := src.Acked(copies[0].ID); n != 0 {
		t.Errorf("a1's copy acknowledged %d times while its Unpark failed, want 0", n)
	}
	store.setFail(false)
	src.Push(copies[1])
	waitFor(t, func() bool { return len(got.of("acct-a")) == 2 })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := src.WaitIdle(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-ran; err != nil {
		t.Fatal(err)
	}
	if want := []string{"T00001", "T00002"}; !slices.Equal(got.of("acct-a"), want) {
		t.Errorf("acct-a applied %v, want %v", got.of("acct-a"), want)
	}
	if s, err := store.ParkStats(ctx); err != nil || s.Keys != 0 {
		t.Errorf("ParkStats %+v, %v, want the key released", s, err)
	}
}

// TestKeyOrderedLimitsValidated: New names MaxParkedDepth and
// MaxParkedWait when they are out of range — a wait shorter than the sum
// of the delays would dead-letter a head still on its trips.
func TestKeyOrderedLimitsValidated(t *testing.T) {
	src := &retrySource{Source: consumertest.NewSource(consumertest.Script{})}
	cfg := keyOrderedConfig(memstore.New(memstore.Config{}), newEffects().apply, src, &heldSink{}, &consumertest.DeadLetters{})
	nb := cfg.Retries.(consumer.NonBlocking)
	nb.MaxParkedDepth, nb.MaxParkedWait = -1, 15*time.Millisecond
	cfg.Retries = nb
	_, err := consumer.New(cfg)
	for _, want := range []string{"Retries.MaxParkedDepth is -1", "Retries.MaxParkedWait is 15ms", "the sum of Delays, 20ms"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("New: %v; want it to say %q", err, want)
		}
	}
	nb.MaxParkedDepth, nb.MaxParkedWait = 0, 20*time.Millisecond
	cfg.Retries = nb
	if _, err := consumer.New(cfg); err != nil {
		t.Errorf("New with MaxParkedWait the sum of Delays: %v", err)
	}
}

// followerTooLarge is a retry sink whose broker refuses a follower's copy
// as too large.
type followerTooLarge struct{ consumer.RetrySink }

func (s followerTooLarge) Retry(ctx context.Context, r consumer.RetryLetter) error {
	if r.Following {
		return fmt.Errorf("broker: %w", consumer.ErrRetryTooLarge)
	}
	return s.RetrySink.Retry(ctx, r)
}

// TestKeyOrderedUnparksAFollowerDeadLettered: a1 and a2 of one key in one
// batch, both let through by CheckParked while the key was not parked.
// a1 fails into retry, parking the key; a2, checked again, follows it,
// and its copy is refused as too large, so it is dead-lettered. It is in
// its key's list (the second CheckParked put it there): it must be
// unparked, though the first check found it in no list, or its key stays
// parked behind a message that never comes back.
func TestKeyOrderedUnparksAFollowerDeadLettered(t *testing.T) {
	store := memstore.New(memstore.Config{})
	var got order
	var failed atomic.Bool
	h := func(ctx context.Context, tx *memstore.Tx, m *consumer.Message) error {
		if m.Offset == 1 && failed.CompareAndSwap(false, true) {
			return consumer.Retryable(errors.New("the account service is down"))
		}
		return got.apply(ctx, tx, m)
	}
	src := &retrySource{Source: consumertest.NewSource(consumertest.Script{}), lineage: true}
	dl := &consumertest.DeadLetters{}
	cfg := keyOrderedConfig(store, h, src, followerTooLarge{&keyedRetrySink{retrySink{src: src}}}, dl)
	cfg.BatchSize = 2
	c, err := consumer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	src.Push(consumertest.Message("pay", 0, 1, "acct-a", payment(1)), consumertest.Message("pay", 0, 2, "acct-a", payment(2)))
	drive(t, c, src.Source)
	if want := []string{"T00001"}; !slices.Equal(got.of("acct-a"), want) {
		t.Errorf("acct-a applied %v, want %v", got.of("acct-a"), want)
	}
	if l := dl.Letters(); len(l) != 1 || !errors.Is(l[0].Reason, consumer.ErrRetryTooLarge) {
		t.Errorf("letters %v, want a2's, too large to follow", l)
	}
	if pk, err := store.Parked(context.Background(), dedup.ParkFilter{}); err != nil || len(pk) != 0 {
		t.Errorf("Parked %+v, %v after a1 was applied and a2 dead-lettered; want the key released", pk, err)
	}
}
