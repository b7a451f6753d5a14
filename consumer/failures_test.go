package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
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
	msgs := payments(8)
	// T00003 delivered again later: dead-lettered again without running the handler.
	msgs = append(msgs, consumertest.Message("pay", 0, 8, "", payment(3)))
	res := consumertest.Run(t, cfg, consumertest.Script{}, msgs...)
	eff.check(t, txnIDs(8, 3))
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
	cfg := baseConfig(eff.failOn("T00001", errors.New("always down")))
	clock := consumertest.NewClock()
	cfg.Clock = clock
	res := consumertest.Run(t, cfg, consumertest.Script{}, payments(3)...)
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
	res := consumertest.Run(t, cfg, consumertest.Script{}, payments(3)...)
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

// TestPanicIsLoggedAndCanBePermanent: a recovered panic's stack is logged at
// ERROR (it used to reach only the dead letter); with PanicsArePermanent the
// message is dead-lettered after its first panic instead of retried.
func TestPanicIsLoggedAndCanBePermanent(t *testing.T) {
	var logs strings.Builder
	var mu sync.Mutex
	cfg := baseConfig(func(ctx context.Context, tx *memstore.Tx, m *consumer.Message) error {
		panic("nil map in the ledger code")
	})
	cfg.PanicsArePermanent = true
	cfg.Logger = slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return logs.Write(p)
	}), &slog.HandlerOptions{Level: slog.LevelError}))
	res := consumertest.Run(t, cfg, consumertest.Script{}, consumertest.Message("pay", 0, 0, "", payment(0)))
	var pe *consumer.PanicError
	if len(res.DeadLetters) != 1 || !errors.As(res.DeadLetters[0].Reason, &pe) || res.DeadLetters[0].Attempts != 1 {
		t.Fatalf("dead letters %+v, want the panic after 1 attempt", res.DeadLetters)
	}
	mu.Lock()
	defer mu.Unlock()
	if !strings.Contains(logs.String(), "level=ERROR msg=\"idem: handler panicked\"") || !strings.Contains(logs.String(), "failures_test.go") {
		t.Errorf("the panic's stack was not logged at ERROR:\n%s", logs.String())
	}
}

func TestStopLaneOnExhausted(t *testing.T) {
	eff := newEffects()
	cfg := baseConfig(eff.failOn("T00001", errors.New("always down")))
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
	runUntil(t, c, func() bool { return eff.count("T00004") > 0 })
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
	runUntil(t, c, func() bool { return c.Stats().Released > 0 })
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

// unsetStore leaves the claim result of one key at the zero status, as a
// buggy third-party store would.
type unsetStore struct {
	*memstore.Store
	key string
}

func (u unsetStore) Claim(ctx context.Context, tx *memstore.Tx, claims []dedup.Claim, results []dedup.Result) error {
	if err := u.Store.Claim(ctx, tx, claims, results); err != nil {
		return err
	}
	for i := range claims {
		if claims[i].Key.ID == u.key {
			results[i] = dedup.Result{}
		}
	}
	return nil
}

// TestUnsetClaimResultIsNeverAcknowledged: a claim result left at the zero
// status used to be acknowledged as settled with no handler run, losing the
// effect for good. It must fail closed: the transaction rolls back, the
// consumer stops with dedup.ErrContract, and neither that message nor the
// ones behind it in its lane are acknowledged.
func TestUnsetClaimResultIsNeverAcknowledged(t *testing.T) {
	eff := newEffects()
	cfg := baseConfig(eff.apply)
	cfg.Store = unsetStore{Store: memstore.New(memstore.Config{}), key: "T00001"}
	src := consumertest.NewSource(consumertest.Script{})
	cfg.Source = src
	msgs := []*consumer.Message{
		consumertest.Message("pay", 0, 0, "", payment(0)),
		consumertest.Message("pay", 0, 1, "", payment(1)),
		consumertest.Message("pay", 0, 2, "", payment(2)),
	}
	cfg.BatchSize = 1 // T00000 commits on its own first
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := consumertest.Drive(ctx, cfg, consumertest.Script{}, msgs...)
	if !errors.Is(err, dedup.ErrContract) {
		t.Fatalf("Drive: %v, want dedup.ErrContract (%v)", err, res)
	}
	for i, m := range msgs {
		want := 0
		if i == 0 {
			want = 1
		}
		if got := src.Acked(m.ID); got != want {
			t.Errorf("%s acked %d times, want %d", m.ID, got, want)
		}
	}
	if n := eff.count("T00001") + eff.count("T00002"); n != 0 {
		t.Errorf("%d effects of the refused message and the one behind it, want 0", n)
	}
	if len(res.DeadLetters) != 0 {
		t.Errorf("dead letters: %+v", res.DeadLetters)
	}
}

// deferredFailStore fails COMMIT of any transaction in which the handler
// marked a poison message, as a deferred constraint trigger raising P0001
// would: an error the store cannot classify, on a healthy connection.
type deferredFailStore struct {
	*memstore.Store
	poisoned sync.Map // *memstore.Tx -> true
	commits  atomic.Int64
}

var errTrigger = errors.New("ERROR: amount must be positive (SQLSTATE P0001)")

func (d *deferredFailStore) InTx(ctx context.Context, fn func(context.Context, *memstore.Tx) error) error {
	return d.Store.InTx(ctx, func(ctx context.Context, tx *memstore.Tx) error {
		if err := fn(ctx, tx); err != nil {
			return err
		}
		if _, bad := d.poisoned.LoadAndDelete(tx); bad {
			if d.commits.Add(1) > 100 {
				return consumer.Permanent(fmt.Errorf("retried without bound: %w", errTrigger))
			}
			return fmt.Errorf("commit: %w", errTrigger)
		}
		return nil
	})
}

// TestDeterministicCommitErrorUsesTheRetryBudget: an error raised at COMMIT
// that is neither the database's unavailability nor a conflict repeats on a
// healthy connection. It used to be waited out for ever like an outage,
// wedging the lane; it must be isolated to its message, fall under
// Retry.MaxAttempts and end in a dead letter, with the rest applied.
func TestDeterministicCommitErrorUsesTheRetryBudget(t *testing.T) {
	eff := newEffects()
	st := &deferredFailStore{Store: memstore.New(memstore.Config{})}
	cfg := baseConfig(func(ctx context.Context, tx *memstore.Tx, m *consumer.Message) error {
		id, _ := consumer.ByJSONField("txn_id")(m)
		if id == "T00003" {
			st.poisoned.Store(tx, true)
		}
		eff.add(tx, id)
		return nil
	})
	cfg.Store = st
	res := consumertest.Run(t, cfg, consumertest.Script{}, payments(8)...)
	eff.check(t, txnIDs(8, 3))
	if len(res.DeadLetters) != 1 {
		t.Fatalf("dead letters %+v, want T00003's", res.DeadLetters)
	}
	l := res.DeadLetters[0]
	if l.Key.ID != "T00003" || !errors.Is(l.Reason, errTrigger) || consumer.IsPermanent(l.Reason) {
		t.Errorf("dead letter %s: %v, want T00003 given up after its retries", l.Key.ID, l.Reason)
	}
	if l.Attempts != 4 {
		t.Errorf("dead letter after %d attempts, want Retry.MaxAttempts = 4", l.Attempts)
	}
}
