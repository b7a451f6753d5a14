package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/memstore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// quiet drops the retry and dead-letter logs the tests provoke on purpose.
var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// effects counts committed effects per key; OnCommit makes them roll back
// with the transaction.
type effects struct {
	mu sync.Mutex
	n  map[string]int
}

func newEffects() *effects { return &effects{n: map[string]int{}} }

func (e *effects) add(tx *memstore.Tx, key string) {
	tx.OnCommit(func() {
		e.mu.Lock()
		e.n[key]++
		e.mu.Unlock()
	})
}

func (e *effects) count(key string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.n[key]
}

func (e *effects) check(t *testing.T, keys []string) {
	t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, k := range keys {
		if e.n[k] != 1 {
			t.Errorf("key %s: %d effects, want 1", k, e.n[k])
		}
	}
	if len(e.n) != len(keys) {
		t.Errorf("%d keys with effects, want %d", len(e.n), len(keys))
	}
}

func payment(i int) string { return fmt.Sprintf(`{"txn_id":"T%05d","amount":%d}`, i, 100+i) }

func baseConfig(h consumer.HandlerFunc[*memstore.Tx]) consumer.Config[*memstore.Tx] {
	return consumer.Config[*memstore.Tx]{
		Name:    "payments",
		Store:   memstore.New(memstore.Config{}),
		Handler: h,
		Key:     consumer.ByJSONField("txn_id"),
		Retry:   consumer.RetryPolicy{MaxAttempts: 4},
		Logger:  quiet,
	}
}

func TestDuplicatesReordersAndCrashesApplyOnce(t *testing.T) {
	eff := newEffects()
	cfg := baseConfig(func(ctx context.Context, tx *memstore.Tx, m *consumer.Message) error {
		id, _ := consumer.ByJSONField("txn_id")(m)
		eff.add(tx, id)
		return nil
	})
	cfg.BatchSize = 16
	var msgs []*consumer.Message
	var keys []string
	for i := range 1000 {
		msgs = append(msgs, consumertest.Message("pay", int32(i%4), int64(i), "", payment(i)))
		keys = append(keys, fmt.Sprintf("T%05d", i))
	}
	res := consumertest.Run(t, cfg, consumertest.Script{
		MinDeliveries: 3, MaxDeliveries: 5, ReorderWindow: 20, CrashAfterCommitEvery: 7,
	}, msgs...)
	t.Log(res)
	eff.check(t, keys)
	if res.Stats.Applied != 1000 {
		t.Errorf("applied %d, want 1000", res.Stats.Applied)
	}
	if res.Stats.Duplicates != int64(res.Source.Deliveries)-1000 {
		t.Errorf("duplicates %d, want deliveries-1000 = %d", res.Stats.Duplicates, res.Source.Deliveries-1000)
	}
	if res.Source.Crashes == 0 || res.Source.Deliveries < 3000 {
		t.Errorf("the script did not misbehave enough: %+v", res.Source)
	}
	if len(res.DeadLetters) != 0 {
		t.Errorf("%d dead letters, want 0", len(res.DeadLetters))
	}
}

func TestPermanentErrorDeadLettersAndRecordsFailure(t *testing.T) {
	eff := newEffects()
	var calls atomic.Int64
	cfg := baseConfig(func(ctx context.Context, tx *memstore.Tx, m *consumer.Message) error {
		id, _ := consumer.ByJSONField("txn_id")(m)
		if id == "T00003" {
			calls.Add(1)
			return consumer.Permanent(errors.New("account closed"))
		}
		eff.add(tx, id)
		return nil
	})
	var msgs []*consumer.Message
	for i := range 8 {
		msgs = append(msgs, consumertest.Message("pay", 0, int64(i), "", payment(i)))
	}
	// T00003 delivered again later: dead-lettered again without running the handler.
	msgs = append(msgs, consumertest.Message("pay", 0, 8, "", payment(3)))
	res := consumertest.Run(t, cfg, consumertest.Script{}, msgs...)
	eff.check(t, []string{"T00000", "T00001", "T00002", "T00004", "T00005", "T00006", "T00007"})
	if calls.Load() != 1 {
		t.Errorf("failing handler ran %d times, want 1 (permanent: no retry, and the redelivery is refused by the failed row)", calls.Load())
	}
	if len(res.DeadLetters) != 2 {
		t.Fatalf("%d dead letters, want 2: %+v", len(res.DeadLetters), res.DeadLetters)
	}
	if !strings.Contains(res.DeadLetters[0].Reason.Error(), "account closed") || res.DeadLetters[0].Key.ID != "T00003" {
		t.Errorf("first letter: %v key %v", res.DeadLetters[0].Reason, res.DeadLetters[0].Key)
	}
	if !strings.Contains(res.DeadLetters[1].Reason.Error(), "failed before") {
		t.Errorf("second letter: %v", res.DeadLetters[1].Reason)
	}
	// The batch was split around the failure: the prefix committed on its own.
	if res.Stats.Commits < 2 {
		t.Errorf("commits %d, want the batch split", res.Stats.Commits)
	}
}

func TestTransientTwiceThenSuccessAppliesOnce(t *testing.T) {
	eff := newEffects()
	var fails atomic.Int64
	cfg := baseConfig(func(ctx context.Context, tx *memstore.Tx, m *consumer.Message) error {
		id, _ := consumer.ByJSONField("txn_id")(m)
		if id == "T00001" && fails.Add(1) <= 2 {
			return errors.New("downstream timeout")
		}
		eff.add(tx, id)
		return nil
	})
	clock := consumertest.NewClock()
	cfg.Clock = clock
	msgs := []*consumer.Message{
		consumertest.Message("pay", 0, 0, "", payment(0)),
		consumertest.Message("pay", 0, 1, "", payment(1)),
		consumertest.Message("pay", 0, 2, "", payment(2)),
	}
	res := consumertest.Run(t, cfg, consumertest.Script{}, msgs...)
	eff.check(t, []string{"T00000", "T00001", "T00002"})
	if len(res.DeadLetters) != 0 {
		t.Errorf("dead letters: %+v", res.DeadLetters)
	}
	if n := len(clock.Sleeps()); n != 2 {
		t.Errorf("%d backoff sleeps, want 2", n)
	}
}

func TestRetriesExhaustedDeadLetterWithAttempts(t *testing.T) {
	eff := newEffects()
	cfg := baseConfig(func(ctx context.Context, tx *memstore.Tx, m *consumer.Message) error {
		id, _ := consumer.ByJSONField("txn_id")(m)
		if id == "T00001" {
			return errors.New("always down")
		}
		eff.add(tx, id)
		return nil
	})
	clock := consumertest.NewClock()
	cfg.Clock = clock
	res := consumertest.Run(t, cfg, consumertest.Script{},
		consumertest.Message("pay", 0, 0, "", payment(0)),
		consumertest.Message("pay", 0, 1, "", payment(1)),
		consumertest.Message("pay", 0, 2, "", payment(2)))
	eff.check(t, []string{"T00000", "T00002"})
	if len(res.DeadLetters) != 1 || res.DeadLetters[0].Attempts != 4 {
		t.Fatalf("dead letters %+v, want one after 4 attempts", res.DeadLetters)
	}
	if !strings.Contains(res.DeadLetters[0].Reason.Error(), "gave up after 4 attempts") {
		t.Errorf("reason: %v", res.DeadLetters[0].Reason)
	}
	sleeps := clock.Sleeps()
	if len(sleeps) != 3 {
		t.Fatalf("sleeps %v, want 3", sleeps)
	}
	for i, d := range sleeps {
		base := 100 * time.Millisecond << i
		if d < base/2 || d > base*3/2 {
			t.Errorf("sleep %d = %v, want %v ± 50%%", i, d, base)
		}
	}
}

func TestPanicOnceThenSuccessAndAlwaysPanic(t *testing.T) {
	eff := newEffects()
	var once atomic.Bool
	cfg := baseConfig(func(ctx context.Context, tx *memstore.Tx, m *consumer.Message) error {
		id, _ := consumer.ByJSONField("txn_id")(m)
		switch {
		case id == "T00000" && once.CompareAndSwap(false, true):
			panic("first time")
		case id == "T00001":
			eff.add(tx, id) // staged, then rolled back by the panic
			panic("always")
		}
		eff.add(tx, id)
		return nil
	})
	res := consumertest.Run(t, cfg, consumertest.Script{},
		consumertest.Message("pay", 0, 0, "", payment(0)),
		consumertest.Message("pay", 0, 1, "", payment(1)),
		consumertest.Message("pay", 0, 2, "", payment(2)))
	eff.check(t, []string{"T00000", "T00002"})
	var pe *consumer.PanicError
	if len(res.DeadLetters) != 1 || !errors.As(res.DeadLetters[0].Reason, &pe) || res.DeadLetters[0].Attempts != 4 {
		t.Fatalf("dead letters %+v, want one panic after 4 attempts", res.DeadLetters)
	}
}

func TestFingerprintMismatchDeadLettersWithoutEffect(t *testing.T) {
	eff := newEffects()
	amounts := map[string]int{}
	var mu sync.Mutex
	cfg := baseConfig(func(ctx context.Context, tx *memstore.Tx, m *consumer.Message) error {
		id, _ := consumer.ByJSONField("txn_id")(m)
		eff.add(tx, id)
		mu.Lock()
		amounts[id]++
		mu.Unlock()
		return nil
	})
	res := consumertest.Run(t, cfg, consumertest.Script{},
		consumertest.Message("pay", 0, 0, "", `{"txn_id":"T1","amount":100}`),
		consumertest.Message("pay", 0, 1, "", `{"amount":100.0, "txn_id":"T1"}`), // same, spelled differently
		consumertest.Message("pay", 0, 2, "", `{"txn_id":"T1","amount":999}`))
	eff.check(t, []string{"T1"})
	if res.Stats.Duplicates != 1 {
		t.Errorf("duplicates %d, want 1", res.Stats.Duplicates)
	}
	if len(res.DeadLetters) != 1 || !errors.Is(res.DeadLetters[0].Reason, dedup.ErrFingerprintMismatch) {
		t.Fatalf("dead letters %+v, want one fingerprint mismatch", res.DeadLetters)
	}
	if res.DeadLetters[0].Message.Offset != 2 {
		t.Errorf("dead-lettered offset %d, want 2", res.DeadLetters[0].Message.Offset)
	}
}

func TestBadInputIsDeadLetteredAndTheRestApplied(t *testing.T) {
	eff := newEffects()
	cfg := baseConfig(func(ctx context.Context, tx *memstore.Tx, m *consumer.Message) error {
		id, err := consumer.ByJSONField("txn_id")(m)
		if err != nil {
			t.Errorf("handler got a message without key: %v", err)
		}
		eff.add(tx, id)
		return nil
	})
	cases := []struct {
		payload string
		want    error
		says    string
	}{
		{`{"amount":1}`, consumer.ErrNoKey, `key path "txn_id" not found`},
		{`{"txn_id":`, consumer.ErrBadPayload, "not valid JSON"},
		{`not json at all`, consumer.ErrBadPayload, "not valid JSON"},
		{`[1,2]`, consumer.ErrBadPayload, "is a JSON array, not an object"},
		{`{"txn_id":null}`, consumer.ErrNoKey, "is null"},
		{`{"txn_id":{"a":1}}`, consumer.ErrNoKey, "is object, not a string or number"},
		{`{"txn_id":"T1"`, consumer.ErrBadPayload, "not valid JSON"},
		{`{"txn_id":"A","amount":1,"txn_id":"B"}`, consumer.ErrBadPayload, `"txn_id" appears twice`},
		{`{"txn_id":"T1","pad":"` + strings.Repeat("p", 2000) + `"}`, consumer.ErrPayloadTooLarge, "2024 bytes, the limit is 1024"},
		{`{"txn_id":"` + strings.Repeat("x", 300) + `"}`, dedup.ErrInvalidKey, "300 bytes, the limit is 256"},
		{`{"txn_id":"a\u0000b"}`, dedup.ErrInvalidKey, "control character"},
	}
	cfg.MaxPayloadBytes = 1024
	var msgs []*consumer.Message
	for i, c := range cases {
		msgs = append(msgs, consumertest.Message("pay", 0, int64(2*i), "", c.payload))
		msgs = append(msgs, consumertest.Message("pay", 0, int64(2*i+1), "", payment(i)))
	}
	res := consumertest.Run(t, cfg, consumertest.Script{}, msgs...)
	var good []string
	for i := range cases {
		good = append(good, fmt.Sprintf("T%05d", i))
	}
	eff.check(t, good)
	if len(res.DeadLetters) != len(cases) {
		t.Fatalf("%d dead letters, want %d", len(res.DeadLetters), len(cases))
	}
	for i, c := range cases {
		l := res.DeadLetters[i]
		if !errors.Is(l.Reason, c.want) || !strings.Contains(l.Reason.Error(), c.says) {
			t.Errorf("payload %.30q: reason %q, want %v saying %q", c.payload, l.Reason, c.want, c.says)
		}
	}
}

func TestNothingIsAckedBeforeTheDeadLetterWriteSucceeds(t *testing.T) {
	cfg := baseConfig(func(ctx context.Context, tx *memstore.Tx, m *consumer.Message) error { return nil })
	dl := &consumertest.DeadLetters{FailFirst: 3}
	cfg.DeadLetter = dl
	src := consumertest.NewSource(consumertest.Script{})
	cfg.Source = src
	bad := consumertest.Message("pay", 0, 0, "", `{}`)
	res := consumertest.Run(t, cfg, consumertest.Script{}, bad)
	if dl.Calls() != 4 || len(res.DeadLetters) != 1 {
		t.Fatalf("dead-letter calls %d, letters %d; want 4 and 1", dl.Calls(), len(res.DeadLetters))
	}
	if src.Acked(bad.ID) != 1 {
		t.Fatalf("acked %d times, want 1", src.Acked(bad.ID))
	}
}

func TestTenantsAreSeparateScopes(t *testing.T) {
	eff := newEffects()
	cfg := baseConfig(func(ctx context.Context, tx *memstore.Tx, m *consumer.Message) error {
		id, _ := consumer.ByJSONField("txn_id")(m)
		eff.add(tx, m.Topic+":"+id)
		return nil
	})
	cfg.Tenant = func(m *consumer.Message) (string, error) { return m.Topic, nil }
	res := consumertest.Run(t, cfg, consumertest.Script{MinDeliveries: 2, MaxDeliveries: 2},
		consumertest.Message("tenant-a", 0, 0, "", payment(1)),
		consumertest.Message("tenant-b", 0, 0, "", payment(1)))
	eff.check(t, []string{"tenant-a:T00001", "tenant-b:T00001"})
	if res.Stats.Duplicates != 2 {
		t.Errorf("duplicates %d, want 2", res.Stats.Duplicates)
	}
}

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
	cfg := baseConfig(func(ctx context.Context, tx *memstore.Tx, m *consumer.Message) error {
		id, _ := consumer.ByJSONField("txn_id")(m)
		eff.add(tx, id)
		return nil
	})
	st := &flakyStore{Store: memstore.New(memstore.Config{})}
	st.down.Store(50) // far more than Retry.MaxAttempts
	cfg.Store = st
	res := consumertest.Run(t, cfg, consumertest.Script{},
		consumertest.Message("pay", 0, 0, "", payment(0)),
		consumertest.Message("pay", 0, 1, "", payment(1)))
	eff.check(t, []string{"T00000", "T00001"})
	if len(res.DeadLetters) != 0 {
		t.Fatalf("dead letters during an outage: %+v", res.DeadLetters)
	}
	if res.Stats.Retries < 50 {
		t.Errorf("retries %d, want >= 50", res.Stats.Retries)
	}
}

func TestStopLaneOnExhausted(t *testing.T) {
	eff := newEffects()
	cfg := baseConfig(func(ctx context.Context, tx *memstore.Tx, m *consumer.Message) error {
		id, _ := consumer.ByJSONField("txn_id")(m)
		if id == "T00001" {
			return errors.New("always down")
		}
		eff.add(tx, id)
		return nil
	})
	cfg.OnExhausted = consumer.StopLaneOnExhausted
	cfg.BatchSize = 1
	cfg.Clock = consumertest.NewClock()
	src := consumertest.NewSource(consumertest.Script{})
	cfg.Source = src
	cfg.DeadLetter = &consumertest.DeadLetters{}
	c, err := consumer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	src.Push(
		consumertest.Message("pay", 0, 0, "", payment(0)),
		consumertest.Message("pay", 0, 1, "", payment(1)),
		consumertest.Message("pay", 0, 2, "", payment(2)),
		consumertest.Message("pay", 1, 0, "", payment(3)),
		consumertest.Message("pay", 1, 1, "", payment(4)),
	)
	done := make(chan error, 1)
	go func() { done <- c.Run(context.Background()) }()
	deadline := time.Now().Add(10 * time.Second)
	for eff.count("T00004") == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// Lane pay/0 stopped at T00001: T00002 was never applied nor acked.
	if eff.count("T00000") != 1 || eff.count("T00001") != 0 || eff.count("T00002") != 0 {
		t.Errorf("lane 0 effects: %v", eff.n)
	}
	if eff.count("T00003") != 1 || eff.count("T00004") != 1 {
		t.Errorf("lane 1 effects: %v", eff.n)
	}
	if src.Acked("pay/0/1") != 0 || src.Acked("pay/0/2") != 0 {
		t.Error("a message of the stopped lane was acked")
	}
	if src.Acked("pay/0/0") != 1 {
		t.Error("the message before the failure was not acked")
	}
}

// TestStoppedLaneDoesNotPassBadInput: bad input behind the message that
// stopped its lane, in the same batch, is neither dead-lettered nor acked;
// bad input before it is.
func TestStoppedLaneDoesNotPassBadInput(t *testing.T) {
	eff := newEffects()
	src := consumertest.NewSource(consumertest.Script{})
	cfg := baseConfig(func(ctx context.Context, tx *memstore.Tx, m *consumer.Message) error {
		id, _ := consumer.ByJSONField("txn_id")(m)
		switch id {
		case "T00000":
			// Hold the lane until the rest is delivered: the next batch
			// holds the bad input on both sides of T00001.
			for end := time.Now().Add(5 * time.Second); src.Stats().Deliveries < 5 && time.Now().Before(end); {
				time.Sleep(time.Millisecond)
			}
		case "T00001":
			return errors.New("always down")
		}
		eff.add(tx, id)
		return nil
	})
	cfg.OnExhausted = consumer.StopLaneOnExhausted
	cfg.BatchSize = 10
	cfg.Clock = consumertest.NewClock()
	dl := &consumertest.DeadLetters{}
	cfg.DeadLetter = dl
	cfg.Source = src
	c, err := consumer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	src.Push(
		consumertest.Message("pay", 0, 0, "", payment(0)),
		consumertest.Message("pay", 0, 1, "", `{"bad": `),
		consumertest.Message("pay", 0, 2, "", payment(1)),
		consumertest.Message("pay", 0, 3, "", `{"amount": 5}`),
		consumertest.Message("pay", 0, 4, "", payment(2)),
	)
	done := make(chan error, 1)
	go func() { done <- c.Run(context.Background()) }()
	deadline := time.Now().Add(10 * time.Second)
	for c.Stats().Released == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if st := c.Stats(); st.Delivered < 5 || st.Released == 0 {
		t.Fatalf("the batch was not delivered whole, or the lane did not stop: %+v", st)
	}
	if eff.count("T00000") != 1 || eff.count("T00001") != 0 || eff.count("T00002") != 0 {
		t.Errorf("effects: %v", eff.n)
	}
	letters := dl.Letters()
	if len(letters) != 1 || letters[0].Message.Offset != 1 {
		t.Fatalf("dead letters %+v; want only the bad input before the stop (offset 1)", letters)
	}
	for _, id := range []string{"pay/0/2", "pay/0/3", "pay/0/4"} {
		if src.Acked(id) != 0 {
			t.Errorf("%s, at or behind the stop, was acked", id)
		}
	}
}

func TestConfigErrorsNameTheField(t *testing.T) {
	_, err := consumer.New(consumer.Config[*memstore.Tx]{Name: "a/b", BatchSize: -1, Retry: consumer.RetryPolicy{Jitter: 2}})
	if err == nil {
		t.Fatal("New accepted an invalid config")
	}
	for _, want := range []string{"Config.Name", "Config.Source is nil", "Config.Store is nil", "Config.Handler is nil", "Config.DeadLetter is nil", "Config.BatchSize", "Config.Retry.Jitter"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not mention %q:\n%v", want, err)
		}
	}
	_, err = consumer.New(consumer.Config[*memstore.Tx]{Name: strings.Repeat("n", 65)})
	if err == nil || !strings.Contains(err.Error(), "Config.Name is 65 bytes") {
		t.Errorf("long name: %v", err)
	}
}

// blockingSource delivers msgs, closes delivered, then waits for ctx.
type blockingSource struct {
	msgs            []*consumer.Message
	delivered       chan struct{}
	mu              sync.Mutex
	acked, released []*consumer.Message
}

func (s *blockingSource) Run(ctx context.Context, deliver consumer.DeliverFunc) error {
	for _, m := range s.msgs {
		if err := deliver(ctx, m); err != nil {
			return err
		}
	}
	close(s.delivered)
	<-ctx.Done()
	return ctx.Err()
}

func (s *blockingSource) Ack(_ context.Context, msgs []*consumer.Message) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.acked = append(s.acked, msgs...)
	return nil
}

func (s *blockingSource) Release(msgs []*consumer.Message, _ error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.released = append(s.released, msgs...)
}

func stuckConfig(src consumer.Source, block <-chan struct{}, started chan<- struct{}) consumer.Config[*memstore.Tx] {
	cfg := baseConfig(func(ctx context.Context, tx *memstore.Tx, m *consumer.Message) error {
		started <- struct{}{}
		select {
		case <-block:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	cfg.BatchSize = 1
	cfg.DeadLetter = &consumertest.DeadLetters{}
	cfg.Source = src
	return cfg
}

func twoMessages() []*consumer.Message {
	return []*consumer.Message{
		consumertest.Message("pay", 0, 0, "", payment(0)),
		consumertest.Message("pay", 0, 1, "", payment(1)),
	}
}

func TestStopDrainsQueuedMessages(t *testing.T) {
	block, started := make(chan struct{}), make(chan struct{}, 10)
	src := &blockingSource{msgs: twoMessages(), delivered: make(chan struct{})}
	c, err := consumer.New(stuckConfig(src, block, started))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- c.Run(context.Background()) }()
	<-started
	<-src.delivered // the second message waits in the lane
	stopped := make(chan error, 1)
	go func() { stopped <- c.Stop(context.Background()) }()
	close(block)
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if len(src.acked) != 2 || len(src.released) != 0 {
		t.Fatalf("graceful stop: acked %d, released %d; want 2 and 0", len(src.acked), len(src.released))
	}
}

func TestStopPastDeadlineReleases(t *testing.T) {
	block, started := make(chan struct{}), make(chan struct{}, 10)
	defer close(block)
	src := &blockingSource{msgs: twoMessages(), delivered: make(chan struct{})}
	c, err := consumer.New(stuckConfig(src, block, started))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- c.Run(context.Background()) }()
	<-started
	<-src.delivered // the second message waits in the lane
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := c.Stop(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Stop past deadline: %v", err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if len(src.acked) != 0 || len(src.released) != 2 {
		t.Fatalf("hard stop: acked %d, released %d; want 0 and 2", len(src.acked), len(src.released))
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
