package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/internal/testenv/relaytest"
	"github.com/idemkit/idem/outbox"
)

// recorder is a Publisher that records what it sent, in order, and fails
// as fail says. It keeps the per-key contract: after a failure, the rest of
// that key's records of the call are held back.
type recorder struct {
	fail  func(call int, r *outbox.Record) error // nil: send
	block chan struct{}                          // when set, the first call waits for it to close

	mu      sync.Mutex
	calls   int
	got     []outbox.Record // everything Publish was given
	sent    []outbox.Record
	entered chan struct{}
}

func newRecorder() *recorder { return &recorder{entered: make(chan struct{}, 1)} }

func (p *recorder) Publish(ctx context.Context, recs []outbox.Record, errs []error) {
	p.mu.Lock()
	p.calls++
	call := p.calls
	p.got = append(p.got, recs...)
	p.mu.Unlock()
	if call == 1 && p.block != nil {
		p.entered <- struct{}{}
		select {
		case <-p.block:
		case <-ctx.Done():
			for i := range errs {
				errs[i] = ctx.Err()
			}
			return
		}
	}
	held := map[string]bool{}
	for i := range recs {
		r := &recs[i]
		if held[r.OrderKey()] {
			errs[i] = outbox.ErrHeldBack
			continue
		}
		if p.fail != nil {
			if err := p.fail(call, r); err != nil {
				errs[i] = err
				if !errors.Is(err, outbox.ErrRefused) {
					held[r.OrderKey()] = true
				}
				continue
			}
		}
		p.mu.Lock()
		p.sent = append(p.sent, *r)
		p.mu.Unlock()
	}
}

func (p *recorder) records() []outbox.Record {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]outbox.Record(nil), p.sent...)
}

// checkOrder checks that the first copy of each record was published in
// its key's order and that every message was; it returns how many copies
// were duplicates.
func checkOrder(t *testing.T, sent []outbox.Record, want int) int {
	t.Helper()
	got := make([]relaytest.Delivered, len(sent))
	for i, r := range sent {
		got[i] = relaytest.Delivered{ID: r.ID, Key: string(r.Key), Value: string(r.Value)}
	}
	return relaytest.CheckKeyOrder(t, got, want)
}

func pending(t testing.TB, pool *pgxpool.Pool, ob *outbox.Outbox) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM `+ob.Table()+` WHERE sent_at IS NULL`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestRelaysPublishEachRowOnceInKeyOrder: three relays publish what
// producers enqueue meanwhile; with no failures every row is published
// exactly once (no two relays share a shard), each key in order, and the
// outbox ends empty.
func TestRelaysPublishEachRowOnceInKeyOrder(t *testing.T) {
	ob, pool, _ := relaytest.NewOutbox(t)
	pub := newRecorder()
	var relays []*outbox.Relay
	for range 3 {
		relays = append(relays, relaytest.StartRelay(t, outbox.RelayConfig{Outbox: ob, Publisher: pub, BatchSize: 40}))
	}
	want := relaytest.Enqueue(t, pool, ob, 60, 25, "orders", "audit")
	testenv.WaitUntilProgress(t, 2*time.Minute, "every message published", func() (bool, string) {
		n := len(pub.records())
		return n >= want && pending(t, pool, ob) == 0, fmt.Sprintf("%d of %d published", n, want)
	})
	if dups := checkOrder(t, pub.records(), want); dups != 0 {
		t.Fatalf("%d messages published twice without a failure: relays shared work", dups)
	}
	var rounds []int64
	for _, r := range relays {
		st := r.Stats()
		rounds = append(rounds, st.Rounds)
		if st.Failed != 0 || st.DeadLettered != 0 || st.OrderViolations != 0 {
			t.Errorf("stats %+v", st)
		}
	}
	t.Logf("rounds per relay: %v", rounds)
	if got := rows(t, pool, ob.Table()); len(got) != 0 {
		t.Fatalf("%d rows left after publishing", len(got))
	}
}

// TestRelaysNeverShareAShard: while one relay is stuck publishing its
// batch, another publishes the other shards and none of the stuck relay's
// rows; released, the first marks its rows and nothing is published twice.
func TestRelaysNeverShareAShard(t *testing.T) {
	ob, pool, _ := relaytest.NewOutbox(t)
	want := relaytest.Enqueue(t, pool, ob, 48, 4, "orders")
	stuck := newRecorder()
	stuck.block = make(chan struct{})
	relaytest.StartRelay(t, outbox.RelayConfig{Outbox: ob, Publisher: stuck, BatchSize: 10})
	select {
	case <-stuck.entered:
	case <-time.After(time.Minute):
		t.Fatal("the first relay never published")
	}
	stuck.mu.Lock()
	var held []int64
	for _, r := range stuck.got {
		held = append(held, r.Seq)
	}
	stuck.mu.Unlock()
	other := newRecorder()
	relaytest.StartRelay(t, outbox.RelayConfig{Outbox: ob, Publisher: other, BatchSize: 10})
	testenv.WaitUntilProgress(t, 2*time.Minute, "the second relay publishes every shard but the stuck relay's", func() (bool, string) {
		var left int
		err := pool.QueryRow(context.Background(), `SELECT count(*) FROM `+ob.Table()+` WHERE sent_at IS NULL
AND shard NOT IN (SELECT shard FROM `+ob.Table()+` WHERE seq = ANY($1))`, held).Scan(&left)
		if err != nil {
			t.Fatal(err)
		}
		return left == 0, fmt.Sprintf("%d rows of other shards pending", left)
	})
	for _, r := range other.records() {
		if slices.Contains(held, r.Seq) {
			t.Fatalf("row %d was published by both relays", r.Seq)
		}
	}
	close(stuck.block)
	testenv.WaitUntilProgress(t, 2*time.Minute, "the first relay marks its batch", func() (bool, string) {
		return pending(t, pool, ob) == 0, ""
	})
	all := append(stuck.records(), other.records()...)
	ids := map[string]int{}
	for _, r := range all {
		ids[r.ID]++
	}
	for id, n := range ids {
		if n != 1 {
			t.Errorf("%s published %d times", id, n)
		}
	}
	if len(ids) != want || len(stuck.records()) == 0 {
		t.Fatalf("%d distinct published (%d by the stuck relay), want %d", len(ids), len(stuck.records()), want)
	}
}

var errBrokerDown = errors.New("broker down")

// TestRelayWaitsOutFailures: a publisher that fails everything for its
// first calls, then a third of the keys on every other call: nothing is
// lost, first copies stay in key order, the failing shards back off.
func TestRelayWaitsOutFailures(t *testing.T) {
	ob, pool, _ := relaytest.NewOutbox(t)
	want := relaytest.Enqueue(t, pool, ob, 30, 20, "orders")
	pub := newRecorder()
	pub.fail = func(call int, r *outbox.Record) error {
		switch {
		case call <= 5:
			return errBrokerDown
		case call%2 == 0 && r.Key[len(r.Key)-1]%3 == 0:
			return fmt.Errorf("leader moving: %w", errBrokerDown)
		}
		return nil
	}
	relay := relaytest.StartRelay(t, outbox.RelayConfig{Outbox: ob, Publisher: pub, BatchSize: 50})
	testenv.WaitUntilProgress(t, 2*time.Minute, "every message published", func() (bool, string) {
		return pending(t, pool, ob) == 0, fmt.Sprintf("%d pending, stats %+v", pending(t, pool, ob), relay.Stats())
	})
	checkOrder(t, pub.records(), want)
	st := relay.Stats()
	if st.Failed == 0 || st.OrderViolations != 0 || st.Published != int64(want) {
		t.Fatalf("stats %+v, want failures, no order violations, %d published", st, want)
	}
}

// TestRelayDeadLettersRefusals: a message the broker refuses for good goes
// to the dead-letter table with the reason; the messages after it, of its
// key too, are published.
func TestRelayDeadLettersRefusals(t *testing.T) {
	ob, pool, _ := relaytest.NewOutbox(t)
	ctx := testenv.Context(t, time.Minute)
	err := inTx(t, pool, func(tx pgx.Tx) error {
		return ob.EnqueueFor(ctx, tx, dedup.Key{Scope: "s", ID: "1"},
			msg("orders", "k", "k 0"), outbox.Message{Topic: "orders", Key: []byte("k"), Value: []byte("huge"),
				Headers: []consumer.Header{{Key: "trace", Value: []byte("t")}}}, msg("orders", "k", "k 1"))
	})
	if err != nil {
		t.Fatal(err)
	}
	pub := newRecorder()
	pub.fail = func(_ int, r *outbox.Record) error {
		if string(r.Value) == "huge" {
			return outbox.Refused(errors.New("message too large: 5 MiB, the limit is 1 MiB"))
		}
		return nil
	}
	relay := relaytest.StartRelay(t, outbox.RelayConfig{Outbox: ob, Publisher: pub})
	testenv.WaitUntilProgress(t, time.Minute, "the outbox is empty", func() (bool, string) { return pending(t, pool, ob) == 0, "" })
	checkOrder(t, pub.records(), 2)
	var id, reason string
	var hk []string
	if err := pool.QueryRow(ctx, `SELECT id, reason, header_keys FROM `+ob.DeadTable()).Scan(&id, &reason, &hk); err != nil {
		t.Fatal(err)
	}
	if id != outbox.MessageID(dedup.Key{Scope: "s", ID: "1"}, 1) || !strings.Contains(reason, "refused by the broker: message too large") || len(hk) != 1 {
		t.Fatalf("dead letter %s %q %v", id, reason, hk)
	}
	if st := relay.Stats(); st.DeadLettered != 1 || st.Published != 2 {
		t.Fatalf("stats %+v", st)
	}
	// Put back (the limit was raised, say), it is published with its
	// identity.
	if _, err := pool.Exec(ctx, `WITH d AS (DELETE FROM `+ob.DeadTable()+` RETURNING *)
INSERT INTO `+ob.Table()+` (id, parent_scope, parent_key, position, shard, topic, key, value, header_keys, header_values)
SELECT id, parent_scope, parent_key, position, 0, topic, key, 'now fits', header_keys, header_values FROM d`); err != nil {
		t.Fatal(err)
	}
	testenv.WaitUntilProgress(t, time.Minute, "the message put back is published", func() (bool, string) { return len(pub.records()) == 3, "" })
	if r := pub.records()[2]; r.ID != id || string(r.Value) != "now fits" {
		t.Fatalf("put back and published: %+v", r)
	}
}

// TestRelayRetainsSentRows: with Retention, sent rows stay, marked, until
// they are older than it.
func TestRelayRetainsSentRows(t *testing.T) {
	ob, pool, _ := relaytest.NewOutbox(t)
	want := relaytest.Enqueue(t, pool, ob, 3, 10, "orders")
	pub := newRecorder()
	relaytest.StartRelay(t, outbox.RelayConfig{Outbox: ob, Publisher: pub, Retention: time.Hour})
	testenv.WaitUntilProgress(t, time.Minute, "every message published", func() (bool, string) { return pending(t, pool, ob) == 0, "" })
	got := rows(t, pool, ob.Table())
	if len(got) != want {
		t.Fatalf("%d rows kept, want %d", len(got), want)
	}
	for _, r := range got {
		if !r.Sent {
			t.Fatalf("row %+v not marked sent", r)
		}
	}
	purger := relaytest.StartRelay(t, outbox.RelayConfig{Outbox: ob, Publisher: pub, Retention: time.Millisecond, PurgeEvery: time.Millisecond, PurgeBatch: 7})
	// Wait on the counter, not on the table: the relay counts a purge once
	// its DELETE has returned, after the rows are gone.
	testenv.WaitUntilProgress(t, time.Minute, "the sent rows purged", func() (bool, string) {
		st := purger.Stats()
		return st.Purged >= int64(want), fmt.Sprintf("purged %d of %d", st.Purged, want)
	})
	if st := purger.Stats(); st.Purged != int64(want) {
		t.Fatalf("purged %d, want %d", st.Purged, want)
	}
	if n := len(rows(t, pool, ob.Table())); n != 0 {
		t.Fatalf("%d rows left after purging %d", n, want)
	}
	checkOrder(t, pub.records(), want)
}

// TestRelayStops: Stop lets the round finish and mark its rows; a
// cancelled context abandons it, and its rows are published again.
func TestRelayStops(t *testing.T) {
	ob, pool, _ := relaytest.NewOutbox(t)
	relaytest.Enqueue(t, pool, ob, 3, 2, "orders")
	for _, graceful := range []bool{true, false} {
		pub := newRecorder()
		pub.block = make(chan struct{})
		r, err := outbox.NewRelay(outbox.RelayConfig{Outbox: ob, Publisher: pub, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- r.Run(ctx) }()
		<-pub.entered
		before := pending(t, pool, ob)
		if graceful {
			stopped := make(chan error, 1)
			go func() { stopped <- r.Stop(context.Background()) }()
			close(pub.block)
			if err := <-stopped; err != nil {
				t.Fatal(err)
			}
		} else {
			cancel()
		}
		if err := <-done; err != nil {
			t.Fatalf("Run: %v", err)
		}
		cancel()
		after := pending(t, pool, ob)
		switch {
		case graceful && after != 0:
			t.Fatalf("a graceful stop left %d of %d rows unmarked", after, before)
		case !graceful && after != before:
			t.Fatalf("a hard stop marked rows it did not publish: %d pending of %d", after, before)
		}
		if graceful {
			relaytest.Enqueue(t, pool, ob, 3, 2, "orders")
		}
	}
	if err := func() error {
		r, _ := outbox.NewRelay(outbox.RelayConfig{Outbox: ob, Publisher: newRecorder()})
		return r.Stop(context.Background())
	}(); err != nil {
		t.Fatalf("Stop before Run: %v", err)
	}
}

func TestRelayRefusesAnUnmigratedOutbox(t *testing.T) {
	pool, schema := testenv.SchemaPool(t)
	ob, err := outbox.New(pool, outbox.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	r, err := outbox.NewRelay(outbox.RelayConfig{Outbox: ob, Publisher: newRecorder(), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Run(testenv.Context(t, time.Minute)); !errors.Is(err, dedup.ErrNotMigrated) {
		t.Fatalf("Run on an outbox never migrated: %v", err)
	}
	_, err = outbox.NewRelay(outbox.RelayConfig{BatchSize: -1, PollInterval: -1, Backoff: consumer.RetryPolicy{Jitter: 2}})
	for _, field := range []string{"Outbox is nil", "Publisher is nil", "BatchSize", "PollInterval", "Backoff"} {
		if err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("NewRelay error %v does not name %s", err, field)
		}
	}
}
