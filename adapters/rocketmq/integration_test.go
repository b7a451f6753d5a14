package rocketmq_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"
	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/adapters/rocketmq"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/consumer/wire"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/internal/testenv/rmqtest"
)

// insertEffect is a handler that appends one effects row per message.
func insertEffect(d *db, run int) consumer.HandlerFunc[pgx.Tx] {
	return func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		key, err := consumer.ByJSONField("txn_id")(m)
		if err != nil {
			key = string(m.Key)
		}
		amount, _ := consumer.ByJSONField("amount")(m)
		if amount == "" {
			amount = "0"
		}
		seq := 0
		if v, ok := m.Header("seq"); ok {
			seq, _ = strconv.Atoi(string(v))
		}
		_, err = tx.Exec(ctx, `INSERT INTO `+d.effects+` (key, amount, queue, seq, run, attempt) VALUES ($1, $2::bigint, $3, $4, $5, $6)`,
			key, amount, m.Lane, seq, run, m.Attempt)
		return err
	}
}

func payment(topic string, i, amount int) *primitive.Message {
	txn := fmt.Sprintf("T%05d", i)
	m := primitive.NewMessage(topic, fmt.Appendf(nil, `{"txn_id":%q,"amount":%d}`, txn, amount))
	m.WithKeys([]string{txn})
	return m
}

// attempts counts handler runs per key.
type attempts struct {
	mu sync.Mutex
	n  map[string]int
}

func (a *attempts) next(key string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.n == nil {
		a.n = map[string]int{}
	}
	a.n[key]++
	return a.n[key]
}

func (a *attempts) get(key string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.n[key]
}

// failing wraps the effect handler: fail decides, per key and attempt,
// whether (and how) the handler fails instead.
func failing(d *db, runs *attempts, fail func(key string, attempt int) error) consumer.HandlerFunc[pgx.Tx] {
	effect := insertEffect(d, 1)
	return func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		key, _ := consumer.ByJSONField("txn_id")(m)
		if err := fail(key, runs.next(key)); err != nil {
			return err
		}
		return effect(ctx, tx, m)
	}
}

// oneQueue creates a topic with one queue (so that message order is the
// send order) and its idem dead-letter topic, and sends the payments
// txns, in order.
func oneQueue(t *testing.T, txns ...int) (topic string) {
	topic = name(t, "t")
	rmqtest.Shared(t).CreateTopic(t, topic, 1)
	rmqtest.Shared(t).CreateTopic(t, topic+"_DLQ", 1)
	var msgs []*primitive.Message
	for _, i := range txns {
		msgs = append(msgs, payment(topic, i, 100+i))
	}
	rmqtest.Send(t, rmqtest.Shared(t).NewProducer(t), msgs...)
	return topic
}

// failingLedger runs the ledger consumer over topic (see oneQueue): keyed
// by txn_id, on a fake clock, retrying as retry says (zero: the default
// policy), its handler failing as fail says (see failing). It returns the
// database of the effects and the handler's runs per key.
func failingLedger(t *testing.T, topic string, retry consumer.RetryPolicy, fail func(key string, attempt int) error) (*db, *attempts, *running) {
	t.Helper()
	d := newDB(t)
	runs := &attempts{}
	src := source(t, rocketmq.Config{Group: name(t, "g"), Topics: []string{topic}})
	r := start(t, consumer.Config[pgx.Tx]{
		Name: "ledger", Source: src, DeadLetter: src, Store: d.store, Key: consumer.ByJSONField("txn_id"),
		Handler: failing(d, runs, fail), Retry: retry,
		Clock: consumertest.NewClock(), Logger: testLogger(t),
	})
	return d, runs, r
}

// rejectT00001 fails T00001 for good.
func rejectT00001(key string, _ int) error {
	if key == "T00001" {
		return consumer.Permanent(errors.New("order o-1 unknown"))
	}
	return nil
}

// orderlyFailures fails every 17th message of a queue ("Q<q>-<seq>") once.
func orderlyFailures(key string, attempt int) error {
	i := strings.LastIndexByte(key, '-')
	seq, _ := strconv.Atoi(key[i+1:])
	if seq%17 == 5 && attempt == 1 {
		return consumer.Retryable(errors.New("deadlock detected"))
	}
	return nil
}

func effectsOf(t *testing.T, d *db, key string) int {
	return d.count(t, "key = $1", key)
}

// TestTransientFailureTwiceThenSuccess: the handler fails twice for
// T00001 (retryable), then succeeds: one effect, nothing dead-lettered, the
// messages after it applied too.
func TestTransientFailureTwiceThenSuccess(t *testing.T) {
	t.Parallel()
	topic := oneQueue(t, 1, 2, 3)
	d, runs, r := failingLedger(t, topic, consumer.RetryPolicy{}, func(key string, attempt int) error {
		if key == "T00001" && attempt <= 2 {
			return consumer.Retryable(errors.New("serialization failure"))
		}
		return nil
	})
	testenv.WaitUntil(t, time.Minute, "3 effects", func() bool { return d.count(t, "") >= 3 })
	r.Stop(t)
	st := r.Stats()
	for _, k := range []string{"T00001", "T00002", "T00003"} {
		if n := effectsOf(t, d, k); n != 1 {
			t.Errorf("%s: %d effects, want 1", k, n)
		}
	}
	if runs.get("T00001") != 3 || st.Retries < 2 || st.DeadLettered != 0 {
		t.Fatalf("handler ran %d times for T00001, stats %+v; want 3 runs, 2 retries, no dead letter", runs.get("T00001"), st)
	}
}

// TestPermanentFailureDeadLetteredOnce: the handler rejects T00001 for good.
// It is dead-lettered at once (one handler run), exactly once, with the
// reason, key and origin as properties; it has no effect; its failure is
// recorded in the dedup store; the messages after it are applied.
func TestPermanentFailureDeadLetteredOnce(t *testing.T) {
	t.Parallel()
	topic := oneQueue(t, 1, 2, 3)
	d, runs, r := failingLedger(t, topic, consumer.RetryPolicy{}, rejectT00001)
	testenv.WaitUntil(t, time.Minute, "2 effects and a dead letter", func() bool {
		return d.count(t, "") >= 2 && r.Stats().DeadLettered >= 1
	})
	r.Stop(t)
	if n := effectsOf(t, d, "T00001"); n != 0 {
		t.Fatalf("the rejected message has %d effects", n)
	}
	if d.count(t, "key IN ('T00002', 'T00003')") != 2 || runs.get("T00001") != 1 || r.Stats().DeadLettered != 1 {
		t.Fatalf("effects %d, handler runs for T00001 %d, stats %+v", d.count(t, ""), runs.get("T00001"), r.Stats())
	}
	var outcome, reason string
	if err := d.pool.QueryRow(context.Background(), `SELECT outcome, reason FROM `+d.store.Table()+` WHERE key = 'T00001'`).
		Scan(&outcome, &reason); err != nil || outcome != "failed" || !strings.Contains(reason, "order o-1 unknown") {
		t.Fatalf("dedup row of T00001: %q %q %v", outcome, reason, err)
	}

	letters := rmqtest.ReadTopic(t, rmqtest.Shared(t), topic+"_DLQ", 1)
	l := letters[0]
	mx := l.Raw.(*primitive.MessageExt)
	want := map[string]string{
		wire.MetaReason: "permanent: order o-1 unknown", wire.MetaAttempts: "1",
		wire.MetaTopic: topic, wire.MetaKeyScope: "ledger", wire.MetaKey: "T00001",
		wire.MetaOffset: "0", wire.MetaLane: topic + "/" + mx.Queue.BrokerName + "/0",
	}
	for k, v := range want {
		if got, _ := l.Header(k); string(got) != v {
			t.Errorf("letter property %s = %q, want %q", k, got, v)
		}
	}
	if string(l.Key) != "T00001" || !strings.Contains(string(l.Value), `"txn_id":"T00001"`) {
		t.Errorf("letter keys %q, body %q", l.Key, l.Value)
	}
	if n := topicCount(t, topic+"_DLQ"); n != 1 {
		t.Fatalf("the dead-letter topic holds %d messages, want 1", n)
	}
}

// TestPanickingHandlerDoesNotPinQueue: on a one-queue topic the handler
// panics on every attempt for T00001 and on the first for T00002. The
// consumer recovers the panics as failed attempts: T00001 is dead-lettered
// once its retries are used up, T00002 is applied on its second attempt, and
// the messages behind them in the queue are applied.
func TestPanickingHandlerDoesNotPinQueue(t *testing.T) {
	t.Parallel()
	topic := oneQueue(t, 1, 2, 3, 4)
	d, runs, r := failingLedger(t, topic, consumer.RetryPolicy{MaxAttempts: 3}, func(key string, attempt int) error {
		if key == "T00001" || key == "T00002" && attempt == 1 {
			panic("nil map in " + key)
		}
		return nil
	})
	testenv.WaitUntil(t, time.Minute, "3 effects and a dead letter", func() bool {
		return d.count(t, "") >= 3 && r.Stats().DeadLettered >= 1
	})
	r.Stop(t)
	for k, want := range map[string]int{"T00001": 0, "T00002": 1, "T00003": 1, "T00004": 1} {
		if n := effectsOf(t, d, k); n != want {
			t.Errorf("%s: %d effects, want %d", k, n, want)
		}
	}
	if runs.get("T00001") != 3 || r.Stats().DeadLettered != 1 {
		t.Fatalf("handler runs for T00001: %d, stats %+v; want 3 runs, 1 dead letter", runs.get("T00001"), r.Stats())
	}
	l := rmqtest.ReadTopic(t, rmqtest.Shared(t), topic+"_DLQ", 1)[0]
	if k, _ := l.Header(wire.MetaKey); string(k) != "T00001" {
		t.Fatalf("dead letter for %q, want T00001", k)
	}
	if reason, _ := l.Header(wire.MetaReason); !strings.Contains(string(reason), "panicked") {
		t.Fatalf("dead-letter reason %q does not say the handler panicked", reason)
	}
}

// TestOrderlyKeepsQueueOrder consumes 4 queues × 100 messages in orderly
// mode, calls of 8, with every 17th message of a queue failing once
// (orderlyFailures; retried in place).
// The effects of each queue are in sequence order: the sequence column,
// read in insertion order, is 0..99 for every queue.
func TestOrderlyKeepsQueueOrder(t *testing.T) {
	t.Parallel()
	const queues, perQueue = 4, 100
	topic := name(t, "t")
	mqs := rmqtest.Shared(t).CreateTopic(t, topic, queues)
	rmqtest.Shared(t).CreateTopic(t, topic+"_DLQ", 1)
	var msgs []*primitive.Message
	for q, mq := range mqs {
		for seq := range perQueue {
			m := primitive.NewMessage(topic, fmt.Appendf(nil, `{"txn_id":"Q%d-%03d"}`, q, seq))
			m.WithProperty("seq", strconv.Itoa(seq))
			m.Queue = mq
			msgs = append(msgs, m)
		}
	}
	rmqtest.Send(t, rmqtest.Shared(t).NewProducer(t, producer.WithQueueSelector(producer.NewManualQueueSelector())), msgs...)
	d := newDB(t)
	src := source(t, rocketmq.Config{Group: name(t, "g"), Topics: []string{topic}, Orderly: true, BatchMaxSize: 8})
	r := start(t, consumer.Config[pgx.Tx]{
		Name: "ledger", Source: src, DeadLetter: src, Store: d.store, Key: consumer.ByMessageID(),
		Handler: failing(d, &attempts{}, orderlyFailures), Clock: consumertest.NewClock(), Logger: testLogger(t),
	})
	testenv.WaitUntil(t, 2*time.Minute, "400 effects", func() bool { return d.count(t, "") >= queues*perQueue })
	r.Stop(t)
	st := r.Stats()
	if n := d.count(t, ""); n != queues*perQueue {
		t.Fatalf("%d effects, want %d", n, queues*perQueue)
	}
	rows, err := d.pool.Query(context.Background(), `SELECT queue, seq FROM `+d.effects+` ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	order := map[string][]int{}
	for rows.Next() {
		var q string
		var seq int
		if err := rows.Scan(&q, &seq); err != nil {
			t.Fatal(err)
		}
		order[q] = append(order[q], seq)
	}
	rows.Close()
	want := make([]int, perQueue)
	for i := range want {
		want[i] = i
	}
	if len(order) != queues {
		t.Fatalf("effects from %d queues, want %d", len(order), queues)
	}
	for q, got := range order {
		if !slices.Equal(got, want) {
			t.Errorf("queue %s: effects in order %v", q, got)
		}
	}
	if st.Retries < 4 || st.Applied != queues*perQueue || st.DeadLettered != 0 {
		t.Fatalf("stats %+v: want 400 applied, the failures retried, nothing dead-lettered", st)
	}
}

// TestJavaToolingMessagesDedupByKeys sends payment callbacks with RocketMQ's
// own Java tooling (mqadmin sendMessage, from the broker's jars): K1 twice,
// K2 once. The consumer keys by the messages' Keys: two effects, one
// duplicate skipped.
func TestJavaToolingMessagesDedupByKeys(t *testing.T) {
	t.Parallel()
	topic := name(t, "t")
	rmqtest.Shared(t).CreateTopic(t, topic, 2)
	rmqtest.Shared(t).CreateTopic(t, topic+"_DLQ", 1)
	d := newDB(t)
	src := source(t, rocketmq.Config{Group: name(t, "g"), Topics: []string{topic}})
	r := start(t, consumer.Config[pgx.Tx]{
		Name: "ledger", Source: src, DeadLetter: src, Store: d.store, Key: consumer.ByRecordKey(),
		Handler: insertEffect(d, 1), Logger: testLogger(t),
	})
	ns := rmqtest.Shared(t).NameServers[0]
	for _, key := range []string{"K1", "K1", "K2"} {
		// The tool's producer gives up after 3 s; on a loaded machine a send
		// times out now and then (its JVM starting alongside the tests). A
		// send that timed out may still have been stored: the checks below
		// allow an extra duplicate, never an extra effect.
		for attempt := 1; ; attempt++ {
			out, err := mqadmin("sendMessage", "-n", ns, "-t", topic, "-p", "payment callback "+key, "-k", key)
			if err == nil && strings.Contains(out, "SEND_OK") {
				break
			}
			if attempt == 4 {
				t.Fatalf("mqadmin sendMessage, %d attempts: %v\n%s", attempt, err, out)
			}
			t.Logf("mqadmin sendMessage, attempt %d: %v", attempt, err)
		}
	}
	testenv.WaitUntil(t, time.Minute, "three messages settled", func() bool {
		st := r.Stats()
		return st.Applied+st.Duplicates >= 3
	})
	r.Stop(t)
	st := r.Stats()
	if effectsOf(t, d, "K1") != 1 || effectsOf(t, d, "K2") != 1 || d.count(t, "") != 2 || st.Applied != 2 || st.Duplicates < 1 || st.DeadLettered != 0 {
		t.Fatalf("effects K1 %d, K2 %d, all %d; stats %+v", effectsOf(t, d, "K1"), effectsOf(t, d, "K2"), d.count(t, ""), st)
	}
}

// TestBrokerDeadLetterQueue: with DeadLetterBroker a permanently failing
// message goes to the broker's %DLQ%<group>, once, unchanged (the client's
// send-back with delay level -1, or past the reconsume maximum in orderly
// mode), and the queue moves on to the next message.
func TestBrokerDeadLetterQueue(t *testing.T) {
	t.Parallel()
	for _, orderly := range []bool{false, true} {
		t.Run(map[bool]string{false: "concurrent", true: "orderly"}[orderly], func(t *testing.T) {
			t.Parallel()
			topic := oneQueue(t, 1, 2)
			group := name(t, "g")
			d := newDB(t)
			src := source(t, rocketmq.Config{Group: group, Topics: []string{topic}, Orderly: orderly,
				DeadLetter: rocketmq.DeadLetterBroker})
			r := start(t, consumer.Config[pgx.Tx]{
				Name: "ledger", Source: src, DeadLetter: src, Store: d.store, Key: consumer.ByJSONField("txn_id"),
				Handler: failing(d, &attempts{}, rejectT00001), Logger: testLogger(t),
			})
			testenv.WaitUntil(t, time.Minute, "T00002 applied", func() bool { return d.count(t, "") >= 1 })
			dlq := "%DLQ%" + group
			testenv.WaitUntil(t, time.Minute, "the broker to create "+dlq, func() bool {
				mqs, err := rmqtest.Shared(t).Admin.FetchPublishMessageQueues(context.Background(), dlq)
				return err == nil && len(mqs) > 0
			})
			l := rmqtest.ReadTopic(t, rmqtest.Shared(t), dlq, 1)[0]
			r.Stop(t)
			st := r.Stats()
			if string(l.Key) != "T00001" || !strings.Contains(string(l.Value), `"txn_id":"T00001"`) {
				t.Fatalf("%s holds keys %q body %q, want the T00001 message", dlq, l.Key, l.Value)
			}
			if effectsOf(t, d, "T00001") != 0 || effectsOf(t, d, "T00002") != 1 || st.DeadLettered != 1 {
				t.Fatalf("effects T00001 %d, T00002 %d, stats %+v", effectsOf(t, d, "T00001"), effectsOf(t, d, "T00002"), st)
			}
			if n := topicCount(t, dlq); n != 1 {
				t.Fatalf("%s holds %d messages, want 1", dlq, n)
			}
		})
	}
}

// TestGivenBackMessagesComeBackThroughRetryTopic: in concurrent mode a
// consume call whose messages the consumer gives back returns "retry later";
// the client sends them to %RETRY%<group> and they come back with the next
// attempt number. Here the handler fails T00001 on its first broker delivery
// until the retry policy is used up, and the consumer stops the lane
// (StopLaneOnExhausted), which gives back T00001 and everything behind it.
// All three come back through the retry topic and apply once.
func TestGivenBackMessagesComeBackThroughRetryTopic(t *testing.T) {
	t.Parallel()
	topic := oneQueue(t, 1, 2, 3)
	group := name(t, "g")
	// The broker creates the retry topic when the group first shows up, and
	// a client that started before finds its route only at its next route
	// refresh (30s): create it first.
	rmqtest.Shared(t).CreateTopic(t, "%RETRY%"+group, 1)
	d := newDB(t)
	src := source(t, rocketmq.Config{Group: group, Topics: []string{topic}, RetryDelayLevel: 1})
	effect := insertEffect(d, 1)
	r := start(t, consumer.Config[pgx.Tx]{
		Name: "ledger", Source: src, DeadLetter: src, Store: d.store, Key: consumer.ByJSONField("txn_id"),
		Handler: consumer.HandlerFunc[pgx.Tx](func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			if key, _ := consumer.ByJSONField("txn_id")(m); key == "T00001" && m.Attempt == 1 {
				return errors.New("downstream not ready")
			}
			return effect(ctx, tx, m)
		}),
		Retry: consumer.RetryPolicy{MaxAttempts: 2}, OnExhausted: consumer.StopLaneOnExhausted,
		Clock: consumertest.NewClock(), Logger: testLogger(t),
	})
	testenv.WaitUntil(t, time.Minute, "3 effects", func() bool { return d.count(t, "") >= 3 })
	r.Stop(t)
	retryLane := "%RETRY%" + group + "/"
	for _, k := range []string{"T00001", "T00002", "T00003"} {
		if n := effectsOf(t, d, k); n != 1 {
			t.Errorf("%s: %d effects, want 1", k, n)
		}
	}
	if n := d.count(t, "key = 'T00001' AND attempt = 2 AND starts_with(queue, $1)", retryLane); n != 1 {
		t.Fatalf("T00001 was not applied on its second delivery, from the retry topic (%s...)", retryLane)
	}
	if r.Stats().Released < 1 || r.Stats().DeadLettered != 0 {
		t.Fatalf("stats %+v", r.Stats())
	}
}
