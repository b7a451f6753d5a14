package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/consumer/wire"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/memstore"
)

// tradeEvent is a status event of a trade: its own event ID (the dedup
// key) and the trade's version.
func tradeEvent(event, trade string, ver int) string {
	return fmt.Sprintf(`{"event":%q,"trade":%q,"ver":%d}`, event, trade, ver)
}

// byTrade is Config.Entity for tradeEvent: the trade, its version.
func byTrade(m *consumer.Message) (consumer.Entity, error) {
	trade, err := consumer.ByJSONField("trade")(m)
	if err != nil {
		return consumer.Entity{}, err
	}
	v, err := consumer.ByJSONField("ver")(m)
	if err != nil {
		return consumer.Entity{}, err
	}
	var n int64
	if _, err := fmt.Sscan(v, &n); err != nil {
		return consumer.Entity{}, fmt.Errorf("ver %q: %w", v, err)
	}
	return consumer.Entity{Name: trade, Version: dedup.Version{Major: n}}, nil
}

// tradeLog records, per trade, the versions applied, in commit order.
type tradeLog struct {
	mu      sync.Mutex
	applied map[string][]int
	calls   map[string]int // handler calls per event
}

func newTradeLog() *tradeLog { return &tradeLog{applied: map[string][]int{}, calls: map[string]int{}} }

func (l *tradeLog) handle(_ context.Context, tx *memstore.Tx, m *consumer.Message) error {
	e, err := byTrade(m)
	if err != nil {
		return err
	}
	ev, _ := consumer.ByJSONField("event")(m)
	l.mu.Lock()
	l.calls[ev]++
	l.mu.Unlock()
	tx.OnCommit(func() {
		l.mu.Lock()
		l.applied[e.Name] = append(l.applied[e.Name], int(e.Version.Major))
		l.mu.Unlock()
	})
	return nil
}

// check fails t unless every trade's applied versions rise and end at
// want[trade]; it returns how many events were applied.
func (l *tradeLog) check(t *testing.T, want map[string]int) int {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for trade, top := range want {
		vs := l.applied[trade]
		n += len(vs)
		for i := 1; i < len(vs); i++ {
			if vs[i] <= vs[i-1] {
				t.Errorf("trade %s: version %d applied after %d: %v", trade, vs[i], vs[i-1], vs)
			}
		}
		if len(vs) == 0 || vs[len(vs)-1] != top {
			t.Errorf("trade %s: applied %v, want the newest, %d, last", trade, vs, top)
		}
	}
	return n
}

// tradeStream makes events of trades trades with versions 1..versions,
// shuffled, some re-sent (the same event) and some repeated at an equal
// version (another event): record key = trade, so that key lanes keep a
// trade together. It returns the messages, the newest version of each
// trade, and how many distinct events there are.
func tradeStream(seed uint64, trades, versions int) ([]*consumer.Message, map[string]int, int) {
	rng := rand.New(rand.NewPCG(seed, seed))
	type ev struct {
		id, trade string
		ver       int
	}
	var evs []ev
	newest := map[string]int{}
	for t := range trades {
		trade := fmt.Sprintf("trade-%02d", t)
		for v := 1; v <= versions; v++ {
			evs = append(evs, ev{fmt.Sprintf("%s-v%d", trade, v), trade, v})
			if rng.IntN(4) == 0 { // a notification sent twice at one version, as a new event
				evs = append(evs, ev{fmt.Sprintf("%s-v%d-again", trade, v), trade, v})
			}
		}
		newest[trade] = versions
	}
	distinct := len(evs)
	rng.Shuffle(len(evs), func(i, j int) { evs[i], evs[j] = evs[j], evs[i] })
	for i := range len(evs) / 4 { // re-sends, late
		evs = append(evs, evs[rng.IntN(len(evs)-i)])
	}
	msgs := make([]*consumer.Message, len(evs))
	for i, e := range evs {
		msgs[i] = consumertest.Message("trades", 0, int64(i), e.trade, tradeEvent(e.id, e.trade, e.ver))
	}
	return msgs, newest, distinct
}

func entityConfig(h consumer.HandlerFunc[*memstore.Tx]) consumer.Config[*memstore.Tx] {
	cfg := baseConfig(h)
	cfg.Key = consumer.ByJSONField("event")
	cfg.Entity = byTrade
	return cfg
}

// TestEntityAppliesEachTradeInVersionOrder: trades' events shuffled,
// re-sent and repeated at equal versions, delivered up to twice across
// crashes, in batches of 1 and 100, with and without key lanes: each
// trade's applied versions rise and end at its newest, every event is
// applied or counted stale, and the handler never sees a stale one.
func TestEntityAppliesEachTradeInVersionOrder(t *testing.T) {
	for _, tc := range []struct {
		name            string
		batch, keyLanes int
	}{{"batch=1", 1, 0}, {"batch=100", 100, 0}, {"batch=10/keylanes=4", 10, 4}} {
		t.Run(tc.name, func(t *testing.T) {
			log := newTradeLog()
			cfg := entityConfig(log.handle)
			cfg.BatchSize, cfg.KeyLanes = tc.batch, tc.keyLanes
			msgs, newest, distinct := tradeStream(7, 12, 8)
			res := consumertest.Run(t, cfg, consumertest.Script{MinDeliveries: 1, MaxDeliveries: 2, CrashAfterCommitEvery: 9}, msgs...)
			applied := log.check(t, newest)
			if got := res.Stats.Applied + res.Stats.Stale; got < int64(distinct) {
				t.Errorf("applied %d + stale %d = %d, want at least the %d events (%v)", res.Stats.Applied, res.Stats.Stale, got, distinct, res)
			}
			if int64(applied) != res.Stats.Applied {
				t.Errorf("%d versions committed, Stats.Applied %d", applied, res.Stats.Applied)
			}
			if res.Stats.Stale == 0 {
				t.Errorf("no stale event in a shuffled stream (%v)", res)
			}
			if len(res.DeadLetters) != 0 {
				t.Errorf("%d dead letters, want none: %v", len(res.DeadLetters), res.DeadLetters[0].Reason)
			}
		})
	}
}

// TestEntityStaleDeadLetter: with StaleDeadLetter each stale event is
// dead-lettered with CauseStale, its letter naming the entity, its
// version and the watermark; neither Handler nor BatchHandler sees one.
func TestEntityStaleDeadLetter(t *testing.T) {
	for _, batch := range []bool{false, true} {
		t.Run(fmt.Sprintf("batchHandler=%v", batch), func(t *testing.T) {
			log := newTradeLog()
			cfg := entityConfig(log.handle)
			if batch {
				cfg.Handler = nil
				cfg.BatchHandler = consumer.BatchHandlerFunc[*memstore.Tx](func(ctx context.Context, tx *memstore.Tx, ms []*consumer.Message) error {
					for _, m := range ms {
						if err := log.handle(ctx, tx, m); err != nil {
							return err
						}
					}
					return nil
				})
			}
			cfg.Stale = consumer.StaleDeadLetter
			msgs := []*consumer.Message{
				consumertest.Message("trades", 0, 0, "t1", tradeEvent("a", "t1", 2)),
				consumertest.Message("trades", 0, 1, "t1", tradeEvent("b", "t1", 1)), // late
				consumertest.Message("trades", 0, 2, "t1", tradeEvent("c", "t1", 3)),
				consumertest.Message("trades", 0, 3, "t1", tradeEvent("d", "t1", 3)), // equal
				consumertest.Message("trades", 0, 4, "t1", tradeEvent("a", "t1", 2)), // re-sent: a duplicate
			}
			res := consumertest.Run(t, cfg, consumertest.Script{}, msgs...)
			log.check(t, map[string]int{"t1": 3})
			if log.calls["b"] != 0 || log.calls["d"] != 0 {
				t.Errorf("stale events handled: b %d, d %d", log.calls["b"], log.calls["d"])
			}
			want := map[string]string{"b": "1.0 2.0", "d": "3.0 3.0"}
			if len(res.DeadLetters) != len(want) {
				t.Fatalf("%d dead letters, want %d", len(res.DeadLetters), len(want))
			}
			for _, l := range res.DeadLetters {
				ev, _ := consumer.ByJSONField("event")(l.Message)
				if l.Cause != consumer.CauseStale || !errors.Is(l.Reason, consumer.ErrStale) || l.Entity.Name != "t1" {
					t.Errorf("letter of %s: cause %v, entity %q, reason %v", ev, l.Cause, l.Entity.Name, l.Reason)
				}
				if got := l.Entity.Version.String() + " " + l.Watermark.String(); got != want[ev] {
					t.Errorf("letter of %s: version and watermark %s, want %s", ev, got, want[ev])
				}
				headers, _ := wire.Letter(l).Record(1 << 20)
				if !hasHeader(headers, wire.MetaCause, "stale") || !hasHeader(headers, wire.MetaEntityWatermark, l.Watermark.String()) {
					t.Errorf("letter of %s: headers %v lack the cause or the watermark", ev, headers)
				}
			}
			if res.Stats.Duplicates != 1 || res.Stats.Stale != 0 {
				t.Errorf("duplicates %d (want 1), stale skipped %d (want 0)", res.Stats.Duplicates, res.Stats.Stale)
			}
		})
	}
}

func hasHeader(hs []consumer.Header, k, v string) bool {
	for _, h := range hs {
		if h.Key == k && string(h.Value) == v {
			return true
		}
	}
	return false
}

// TestEntityRolledBackAttemptDecidesAgain: v5 then v3 of one trade in one
// batch; v5's handler fails for good. The first attempt found v3 stale
// (after v5), but it rolled back: v3 must be decided again, against no
// watermark, and applied.
func TestEntityRolledBackAttemptDecidesAgain(t *testing.T) {
	log := newTradeLog()
	cfg := entityConfig(func(ctx context.Context, tx *memstore.Tx, m *consumer.Message) error {
		if ev, _ := consumer.ByJSONField("event")(m); ev == "v5" {
			return consumer.Permanent(errors.New("the ledger refuses v5"))
		}
		return log.handle(ctx, tx, m)
	})
	cfg.BatchSize = 10
	res := consumertest.Run(t, cfg, consumertest.Script{},
		consumertest.Message("trades", 0, 0, "t1", tradeEvent("v5", "t1", 5)),
		consumertest.Message("trades", 0, 1, "t1", tradeEvent("v3", "t1", 3)))
	log.check(t, map[string]int{"t1": 3})
	if len(res.DeadLetters) != 1 || res.DeadLetters[0].Cause != consumer.CausePermanent {
		t.Errorf("dead letters %v, want v5's, permanent", res.DeadLetters)
	}
	if res.Stats.Stale != 0 {
		t.Errorf("%d stale, want 0: v3 met the watermark of a rolled-back v5", res.Stats.Stale)
	}
}

// TestEntityErrorDeadLetters: an Entity function's error dead-letters its
// message as bad input, saying which message and why.
func TestEntityErrorDeadLetters(t *testing.T) {
	log := newTradeLog()
	cfg := entityConfig(log.handle)
	res := consumertest.Run(t, cfg, consumertest.Script{},
		consumertest.Message("trades", 0, 0, "t1", `{"event":"x","trade":"t1"}`))
	if len(res.DeadLetters) != 1 {
		t.Fatalf("%d dead letters, want 1", len(res.DeadLetters))
	}
	l := res.DeadLetters[0]
	if l.Cause != consumer.CauseBadInput || !strings.Contains(l.Reason.Error(), "entity of message trades/0/0") {
		t.Errorf("letter: cause %v, reason %v", l.Cause, l.Reason)
	}
}

// plainStore is a Store without entity watermarks.
type plainStore struct{ dedup.Store[*memstore.Tx] }

func TestEntityNeedsWatermarks(t *testing.T) {
	cfg := entityConfig(newTradeLog().handle)
	cfg.Store = plainStore{memstore.New(memstore.Config{})}
	cfg.Source, cfg.DeadLetter = consumertest.NewSource(consumertest.Script{}), &consumertest.DeadLetters{}
	_, err := consumer.New(cfg)
	if err == nil || !strings.Contains(err.Error(), "Config.Entity is set, but Store (consumer_test.plainStore) keeps no entity watermarks") {
		t.Fatalf("New: %v", err)
	}
	cfg = baseConfig(newTradeLog().handle)
	cfg.Source, cfg.DeadLetter = consumertest.NewSource(consumertest.Script{}), &consumertest.DeadLetters{}
	cfg.Stale = consumer.StaleDeadLetter
	if _, err := consumer.New(cfg); err == nil || !strings.Contains(err.Error(), "Config.Stale is set without Entity") {
		t.Fatalf("New: %v", err)
	}
}

// TestEntityTravelsWithARetryCopy: the entity is named from the topic
// and versioned by the record's time, as a channel's notifications are
// when they carry no sequence. v1's handler fails once and v1 goes to
// retry; v2 applies meanwhile. The copy comes back on "pay.retry", a
// record of its own with a later time: ordered by what the function makes
// of it, it would pass v2 and apply. It carries the entity and version
// decided at v1's first delivery, and is stale.
func TestEntityTravelsWithARetryCopy(t *testing.T) {
	log := newTradeLog()
	var mu sync.Mutex
	failed := false
	cfg := baseConfig(func(ctx context.Context, tx *memstore.Tx, m *consumer.Message) error {
		ev, _ := consumer.ByJSONField("event")(m)
		mu.Lock()
		first := ev == "v1" && !failed
		failed = failed || first
		mu.Unlock()
		if first {
			return consumer.Retryable(errors.New("the ledger is away"))
		}
		return log.handle(ctx, tx, m)
	})
	cfg.Key = consumer.ByJSONField("event")
	cfg.Entity = func(m *consumer.Message) (consumer.Entity, error) {
		trade, err := consumer.ByJSONField("trade")(m)
		return consumer.Entity{Name: m.Topic + "/" + trade, Version: dedup.Version{Major: m.Time.UnixNano()}}, err
	}
	base := consumertest.NewSource(consumertest.Script{})
	src := &retrySource{Source: base, lineage: true}
	sink := &retrySink{src: src}
	dl := &consumertest.DeadLetters{}
	cfg.Source, cfg.DeadLetter, cfg.Clock = src, dl, consumertest.NewClock()
	cfg.BatchSize = 1
	cfg.Retries = consumer.NonBlocking{Attempts: 1, Delays: []time.Duration{10 * time.Millisecond}, Sink: sink}
	cfg.Stale = consumer.StaleDeadLetter
	c, err := consumer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now().Add(-time.Hour)
	v1 := consumertest.Message("pay", 0, 0, "t1", tradeEvent("v1", "t1", 1))
	v2 := consumertest.Message("pay", 0, 1, "t1", tradeEvent("v2", "t1", 2))
	v1.Time, v2.Time = t0, t0.Add(time.Second)
	base.Push(v1, v2)
	drive(t, c, base)
	want := consumer.Entity{Name: "pay/t1", Version: dedup.Version{Major: t0.UnixNano()}}
	if trips := sink.trips(); len(trips) != 1 || trips[0].Entity != want {
		t.Fatalf("retry copies %+v, want one of v1, entity %v", trips, want)
	}
	log.check(t, map[string]int{"t1": 2})
	letters := dl.Letters()
	if len(letters) != 1 || letters[0].Cause != consumer.CauseStale || letters[0].Entity != want {
		t.Fatalf("dead letters %+v, want v1's copy, stale, entity %v", letters, want)
	}
}

// TestEntityTravelsWithARedrivenLetter: versions by the record's time; v1
// is rejected and dead-lettered, v2 applies, and the operator redrives
// v1's letter: the copy lies at a new offset with a later time. It is
// ordered by the entity and version its letter carries, and is stale.
func TestEntityTravelsWithARedrivenLetter(t *testing.T) {
	log := newTradeLog()
	var mu sync.Mutex
	fixed := false
	cfg := entityConfig(func(ctx context.Context, tx *memstore.Tx, m *consumer.Message) error {
		ev, _ := consumer.ByJSONField("event")(m)
		mu.Lock()
		reject := ev == "v1" && !fixed
		mu.Unlock()
		if reject {
			return consumer.Reject(errors.New("the ledger refuses v1 until the fix"))
		}
		return log.handle(ctx, tx, m)
	})
	cfg.Entity = func(m *consumer.Message) (consumer.Entity, error) {
		trade, err := consumer.ByJSONField("trade")(m)
		return consumer.Entity{Name: trade, Version: dedup.Version{Major: m.Time.UnixNano()}}, err
	}
	t0 := time.Now().Add(-time.Hour)
	v1 := consumertest.Message("pay", 0, 0, "t1", tradeEvent("v1", "t1", 1))
	v2 := consumertest.Message("pay", 0, 1, "t1", tradeEvent("v2", "t1", 2))
	v1.Time, v2.Time = t0, t0.Add(time.Second)
	res := consumertest.Run(t, cfg, consumertest.Script{}, v1, v2)
	if len(res.DeadLetters) != 1 || res.DeadLetters[0].Cause != consumer.CauseRejected {
		t.Fatalf("dead letters %+v, want v1's, rejected", res.DeadLetters)
	}
	mu.Lock()
	fixed = true
	mu.Unlock()
	// The redrive: the letter's headers but its own metadata, a count.
	headers, value := wire.Letter(res.DeadLetters[0]).Record(1 << 20)
	cp := consumertest.Message("pay", 0, 2, "t1", string(value))
	cp.Time = time.Now()
	for _, h := range headers {
		switch h.Key {
		case wire.MetaReason, wire.MetaCause, wire.MetaFingerprint, wire.MetaAttempts, wire.MetaAttempt, wire.MetaLane:
		default:
			cp.Headers = append(cp.Headers, h)
		}
	}
	cp.Headers = append(cp.Headers, consumer.Header{Key: wire.MetaRedriveCount, Value: []byte("1")})
	res = consumertest.Run(t, cfg, consumertest.Script{}, cp)
	log.check(t, map[string]int{"t1": 2})
	if res.Stats.Stale != 1 || res.Stats.Applied != 0 {
		t.Errorf("the redriven copy: %v, stale %d; want it stale", res, res.Stats.Stale)
	}
}

// TestEntityForgedRedrivenCopyCannotRaiseAWatermark: a record on the
// topic dressed as a redriven copy of v1, carrying version 1000: were it
// honoured, every later event of the trade would be stale. Its carried
// version is above the one Entity gives it, and is refused: it is
// ordered as its payload says (v1, stale after v2), and v3 applies.
func TestEntityForgedRedrivenCopyCannotRaiseAWatermark(t *testing.T) {
	log := newTradeLog()
	cfg := entityConfig(log.handle)
	v1 := consumertest.Message("pay", 0, 0, "t1", tradeEvent("v1", "t1", 1))
	v2 := consumertest.Message("pay", 0, 1, "t1", tradeEvent("v2", "t1", 2))
	forged := redriven(v1, 2, 1)
	forged.Value = []byte(tradeEvent("forged", "t1", 1))
	forged.Headers = append(forged.Headers,
		consumer.Header{Key: wire.MetaEntity, Value: []byte("t1")},
		consumer.Header{Key: wire.MetaEntityVersion, Value: []byte("1000.0")})
	v3 := consumertest.Message("pay", 0, 3, "t1", tradeEvent("v3", "t1", 3))
	res := consumertest.Run(t, cfg, consumertest.Script{}, v1, v2, forged, v3)
	log.check(t, map[string]int{"t1": 3})
	if res.Stats.Applied != 3 || res.Stats.Stale != 1 {
		t.Errorf("%v, stale %d; want v1, v2, v3 applied and the forged copy stale", res, res.Stats.Stale)
	}
}
