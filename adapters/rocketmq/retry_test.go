package rocketmq_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"
	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/adapters/rocketmq"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/wire"
	"github.com/idemkit/idem/dedup/memstore"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/internal/testenv/retrytest"
	"github.com/idemkit/idem/internal/testenv/rmqtest"
)

// nonBlockingRetries: set false to watch TestNonBlockingRetries and
// TestNonBlockingKeyOrdered fail in the default (Blocking) mode, where the
// payments behind a failing one wait for it.
var nonBlockingRetries = true

// keyOrdered: set false to watch TestNonBlockingKeyOrdered fail: a failing
// message's later messages then overtake it.
var keyOrdered = true

// retryTopics creates a topic of queues queues, its retry topic and its
// dead-letter topic, and sends msgs to the queues they name.
func retryTopics(t *testing.T, queues int, msgs func(mqs []*primitive.MessageQueue, topic string) []*primitive.Message) string {
	t.Helper()
	topic := name(t, "t")
	mqs := rmqtest.Shared(t).CreateTopic(t, topic, queues)
	rmqtest.Shared(t).CreateTopic(t, rocketmq.RetryTopic(topic), queues)
	rmqtest.Shared(t).CreateTopic(t, topic+"_DLQ", queues)
	p := rmqtest.Shared(t).NewProducer(t, producer.WithQueueSelector(producer.NewManualQueueSelector()))
	rmqtest.Send(t, p, msgs(mqs, topic)...)
	return topic
}

// TestNonBlockingRetries: 200 payments over 2 queues; every 20th fails
// with a retryable error until every other payment is applied, T00013
// fails for good (retryable every time), and T00100 ("uncertain") commits
// while its COMMIT is reported failed, each time it comes from the topic.
// With NonBlocking retries (1 attempt in the lane, then 1 s, 2 s and 20 s
// on the retry topic) the other payments are applied while the failing ones
// fail: a failing message holds up nothing behind it in its queue. Once
// released the failing ones are applied from the retry topic, once;
// T00100's copy is skipped as a duplicate of its applied original; T00013
// is dead-lettered after its last trip, cause exhausted, with its
// original's coordinates; and no copy is handled before it is due. Keyed
// by a business key, and by message ID (the copy has a UNIQ_KEY of its
// own: its key comes from its lineage only).
func TestNonBlockingRetries(t *testing.T) {
	for _, mode := range []string{"business-key", "message-id"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			testNonBlocking(t, mode)
		})
	}
}

func testNonBlocking(t *testing.T, mode string) {
	const queues, n = 2, 200
	// 23 s of trips: the failing payments outlast the outage, under load
	// too; T00013 runs out of them.
	delays := []time.Duration{time.Second, 2 * time.Second, 20 * time.Second}
	good, failing := map[string]bool{}, map[string]bool{}
	const exhausted, uncertain = "T00013", "T00100"
	topic := retryTopics(t, queues, func(mqs []*primitive.MessageQueue, topic string) []*primitive.Message {
		var msgs []*primitive.Message
		for i := range n {
			m := payment(topic, i, 100+i)
			txn := fmt.Sprintf("T%05d", i)
			switch {
			case i%20 == 7:
				failing[txn] = true
			case txn != exhausted && txn != uncertain:
				good[txn] = true
			}
			m.Queue = mqs[i%queues]
			msgs = append(msgs, m)
		}
		return msgs
	})
	d := newDB(t)
	src := source(t, rocketmq.Config{Group: name(t, "g"), Topics: []string{topic}, RetryDelays: delays})
	store := retrytest.NewLyingStore(d.store)
	var release atomic.Bool
	var early retrytest.EarlyCopies
	effect := insertEffect(d, 1)
	cfg := consumer.Config[pgx.Tx]{
		Name: "ledger", Source: src, DeadLetter: src, Store: store, Key: consumer.ByJSONField("txn_id"),
		Retry:  consumer.RetryPolicy{Initial: 20 * time.Millisecond, Max: 200 * time.Millisecond, MaxAttempts: 1000, MaxElapsed: 10 * time.Minute},
		Logger: testLogger(t),
		Handler: consumer.HandlerFunc[pgx.Tx](func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			early.Handled(m)
			txn, _ := consumer.ByJSONField("txn_id")(m)
			if txn == exhausted || failing[txn] && !release.Load() {
				return consumer.Retryable(fmt.Errorf("%s: the account service is down", txn))
			}
			if txn == uncertain && m.Topic == topic {
				store.Target(m.Ref())
			}
			return effect(ctx, tx, m)
		}),
	}
	if mode == "message-id" {
		cfg.Key = consumer.ByMessageID()
	}
	if nonBlockingRetries {
		cfg.Retries = consumer.NonBlocking{Attempts: 1, Delays: delays, Sink: src}
	}
	r := start(t, cfg)

	booked := func(ids map[string]bool) int {
		list := make([]string, 0, len(ids))
		for id := range ids {
			list = append(list, id)
		}
		return d.count(t, "key = ANY($1)", list)
	}
	testenv.WaitUntil(t, time.Minute, "every good payment applied while the failing ones fail", func() bool { return booked(good) == len(good) })
	if c := booked(failing); c != 0 {
		t.Fatalf("%d failing payments applied before their release", c)
	}
	release.Store(true)
	testenv.WaitUntil(t, 2*time.Minute, "every payment applied and T00013 dead-lettered", func() bool {
		return d.count(t, "") >= n-1 && r.Stats().DeadLettered >= 1
	})
	r.Stop(t)

	rows := map[string]int{}
	for id := range good {
		rows[id] = 1
	}
	for id := range failing {
		rows[id] = 1
	}
	rows[uncertain] = 1
	for id, want := range rows {
		if got := effectsOf(t, d, id); got != want {
			t.Errorf("%s: %d effects, want %d", id, got, want)
		}
	}
	if got := d.count(t, ""); got != n-1 {
		t.Errorf("%d effects, want %d", got, n-1)
	}
	if got := d.count(t, "queue LIKE $1 AND key = ANY($2)", rocketmq.RetryTopic(topic)+"/%", slices.Collect(mapKeys(failing))); got != len(failing) {
		t.Errorf("%d of the %d failing payments applied from the retry topic", got, len(failing))
	}
	st := r.Stats()
	if st.DeadLettered != 1 || st.RetriedLater < int64(len(failing)+len(delays)) {
		t.Errorf("stats %+v: want 1 dead letter and at least %d trips to retry", st, len(failing)+len(delays))
	}
	if store.Lies() == 0 {
		t.Error("the uncertain payment's COMMIT was never reported failed")
	}
	if st.Duplicates == 0 {
		t.Error("no duplicate skipped: the uncertain payment's copy was not recognised as its applied original")
	}
	early.Check(t)

	l := rmqtest.ReadTopic(t, rmqtest.Shared(t), topic+"_DLQ", 1)[0]
	want := map[string]string{wire.MetaCause: "exhausted", wire.MetaTopic: topic}
	if mode == "business-key" {
		want[wire.MetaKey] = exhausted
	}
	for k, v := range want {
		if got, _ := l.Header(k); string(got) != v {
			t.Errorf("letter property %s = %q, want %q", k, got, v)
		}
	}
	if reason, _ := l.Header(wire.MetaReason); !strings.Contains(string(reason), "after 3 trips to retry") {
		t.Errorf("letter reason %q, want the trips", reason)
	}
	if v, ok := l.Header(wire.MetaRetryAttempt); ok {
		t.Errorf("the letter carries %s %q", wire.MetaRetryAttempt, v)
	}
	if string(l.Key) != exhausted {
		t.Errorf("letter keys %q", l.Key)
	}
	t.Logf("%s: applied %d, duplicates %d, trips to retry %d, COMMITs reported failed %d",
		mode, st.Applied, st.Duplicates, st.RetriedLater, store.Lies())
}

func mapKeys(m map[string]bool) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// TestNonBlockingKeyOrdered: orderly mode, 20 keys of 10 messages over 2
// queues (a key's messages in one queue); the third message of 4 keys
// fails until the other keys are applied. With KeyOrdered the later
// messages of those keys follow it into retry: none of them is applied
// before the release, and every key's messages are applied in production
// order.
func TestNonBlockingKeyOrdered(t *testing.T) {
	t.Parallel()
	const queues, keys, perKey = 2, 20, 10
	// 38 s of trips: the failing messages outlast the outage, under load too.
	delays := []time.Duration{time.Second, 2 * time.Second, 5 * time.Second, 30 * time.Second}
	failing, failingKeys := map[string]bool{}, map[string]bool{}
	topic := retryTopics(t, queues, func(mqs []*primitive.MessageQueue, topic string) []*primitive.Message {
		var msgs []*primitive.Message
		for s := range perKey {
			for k := range keys {
				key := fmt.Sprintf("k%02d", k)
				id := fmt.Sprintf("%s-%d", key, s)
				if k%5 == 3 && s == 2 {
					failing[id], failingKeys[key] = true, true
				}
				m := primitive.NewMessage(topic, fmt.Appendf(nil, `{"txn_id":%q,"amount":%d}`, id, s+1))
				m.WithKeys([]string{key})
				m.Queue = mqs[k%queues]
				msgs = append(msgs, m)
			}
		}
		return msgs
	})
	d := newDB(t)
	src := source(t, rocketmq.Config{Group: name(t, "g"), Topics: []string{topic}, RetryDelays: delays, Orderly: true, BatchMaxSize: 7})
	var release atomic.Bool
	effect := insertEffect(d, 1)
	cfg := consumer.Config[pgx.Tx]{
		Name: "ledger", Source: src, DeadLetter: src, Store: d.store, Key: consumer.ByJSONField("txn_id"),
		Retry:  consumer.RetryPolicy{Initial: 20 * time.Millisecond, Max: 200 * time.Millisecond},
		Logger: testLogger(t),
		Handler: consumer.HandlerFunc[pgx.Tx](func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			id, _ := consumer.ByJSONField("txn_id")(m)
			if failing[id] && !release.Load() {
				return consumer.Retryable(fmt.Errorf("%s: the account service is down", id))
			}
			return effect(ctx, tx, m)
		}),
	}
	if nonBlockingRetries {
		cfg.Retries = consumer.NonBlocking{Attempts: 2, Delays: delays, Sink: src, KeyOrdered: keyOrdered}
	}
	r := start(t, cfg)

	ledger := func() []string { return retrytest.Ledger(t, d.pool, `SELECT key FROM `+d.effects+` ORDER BY id`) }
	otherKeys := (keys - len(failingKeys)) * perKey
	testenv.WaitUntil(t, time.Minute, "the other keys applied", func() bool {
		n := 0
		for _, id := range ledger() {
			if k, _ := retrytest.KeySeq(id); !failingKeys[k] {
				n++
			}
		}
		return n == otherKeys
	})
	// Hold the outage a little longer: the failing messages (and their
	// followers) make trips meanwhile.
	testenv.WaitUntil(t, time.Minute, "two trips per failing message", func() bool {
		return r.Stats().RetriedLater >= int64(2*len(failing))
	})
	applied := ledger()
	release.Store(true)
	testenv.WaitUntil(t, 2*time.Minute, "every message applied", func() bool { return len(ledger()) >= keys*perKey })
	r.Stop(t)

	retrytest.CheckHeldBack(t, applied, failingKeys, 2)
	got := ledger()
	if len(got) != keys*perKey {
		t.Errorf("%d effects, want %d", len(got), keys*perKey)
	}
	outOfOrder := retrytest.CheckKeyOrder(t, got)
	st := r.Stats()
	t.Logf("applied %d, trips to retry %d (followers included), dead letters %d, out of order %d", st.Applied, st.RetriedLater, st.DeadLettered, outOfOrder)
	if st.DeadLettered != 0 {
		t.Errorf("%d dead letters, want none", st.DeadLettered)
	}
}

func TestSourceReadsItsRetryTopic(t *testing.T) {
	src, err := rocketmq.New(rocketmq.Config{NameServers: []string{"h:1"}, Topics: []string{"pay"}, Group: "g",
		RetryDelays: []time.Duration{10 * time.Second, time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	for topic, want := range map[string]string{"pay_RETRY": "pay", "pay": "", "%RETRY%g": ""} {
		if got, ok := src.Describe().RetryOf(topic); got != want || ok != (want != "") {
			t.Errorf("RetryOf(%q) = %q, %v; want %q", topic, got, ok, want)
		}
	}
	err = src.Retry(context.Background(), consumer.RetryLetter{Letter: consumer.Letter{Message: &consumer.Message{Topic: "pay"}}, Retry: wire.Retry{Delay: 5 * time.Second}})
	if err == nil || !strings.Contains(err.Error(), "delay 5s is not one of Config.RetryDelays") {
		t.Errorf("Retry with an unknown delay: %v", err)
	}
	err = src.Retry(context.Background(), consumer.RetryLetter{Letter: consumer.Letter{Message: &consumer.Message{Topic: "pay"}}, Retry: wire.Retry{Delay: 10 * time.Second}})
	if !errors.Is(err, rocketmq.ErrNotRunning) {
		t.Errorf("Retry outside Run: %v, want ErrNotRunning", err)
	}
	_, err = consumer.New(consumer.Config[*memstore.Tx]{Name: "p", Source: src, Store: memstore.New(memstore.Config{}), DeadLetter: src,
		Key: consumer.ByMessageID(), Handler: consumer.HandlerFunc[*memstore.Tx](func(context.Context, *memstore.Tx, *consumer.Message) error { return nil }),
		Retries: consumer.NonBlocking{Delays: []time.Duration{10 * time.Second, 5 * time.Second}, Sink: src}})
	if err == nil || !strings.Contains(err.Error(), "Retries.Delays[1] is 5s") {
		t.Errorf("consumer.New with a delay the source was not given: %v", err)
	}
	_, err = consumer.New(consumer.Config[*memstore.Tx]{Name: "p", Source: src, Store: memstore.New(memstore.Config{}), DeadLetter: src,
		Key: consumer.ByMessageID(), Handler: consumer.HandlerFunc[*memstore.Tx](func(context.Context, *memstore.Tx, *consumer.Message) error { return nil }),
		Retries: consumer.NonBlocking{Delays: []time.Duration{time.Minute, 10 * time.Second}, Sink: src}})
	if err != nil {
		t.Errorf("consumer.New with the source's delays: %v", err)
	}
}
