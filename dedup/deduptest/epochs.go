package deduptest

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/dedup"
)

// EpochFactory returns a fresh, migrated store's dedup.EpochStore.
type EpochFactory func(t *testing.T) dedup.EpochStore

// RunEpochs checks a store's dedup.EpochStore: a scope without a row is at
// Epoch{}; every AdvanceEpoch, BeginRelease and EndRelease moves the epoch
// forward; a release reads as Releasing until it ends, refuses a second
// one meanwhile (ErrReleaseInProgress), and is taken over once its hold ran
// out, after which its late EndRelease leaves the new one marked; scopes
// are apart; racing writers all move the epoch (none lost) and of racing
// releases exactly one begins.
func RunEpochs(t *testing.T, newStore EpochFactory) {
	t.Run("Release", func(t *testing.T) { epochsRelease(t, newStore(t)) })
	t.Run("HoldRunsOut", func(t *testing.T) { epochsHold(t, newStore(t)) })
	t.Run("Racing", func(t *testing.T) { epochsRace(t, newStore(t)) })
}

func readEpoch(t *testing.T, st dedup.EpochStore, scope string) dedup.Epoch {
	t.Helper()
	m, err := st.Epochs(ctxFor(t))
	if err != nil {
		t.Fatal(err)
	}
	return m[scope]
}

func epochsRelease(t *testing.T, st dedup.EpochStore) {
	ctx := ctxFor(t)
	if e := readEpoch(t, st, "orders"); e != (dedup.Epoch{}) {
		t.Fatalf("a scope never released: %+v, want the zero Epoch", e)
	}
	for want := int64(1); want <= 2; want++ {
		n, err := st.AdvanceEpoch(ctx, "orders")
		if err != nil || n != want {
			t.Fatalf("AdvanceEpoch: %d, %v; want %d", n, err, want)
		}
	}
	if e := readEpoch(t, st, "orders"); e != (dedup.Epoch{N: 2}) {
		t.Fatalf("after two advances: %+v", e)
	}
	token, err := st.BeginRelease(ctx, "orders", time.Hour)
	if err != nil || token != 3 {
		t.Fatalf("BeginRelease: %d, %v; want token 3", token, err)
	}
	if e := readEpoch(t, st, "orders"); e != (dedup.Epoch{N: 3, Releasing: true}) {
		t.Fatalf("during a release: %+v", e)
	}
	if e := readEpoch(t, st, "other"); e != (dedup.Epoch{}) {
		t.Fatalf("another scope during a release of orders: %+v", e)
	}
	if _, err := st.BeginRelease(ctx, "orders", time.Hour); !errors.Is(err, dedup.ErrReleaseInProgress) {
		t.Fatalf("a second release during the first: %v, want ErrReleaseInProgress", err)
	}
	if n, err := st.AdvanceEpoch(ctx, "orders"); err != nil || n != 4 {
		t.Fatalf("AdvanceEpoch during a release: %d, %v; want 4", n, err)
	}
	if e := readEpoch(t, st, "orders"); e != (dedup.Epoch{N: 4, Releasing: true}) {
		t.Fatalf("an advance ended the release: %+v", e)
	}
	if err := st.EndRelease(ctx, "orders", token); err != nil {
		t.Fatal(err)
	}
	if e := readEpoch(t, st, "orders"); e != (dedup.Epoch{N: 5}) {
		t.Fatalf("after the release: %+v", e)
	}
	if token, err := st.BeginRelease(ctx, "orders", time.Hour); err != nil || token != 6 {
		t.Fatalf("a release after the first ended: %d, %v; want token 6", token, err)
	}
}

func epochsHold(t *testing.T, st dedup.EpochStore) {
	ctx := ctxFor(t)
	first, err := st.BeginRelease(ctx, "orders", 50*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for readEpoch(t, st, "orders").Releasing {
		if time.Now().After(deadline) {
			t.Fatal("a release with a hold of 50ms still reads as in progress after 30s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	second, err := st.BeginRelease(ctx, "orders", time.Hour)
	if err != nil || second <= first {
		t.Fatalf("a release after the first one's hold ran out: %d, %v; want a token above %d", second, err, first)
	}
	if err := st.EndRelease(ctx, "orders", first); err != nil {
		t.Fatal(err)
	}
	if e := readEpoch(t, st, "orders"); !e.Releasing || e.N != second+1 {
		t.Fatalf("the first release ended late: %+v, want N %d and the second still in progress", e, second+1)
	}
	if err := st.EndRelease(ctx, "orders", second); err != nil {
		t.Fatal(err)
	}
	if e := readEpoch(t, st, "orders"); e != (dedup.Epoch{N: second + 2}) {
		t.Fatalf("after both: %+v", e)
	}
}

func epochsRace(t *testing.T, st dedup.EpochStore) {
	ctx := ctxFor(t)
	const n = 20
	var wg sync.WaitGroup
	got := make([]int64, n)
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i], errs[i] = st.AdvanceEpoch(ctx, "orders")
		}()
	}
	wg.Wait()
	seen := map[int64]bool{}
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("racing advances: %v", errs[i])
		}
		if seen[got[i]] {
			t.Fatalf("two racing advances returned epoch %d", got[i])
		}
		seen[got[i]] = true
	}
	if e := readEpoch(t, st, "orders"); e.N != n {
		t.Fatalf("after %d racing advances: %+v", n, e)
	}
	began := make([]bool, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := st.BeginRelease(ctx, "orders", time.Hour)
			began[i] = err == nil
			if err != nil && !errors.Is(err, dedup.ErrReleaseInProgress) {
				errs[i] = err
			}
		}()
	}
	wg.Wait()
	count := 0
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("racing releases: %v", errs[i])
		}
		if began[i] {
			count++
		}
	}
	if count != 1 {
		t.Fatalf("%d of %d racing releases began, want 1", count, n)
	}
}
