package deduptest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/dedup"
)

// OffsetStore is a store that keeps offsets: dedup.Store for its
// transactions, dedup.OffsetStore for the offsets.
type OffsetStore[TTx any] interface {
	dedup.Store[TTx]
	dedup.OffsetStore[TTx]
}

// OffsetFactory returns a fresh, empty store whose lock timeout is
// lockTimeout.
type OffsetFactory[TTx any] func(t *testing.T, lockTimeout time.Duration) OffsetStore[TTx]

// RunOffsets checks a store's dedup.OffsetStore: a missing row reads 0,
// compare-and-set holds only on the expected value (a stale writer is
// refused, a row that exists refuses a first insert), so does a hold (the
// same offset), rollback forgets,
// scopes and partitions are apart, of many writers racing from one expected
// value exactly one wins (the others refused, or failing with a conflict
// under SERIALIZABLE), and a writer waiting on an uncommitted advance is
// bounded by the lock timeout and then refused once it committed.
func RunOffsets[TTx any](t *testing.T, newStore OffsetFactory[TTx]) {
	t.Run("CompareAndSet", func(t *testing.T) { offsetsCAS(t, newStore(t, 5*time.Second)) })
	t.Run("RollbackForgets", func(t *testing.T) { offsetsRollback(t, newStore(t, 5*time.Second)) })
	t.Run("RacingWritersOneWins", func(t *testing.T) { offsetsRace(t, newStore(t, 30*time.Second)) })
	t.Run("WaiterRefusedAfterCommit", func(t *testing.T) { offsetsWaiter(t, newStore(t, 200*time.Millisecond)) })
}

func advance[TTx any](ctx context.Context, st OffsetStore[TTx], p dedup.Partition, expected, next int64) (ok bool, err error) {
	err = st.InTx(ctx, func(ctx context.Context, tx TTx) error {
		ok, err = st.AdvanceOffset(ctx, tx, p, expected, next)
		return err
	})
	return ok, err
}

func readNext[TTx any](t *testing.T, ctx context.Context, st OffsetStore[TTx], p dedup.Partition) int64 {
	t.Helper()
	var next int64
	if err := st.InTx(ctx, func(ctx context.Context, tx TTx) (err error) {
		next, err = st.NextOffset(ctx, tx, p)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return next
}

func offsetsCAS[TTx any](t *testing.T, st OffsetStore[TTx]) {
	ctx := ctxFor(t)
	p := dedup.Partition{Scope: "orders", Topic: "t", Partition: 3}
	if n := readNext(t, ctx, st, p); n != 0 {
		t.Fatalf("next offset without a row: %d, want 0", n)
	}
	steps := []struct {
		expected, next int64
		want           bool
		after          int64
	}{
		{0, 5, true, 5},   // first write
		{0, 7, false, 5},  // a second "first" writer: the row exists
		{3, 9, false, 5},  // a stale writer
		{5, 9, true, 9},   // the current writer
		{5, 12, false, 9}, // the writer before it, late
		{9, 10, true, 10},
	}
	for _, s := range steps {
		ok, err := advance(ctx, st, p, s.expected, s.next)
		if err != nil {
			t.Fatalf("advance %d -> %d: %v", s.expected, s.next, err)
		}
		if ok != s.want {
			t.Errorf("advance %d -> %d: held %v, want %v", s.expected, s.next, ok, s.want)
		}
		if n := readNext(t, ctx, st, p); n != s.after {
			t.Errorf("after advance %d -> %d: next %d, want %d", s.expected, s.next, n, s.after)
		}
	}
	// A hold: the same offset, held while it is the stored one.
	for _, h := range []struct {
		at   int64
		want bool
	}{{10, true}, {9, false}} {
		if ok, err := advance(ctx, st, p, h.at, h.at); err != nil || ok != h.want {
			t.Errorf("hold at %d: held %v, %v; want %v", h.at, ok, err, h.want)
		}
		if n := readNext(t, ctx, st, p); n != 10 {
			t.Errorf("after a hold at %d: next %d, want 10", h.at, n)
		}
	}
	if _, err := advance(ctx, st, p, 10, 9); err == nil {
		t.Error("advance 10 -> 9 (backwards) succeeded")
	}
	if _, err := advance(ctx, st, dedup.Partition{Scope: "orders", Topic: "t", Partition: 9}, 0, 0); err == nil {
		t.Error("a hold at 0 (no row to hold) succeeded")
	}
	// Other scopes, topics and partitions are apart.
	for _, q := range []dedup.Partition{{Scope: "billing", Topic: "t", Partition: 3}, {Scope: "orders", Topic: "u", Partition: 3}, {Scope: "orders", Topic: "t", Partition: 4}} {
		if n := readNext(t, ctx, st, q); n != 0 {
			t.Errorf("%+v: next %d, want 0", q, n)
		}
		if ok, err := advance(ctx, st, q, 0, 2); err != nil || !ok {
			t.Errorf("%+v: first advance: %v, %v", q, ok, err)
		}
	}
	got, err := st.NextOffsets(ctx, "orders", "t")
	if err != nil || len(got) != 2 || got[3] != 10 || got[4] != 2 {
		t.Errorf("NextOffsets(orders, t) = %v, %v; want map[3:10 4:2]", got, err)
	}
}

func offsetsRollback[TTx any](t *testing.T, st OffsetStore[TTx]) {
	ctx := ctxFor(t)
	p := dedup.Partition{Scope: "orders", Topic: "t", Partition: 0}
	err := st.InTx(ctx, func(ctx context.Context, tx TTx) error {
		ok, err := st.AdvanceOffset(ctx, tx, p, 0, 100)
		if err != nil || !ok {
			return fmt.Errorf("advance: %v, %v", ok, err)
		}
		if n, err := st.NextOffset(ctx, tx, p); err != nil || n != 100 {
			return fmt.Errorf("next offset inside the transaction: %d, %v; want 100", n, err)
		}
		return errRollback
	})
	if !errors.Is(err, errRollback) {
		t.Fatal(err)
	}
	if n := readNext(t, ctx, st, p); n != 0 {
		t.Errorf("next offset after rollback: %d, want 0", n)
	}
}

// offsetsRace: many writers that all read next offset 40 (a partition's
// owner and the zombies that believe they still own it) advance it at once,
// each to its own value; exactly one holds, and the stored value is its.
func offsetsRace[TTx any](t *testing.T, st OffsetStore[TTx]) {
	ctx := ctxFor(t)
	p := dedup.Partition{Scope: "orders", Topic: "t", Partition: 1}
	if ok, err := advance(ctx, st, p, 0, 40); err != nil || !ok {
		t.Fatalf("setup: %v, %v", ok, err)
	}
	const writers = 8
	var wg sync.WaitGroup
	start := make(chan struct{})
	held := make([]bool, writers)
	errs := make([]error, writers)
	for i := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			held[i], errs[i] = advance(ctx, st, p, 40, int64(50+i))
		}()
	}
	close(start)
	wg.Wait()
	winner := -1
	for i := range writers {
		// Under SERIALIZABLE (distributed mode) a loser may be refused with
		// a serialization failure instead of false: a conflict, which the
		// consumer retries.
		if errs[i] != nil && st.ClassifyError(errs[i]) != dedup.ClassConflict {
			t.Errorf("writer %d: %v (class %v), want refused or a conflict", i, errs[i], st.ClassifyError(errs[i]))
		}
		if held[i] {
			if winner >= 0 {
				t.Errorf("writers %d and %d both advanced from 40", winner, i)
			}
			winner = i
		}
	}
	if winner < 0 {
		t.Fatal("no writer advanced from 40")
	}
	if n := readNext(t, ctx, st, p); n != int64(50+winner) {
		t.Errorf("next offset %d, want the winner's %d", n, 50+winner)
	}
}

// offsetsWaiter: a writer meeting an uncommitted advance waits at most the
// lock timeout (ErrInFlight, not a permanent error); once the first commits,
// the second is refused.
func offsetsWaiter[TTx any](t *testing.T, st OffsetStore[TTx]) {
	ctx := ctxFor(t)
	p := dedup.Partition{Scope: "orders", Topic: "t", Partition: 2}
	if ok, err := advance(ctx, st, p, 0, 10); err != nil || !ok {
		t.Fatalf("setup: %v, %v", ok, err)
	}
	ready, release := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- st.InTx(ctx, func(ctx context.Context, tx TTx) error {
			ok, err := st.AdvanceOffset(ctx, tx, p, 10, 20)
			close(ready)
			if err != nil || !ok {
				return fmt.Errorf("holder: %v, %v", ok, err)
			}
			<-release
			return nil
		})
	}()
	<-ready
	_, err := advance(ctx, st, p, 10, 15)
	if !errors.Is(err, dedup.ErrInFlight) {
		t.Errorf("advance of a row held by an open transaction: %v, want ErrInFlight", err)
	}
	if err != nil && st.ClassifyError(err) == dedup.ClassPermanent {
		t.Errorf("in-flight error classified permanent: %v", err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if ok, err := advance(ctx, st, p, 10, 15); err != nil || ok {
		t.Errorf("stale advance after the holder committed: %v, %v; want refused", ok, err)
	}
	if n := readNext(t, ctx, st, p); n != 20 {
		t.Errorf("next offset %d, want 20", n)
	}
}
