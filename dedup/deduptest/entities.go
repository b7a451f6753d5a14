package deduptest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/dedup"
)

// WatermarkStore is a store that keeps entity watermarks: dedup.Store for
// its transactions, dedup.Watermarks for the watermarks.
type WatermarkStore[TTx any] interface {
	dedup.Store[TTx]
	dedup.Watermarks[TTx]
}

// WatermarkFactory returns a fresh, empty, migrated store for one test,
// cleaned up by t.Cleanup, with cfg's lock timeout and scope retention.
// The store must be a dedup.Purger too.
type WatermarkFactory[TTx any] func(t *testing.T, cfg Config) WatermarkStore[TTx]

// RunWatermarks runs the conformance suite of dedup.Watermarks: every
// sentence of its contract — forward only (an equal version is stale), in
// order within one call, entities of one name apart in their scopes, a
// rollback that moves and records nothing, a second transaction on an
// entity that waits (bounded by the lock timeout) and then decides against
// what the first committed, no deadlock between transactions that take
// the same entities in other orders, names refused, the stale records and
// their filter, the committed watermark, and Purge.
func RunWatermarks[TTx any](t *testing.T, newStore WatermarkFactory[TTx]) {
	s := watermarkSuite[TTx]{newStore: newStore}
	t.Run("ForwardOnly", s.forwardOnly)
	t.Run("InOrderWithinCall", s.inOrder)
	t.Run("ScopesApart", s.scopesApart)
	t.Run("RollbackMovesNothing", s.rollback)
	t.Run("WaitIsBounded", s.waitBounded)
	t.Run("SecondTransactionWaits", s.secondWaits)
	t.Run("CrossedOrdersDoNotDeadlock", s.crossedOrders)
	t.Run("EventsValidated", s.validated)
	t.Run("StaleEvents", s.staleEvents)
	t.Run("WatermarkIsCommitted", s.committed)
	t.Run("PurgeForgetsExpired", s.purge)
}

type watermarkSuite[TTx any] struct{ newStore WatermarkFactory[TTx] }

func (s watermarkSuite[TTx]) store(t *testing.T, cfg Config) WatermarkStore[TTx] {
	t.Helper()
	if cfg.LockTimeout == 0 {
		cfg.LockTimeout = 5 * time.Second
	}
	st := s.newStore(t, cfg)
	if st == nil {
		t.Fatal("deduptest: the factory returned no store")
	}
	return st
}

// Event is an event of entity at version major.minor, under key id of
// scope.
func Event(scope, id, entity string, major, minor int64) dedup.EntityEvent {
	return dedup.EntityEvent{Key: dedup.Key{Scope: scope, ID: id}, Entity: entity, Version: dedup.Version{Major: major, Minor: minor}}
}

// advanceTx advances events in one committed transaction.
func advanceTx[TTx any](ctx context.Context, st WatermarkStore[TTx], events ...dedup.EntityEvent) ([]dedup.Advance, error) {
	res := make([]dedup.Advance, len(events))
	err := st.InTx(ctx, func(ctx context.Context, tx TTx) error {
		return st.AdvanceEntities(ctx, tx, events, res)
	})
	return res, err
}

// want is an expected Advance, written short: "apply" (no watermark),
// "apply 3.0" (over watermark 3.0), "stale 5.0".
func wantAdvance(t *testing.T, events []dedup.EntityEvent, got []dedup.Advance, want ...string) {
	t.Helper()
	for i, w := range want {
		verdict, mark, _ := strings.Cut(w, " ")
		a := got[i]
		have := "apply"
		if a.Stale {
			have = "stale"
		}
		if a.Had {
			have += " " + a.Watermark.String()
		} else if a.Watermark != (dedup.Version{}) {
			have += fmt.Sprintf(" (no watermark, but %v)", a.Watermark)
		}
		if want := strings.TrimSpace(verdict + " " + mark); have != want {
			t.Fatalf("event %d of %d (%s %s v%v): %q, want %q", i+1, len(events), events[i].Key.Scope, events[i].Entity, events[i].Version, have, want)
		}
	}
}

func mustAdvance[TTx any](t *testing.T, st WatermarkStore[TTx], events []dedup.EntityEvent, want ...string) {
	t.Helper()
	got, err := advanceTx(ctxFor(t), st, events...)
	if err != nil {
		t.Fatalf("AdvanceEntities %v: %v", events, err)
	}
	wantAdvance(t, events, got, want...)
}

// wantMark checks the committed watermark of entity in scope; "" is none.
func wantMark[TTx any](t *testing.T, st WatermarkStore[TTx], scope, entity, want string) {
	t.Helper()
	v, ok, err := st.Watermark(ctxFor(t), scope, entity)
	if err != nil {
		t.Fatalf("Watermark %s/%s: %v", scope, entity, err)
	}
	have := ""
	if ok {
		have = v.String()
	}
	if have != want {
		t.Fatalf("watermark of %s/%s: %q, want %q", scope, entity, have, want)
	}
}

func staleOf[TTx any](t *testing.T, st WatermarkStore[TTx], f dedup.StaleFilter) []dedup.StaleEvent {
	t.Helper()
	evs, err := st.StaleEvents(ctxFor(t), f)
	if err != nil {
		t.Fatalf("StaleEvents %+v: %v", f, err)
	}
	return evs
}

// forwardOnly: an entity without a watermark takes its first event's
// version; a higher version (Major, then Minor) moves it; an equal or a
// lower one is stale and moves nothing.
func (s watermarkSuite[TTx]) forwardOnly(t *testing.T) {
	st := s.store(t, Config{})
	ev := func(id string, major, minor int64) []dedup.EntityEvent {
		return []dedup.EntityEvent{Event("trades", id, "T1", major, minor)}
	}
	wantMark(t, st, "trades", "T1", "")
	mustAdvance(t, st, ev("k1", 2, 0), "apply")
	wantMark(t, st, "trades", "T1", "2.0")
	mustAdvance(t, st, ev("k2", 2, 1), "apply 2.0")
	mustAdvance(t, st, ev("k3", 2, 1), "stale 2.1") // equal: stale
	mustAdvance(t, st, ev("k4", 2, 0), "stale 2.1")
	mustAdvance(t, st, ev("k5", 1, 99), "stale 2.1")
	mustAdvance(t, st, ev("k6", 3, -5), "apply 2.1")
	wantMark(t, st, "trades", "T1", "3.-5")
	mustAdvance(t, st, ev("k7", -1, 0), "stale 3.-5")
	if n := len(staleOf(t, st, dedup.StaleFilter{})); n != 4 {
		t.Fatalf("%d stale events recorded, want 4", n)
	}
}

// inOrder: the events of one entity in one call meet the watermark the
// earlier ones left; entities interleaved in one call keep apart.
func (s watermarkSuite[TTx]) inOrder(t *testing.T) {
	st := s.store(t, Config{})
	mustAdvance(t, st, []dedup.EntityEvent{Event("trades", "k1", "A", 5, 0), Event("trades", "k2", "A", 3, 0)},
		"apply", "stale 5.0")
	wantMark(t, st, "trades", "A", "5.0")
	mustAdvance(t, st, []dedup.EntityEvent{Event("trades", "k3", "B", 3, 0), Event("trades", "k4", "B", 5, 0)},
		"apply", "apply 3.0")
	wantMark(t, st, "trades", "B", "5.0")
	mustAdvance(t, st, []dedup.EntityEvent{Event("trades", "k5", "C", 7, 0), Event("trades", "k5", "C", 7, 0)},
		"apply", "stale 7.0")

	// Three entities interleaved, each with a history; the entity names
	// are given out of their canonical order.
	events := []dedup.EntityEvent{
		Event("trades", "m1", "Z", 1, 0),
		Event("trades", "m2", "A", 6, 0),
		Event("trades", "m3", "M", 4, 0),
		Event("trades", "m4", "Z", 3, 0),
		Event("trades", "m5", "A", 5, 9),
		Event("trades", "m6", "M", 4, 0),
		Event("trades", "m7", "Z", 2, 0),
		Event("trades", "m8", "A", 7, 0),
		Event("trades", "m9", "M", 4, 1),
	}
	mustAdvance(t, st, events,
		"apply", "apply 5.0", "apply", "apply 1.0", "stale 6.0", "stale 4.0", "stale 3.0", "apply 6.0", "apply 4.0")
	wantMark(t, st, "trades", "Z", "3.0")
	wantMark(t, st, "trades", "A", "7.0")
	wantMark(t, st, "trades", "M", "4.1")
}

// scopesApart: an entity is named within its key's scope: one name in two
// scopes is two entities.
func (s watermarkSuite[TTx]) scopesApart(t *testing.T) {
	st := s.store(t, Config{})
	mustAdvance(t, st, []dedup.EntityEvent{Event("orders", "k1", "E", 5, 0), Event("refunds", "k1", "E", 3, 0)},
		"apply", "apply")
	mustAdvance(t, st, []dedup.EntityEvent{Event("refunds", "k2", "E", 4, 0), Event("orders", "k2", "E", 4, 0)},
		"apply 3.0", "stale 5.0")
	wantMark(t, st, "orders", "E", "5.0")
	wantMark(t, st, "refunds", "E", "4.0")
	wantMark(t, st, "payouts", "E", "")
	if evs := staleOf(t, st, dedup.StaleFilter{Scope: "refunds"}); len(evs) != 0 {
		t.Fatalf("stale events of scope refunds: %+v, want none", evs)
	}
}

// rollback: a rolled-back transaction moved no watermark, set none, and
// recorded no stale event; the same events then decide as if it had never
// run.
func (s watermarkSuite[TTx]) rollback(t *testing.T) {
	st, ctx := s.store(t, Config{}), ctxFor(t)
	mustAdvance(t, st, []dedup.EntityEvent{Event("trades", "k1", "OLD", 5, 0)}, "apply")
	events := []dedup.EntityEvent{Event("trades", "k2", "OLD", 9, 0), Event("trades", "k3", "NEW", 1, 0), Event("trades", "k4", "OLD", 4, 0)}
	res := make([]dedup.Advance, len(events))
	err := st.InTx(ctx, func(ctx context.Context, tx TTx) error {
		if err := st.AdvanceEntities(ctx, tx, events, res); err != nil {
			return err
		}
		return errRollback
	})
	if !errors.Is(err, errRollback) {
		t.Fatalf("rolled-back transaction: %v", err)
	}
	wantAdvance(t, events, res, "apply 5.0", "apply", "stale 9.0")
	wantMark(t, st, "trades", "OLD", "5.0")
	wantMark(t, st, "trades", "NEW", "")
	if evs := staleOf(t, st, dedup.StaleFilter{}); len(evs) != 0 {
		t.Fatalf("stale events after a rollback: %+v, want none", evs)
	}
	mustAdvance(t, st, events, "apply 5.0", "apply", "stale 9.0")
	wantMark(t, st, "trades", "OLD", "9.0")
	wantMark(t, st, "trades", "NEW", "1.0")
}

// holdEntities advances events in a transaction that stays open until
// release is closed; it commits unless rollback is set. ready is closed
// once the events are advanced.
func holdEntities[TTx any](ctx context.Context, st WatermarkStore[TTx], events []dedup.EntityEvent, rollback bool, ready, release chan struct{}) <-chan error {
	done := make(chan error, 1)
	go func() {
		done <- st.InTx(ctx, func(ctx context.Context, tx TTx) error {
			err := st.AdvanceEntities(ctx, tx, events, make([]dedup.Advance, len(events)))
			close(ready)
			if err != nil {
				return err
			}
			<-release
			if rollback {
				return errRollback
			}
			return nil
		})
	}()
	return done
}

// releaser returns a holder's release channel and end, which closes it
// once; t's cleanup ends it too, so that a holder never outlives a failed
// test.
func releaser(t *testing.T) (release chan struct{}, end func()) {
	release = make(chan struct{})
	var once sync.Once
	end = func() { once.Do(func() { close(release) }) }
	t.Cleanup(end)
	return release, end
}

// waitBounded: a transaction that advances an entity another uncommitted
// transaction advanced waits at most the lock timeout, then fails with
// ErrInFlight (a store whose lock is the database's, SQLite, reports the
// database busy); after the holder committed, it decides against the
// holder's watermark.
func (s watermarkSuite[TTx]) waitBounded(t *testing.T) {
	st, ctx := s.store(t, Config{LockTimeout: 200 * time.Millisecond}), ctxFor(t)
	ready := make(chan struct{})
	release, end := releaser(t)
	done := holdEntities(ctx, st, []dedup.EntityEvent{Event("trades", "k1", "T1", 5, 0)}, false, ready, release)
	<-ready
	_, err := advanceTx(ctx, st, Event("trades", "k2", "T1", 6, 0))
	if !errors.Is(err, dedup.ErrInFlight) && !errors.Is(err, dedup.ErrStoreBusy) {
		t.Errorf("advance of an entity held by an open transaction: %v, want ErrInFlight (or ErrStoreBusy)", err)
	}
	if err != nil && st.ClassifyError(err) == dedup.ClassPermanent {
		t.Errorf("in-flight error classified permanent: %v", err)
	}
	end()
	if err := <-done; err != nil {
		t.Fatalf("holder: %v", err)
	}
	mustAdvance(t, st, []dedup.EntityEvent{Event("trades", "k2", "T1", 6, 0)}, "apply 5.0")
}

// secondWaits: transactions that advance an entity an open transaction
// advanced wait for it, then decide against what it committed (v4 is stale
// against its 5, v6 applies over it), or, when it rolled back, against the
// watermark before it.
func (s watermarkSuite[TTx]) secondWaits(t *testing.T) {
	for _, rollback := range []bool{false, true} {
		t.Run(map[bool]string{false: "Commit", true: "Rollback"}[rollback], func(t *testing.T) {
			st, ctx := s.store(t, Config{LockTimeout: 30 * time.Second}), ctxFor(t)
			mustAdvance(t, st, []dedup.EntityEvent{Event("trades", "k0", "T1", 1, 0)}, "apply")
			ready := make(chan struct{})
			release, end := releaser(t)
			done := holdEntities(ctx, st, []dedup.EntityEvent{Event("trades", "k1", "T1", 5, 0)}, rollback, ready, release)
			<-ready
			type out struct {
				res []dedup.Advance
				err error
			}
			v4, v6 := make(chan out, 1), make(chan out, 1)
			for _, c := range []struct {
				major int64
				to    chan out
			}{{4, v4}, {6, v6}} {
				go func() {
					res, err := advanceTx(ctx, st, Event("trades", fmt.Sprint("k", c.major), "T1", c.major, 0))
					c.to <- out{res, err}
				}()
			}
			// The waiters must not decide while the holder is open: a
			// window to see one that does not wait.
			select {
			case o := <-v4:
				t.Fatalf("v4 decided while the holder of T1 was open: %+v, %v", o.res, o.err)
			case o := <-v6:
				t.Fatalf("v6 decided while the holder of T1 was open: %+v, %v", o.res, o.err)
			case <-time.After(100 * time.Millisecond):
			}
			end()
			if err := <-done; err != nil && !(rollback && errors.Is(err, errRollback)) {
				t.Fatalf("holder: %v", err)
			}
			a, b := <-v4, <-v6
			if a.err != nil || b.err != nil {
				t.Fatalf("waiters: %v, %v", a.err, b.err)
			}
			if !rollback {
				// v4 is stale against the holder's 5, or against 6 if v6
				// went first; v6 applies over 5 either way.
				if w := a.res[0].Watermark; !a.res[0].Stale || !a.res[0].Had || w != (dedup.Version{Major: 5}) && w != (dedup.Version{Major: 6}) {
					t.Fatalf("v4 after the holder committed 5: %+v, want stale against 5.0 (or 6.0)", a.res[0])
				}
				wantAdvance(t, []dedup.EntityEvent{Event("trades", "k6", "T1", 6, 0)}, b.res, "apply 5.0")
				wantMark(t, st, "trades", "T1", "6.0")
				return
			}
			// Without the holder's 5, v4 and v6 both apply over 1 in
			// whichever order they went, or v4 is stale if v6 went first.
			wantMark(t, st, "trades", "T1", "6.0")
			if a.res[0].Stale && (a.res[0].Watermark != dedup.Version{Major: 6}) ||
				!a.res[0].Stale && (a.res[0].Watermark != dedup.Version{Major: 1}) {
				t.Fatalf("v4 after a rolled-back holder: %+v, want applied over 1.0 or stale against 6.0", a.res[0])
			}
			if b.res[0].Stale || !b.res[0].Had || b.res[0].Watermark.Major != 1 && b.res[0].Watermark.Major != 4 {
				t.Fatalf("v6 after a rolled-back holder: %+v, want applied over 1.0 or 4.0", b.res[0])
			}
		})
	}
}

// crossedOrders: transactions that advance one set of entities given in
// different orders ({a,b} and {b,a}, and random subsets of more) never
// deadlock: the store takes the entities in one canonical order. No
// version is lost: each entity's watermark ends at its highest version,
// and every event is either applied or recorded stale.
func (s watermarkSuite[TTx]) crossedOrders(t *testing.T) {
	st, ctx := s.store(t, Config{LockTimeout: 20 * time.Second}), ctxFor(t)
	const workers, rounds = 4, 25
	names := []string{"a", "b", "c", "d", "e"}
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		stale  = map[string]int{}
		errs   []error
		events int
	)
	for w := range workers {
		wg.Go(func() {
			for r := range rounds {
				// Worker w takes the names rotated by w, forwards or
				// backwards: a,b,... against b,a,... and so on.
				var evs []dedup.EntityEvent
				for i := range names {
					n := names[(w+i)%len(names)]
					if w%2 == 1 {
						n = names[(len(names)+w-i)%len(names)]
					}
					evs = append(evs, Event("crossed", fmt.Sprintf("w%d-r%d-%s", w, r, n), n, int64(r*workers+w), 0))
				}
				res, err := advanceTx(ctx, st, evs...)
				mu.Lock()
				if err != nil {
					errs = append(errs, err)
				} else {
					events += len(evs)
					for i, a := range res {
						if a.Stale {
							stale[evs[i].Entity]++
						}
					}
				}
				mu.Unlock()
				if err != nil {
					return
				}
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		t.Errorf("advance of crossed entity sets: %v", err)
	}
	if len(errs) > 0 {
		return
	}
	for _, n := range names {
		wantMark(t, st, "crossed", n, fmt.Sprintf("%d.0", (rounds-1)*workers+workers-1))
		if got := len(staleOf(t, st, dedup.StaleFilter{Scope: "crossed", Entity: n, Limit: 1000})); got != stale[n] {
			t.Errorf("entity %s: %d stale events recorded, %d reported stale", n, got, stale[n])
		}
	}
	if events != workers*rounds*len(names) {
		t.Fatalf("%d events decided, want %d", events, workers*rounds*len(names))
	}
}

// validated: an event with an empty or a longer than 200-byte entity, or
// an invalid key, is refused with an error, and nothing of its call is
// kept; 200 bytes are accepted. Fewer results than events is an error.
func (s watermarkSuite[TTx]) validated(t *testing.T) {
	st, ctx := s.store(t, Config{}), ctxFor(t)
	for _, bad := range []dedup.EntityEvent{
		Event("trades", "k1", strings.Repeat("x", 201), 1, 0),
		Event("trades", "k1", "", 1, 0),
		Event("", "k1", "T1", 1, 0),
		Event("trades", "", "T1", 1, 0),
	} {
		_, err := advanceTx(ctx, st, Event("trades", "k0", "T1", 1, 0), bad)
		if err == nil {
			t.Fatalf("AdvanceEntities of %s/%s entity %.20q: no error, want it refused", bad.Key.Scope, bad.Key.ID, bad.Entity)
		}
		if bad.Entity != "" && len(bad.Entity) > 200 && !strings.Contains(err.Error(), "entity") {
			t.Errorf("refusal of a 201-byte entity: %q, want an error that names the entity", err)
		}
		wantMark(t, st, "trades", "T1", "")
	}
	long := strings.Repeat("é", 100) // 200 bytes
	mustAdvance(t, st, []dedup.EntityEvent{Event("trades", "k1", long, 1, 0)}, "apply")
	mustAdvance(t, st, []dedup.EntityEvent{Event("trades", "k2", long, 1, 0)}, "stale 1.0")
	if evs := staleOf(t, st, dedup.StaleFilter{Entity: long}); len(evs) != 1 || evs[0].Entity != long {
		t.Fatalf("stale events of the 200-byte entity: %+v", evs)
	}
	err := st.InTx(ctx, func(ctx context.Context, tx TTx) error {
		return st.AdvanceEntities(ctx, tx, []dedup.EntityEvent{Event("trades", "k3", "T1", 1, 0)}, nil)
	})
	if err == nil {
		t.Fatal("AdvanceEntities with no room for results: no error")
	}
	wantMark(t, st, "trades", "T1", "")
}

// staleEvents: a stale event is recorded with its key, entity, version and
// the watermark it met, at the store's time; StaleEvents lists them newest
// first (within one call, the later event first), by scope, by entity, by
// both, and at most Limit.
func (s watermarkSuite[TTx]) staleEvents(t *testing.T) {
	st := s.store(t, Config{})
	before := time.Now()
	mustAdvance(t, st, []dedup.EntityEvent{Event("trades", "k1", "T1", 5, 2), Event("refunds", "k1", "T1", 8, 0), Event("trades", "k1", "T2", 1, 0)},
		"apply", "apply", "apply")
	mustAdvance(t, st, []dedup.EntityEvent{Event("trades", "k2", "T1", 4, 0)}, "stale 5.2")
	mustAdvance(t, st, []dedup.EntityEvent{
		Event("refunds", "k3", "T1", 8, 0),
		Event("trades", "k4", "T2", 1, 0),
		Event("trades", "k5", "T1", 5, 1),
	}, "stale 8.0", "stale 1.0", "stale 5.2")
	all := staleOf(t, st, dedup.StaleFilter{})
	wantList := func(what string, got []dedup.StaleEvent, want ...dedup.StaleEvent) {
		t.Helper()
		if len(got) != len(want) {
			t.Fatalf("%s: %d stale events %+v, want %d", what, len(got), got, len(want))
		}
		for i, w := range want {
			g := got[i]
			if g.Key != w.Key || g.Entity != w.Entity || g.Version != w.Version || g.Watermark != w.Watermark {
				t.Fatalf("%s: event %d is %+v, want %+v (all: %+v)", what, i+1, g, w, got)
			}
		}
	}
	stale := func(scope, id, entity string, v, w dedup.Version) dedup.StaleEvent {
		return dedup.StaleEvent{Key: dedup.Key{Scope: scope, ID: id}, Entity: entity, Version: v, Watermark: w}
	}
	k2 := stale("trades", "k2", "T1", dedup.Version{Major: 4}, dedup.Version{Major: 5, Minor: 2})
	k3 := stale("refunds", "k3", "T1", dedup.Version{Major: 8}, dedup.Version{Major: 8})
	k4 := stale("trades", "k4", "T2", dedup.Version{Major: 1}, dedup.Version{Major: 1})
	k5 := stale("trades", "k5", "T1", dedup.Version{Major: 5, Minor: 1}, dedup.Version{Major: 5, Minor: 2})
	wantList("all", all, k5, k4, k3, k2)
	for i, e := range all {
		if e.At.IsZero() || e.At.Before(before.Add(-time.Minute)) || e.At.After(time.Now().Add(time.Minute)) {
			t.Fatalf("stale event %d recorded at %v, want about now", i+1, e.At)
		}
		if i > 0 && e.At.After(all[i-1].At) {
			t.Fatalf("stale event %d at %v after event %d at %v: want newest first", i+1, e.At, i, all[i-1].At)
		}
	}
	wantList("scope trades", staleOf(t, st, dedup.StaleFilter{Scope: "trades"}), k5, k4, k2)
	wantList("entity T1", staleOf(t, st, dedup.StaleFilter{Entity: "T1"}), k5, k3, k2)
	wantList("trades/T1", staleOf(t, st, dedup.StaleFilter{Scope: "trades", Entity: "T1"}), k5, k2)
	wantList("limit 2", staleOf(t, st, dedup.StaleFilter{Limit: 2}), k5, k4)
	wantList("payouts", staleOf(t, st, dedup.StaleFilter{Scope: "payouts"}))
}

// committed: Watermark reads the committed watermark: not the one an open
// transaction moved, until it commits.
func (s watermarkSuite[TTx]) committed(t *testing.T) {
	st, ctx := s.store(t, Config{}), ctxFor(t)
	mustAdvance(t, st, []dedup.EntityEvent{Event("trades", "k1", "T1", 1, 0)}, "apply")
	ready := make(chan struct{})
	release, end := releaser(t)
	done := holdEntities(ctx, st, []dedup.EntityEvent{Event("trades", "k2", "T1", 2, 0), Event("trades", "k2", "T2", 1, 0)}, false, ready, release)
	<-ready
	wantMark(t, st, "trades", "T1", "1.0")
	wantMark(t, st, "trades", "T2", "")
	end()
	if err := <-done; err != nil {
		t.Fatalf("holder: %v", err)
	}
	wantMark(t, st, "trades", "T1", "2.0")
	wantMark(t, st, "trades", "T2", "1.0")
}

// purge: a watermark untouched, and a stale record kept, for longer than
// its scope's retention are purged — the entity's next event applies as
// its first — while those of a scope kept for ever stay.
func (s watermarkSuite[TTx]) purge(t *testing.T) {
	st := s.store(t, Config{ScopeRetention: map[string]time.Duration{"short": time.Millisecond}})
	ctx := ctxFor(t)
	p, ok := any(st).(dedup.Purger)
	if !ok {
		t.Fatal("deduptest: the store is not a dedup.Purger")
	}
	for _, scope := range []string{"short", "kept"} {
		mustAdvance(t, st, []dedup.EntityEvent{Event(scope, "k1", "T1", 5, 0), Event(scope, "k2", "T1", 4, 0)}, "apply", "stale 5.0")
	}
	deleted := 0
	eventually(t, "the watermark and the stale record of scope short to be purged", func() bool {
		n, err := p.Purge(ctx, 100)
		if err != nil {
			t.Fatal(err)
		}
		deleted += n
		_, ok, err := st.Watermark(ctx, "short", "T1")
		if err != nil {
			t.Fatal(err)
		}
		return !ok && len(staleOf(t, st, dedup.StaleFilter{Scope: "short"})) == 0
	})
	if deleted < 2 {
		t.Fatalf("Purge reported %d deleted, want the watermark and the stale record counted", deleted)
	}
	wantMark(t, st, "kept", "T1", "5.0")
	if n := len(staleOf(t, st, dedup.StaleFilter{Scope: "kept"})); n != 1 {
		t.Fatalf("stale records of the kept scope after Purge: %d, want 1", n)
	}
	mustAdvance(t, st, []dedup.EntityEvent{Event("short", "k3", "T1", 3, 0)}, "apply")
}
