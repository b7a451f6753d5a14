package kafka_test

// Integration tests against the real Kafka and Postgres of the test
// environment (IDEM_TEST_KAFKA_BROKERS, IDEM_TEST_PG_URL). Every assertion
// is on data: business rows in Postgres, committed offsets and high
// watermarks in Kafka, letters on the dead-letter topic. They run one after
// the other: TestKafkaBrokerRestart kills the shared broker.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	kafkago "github.com/segmentio/kafka-go"

	"github.com/idemkit/idem/adapters/kafka"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/consumer/source"
	"github.com/idemkit/idem/consumer/wire"
	"github.com/idemkit/idem/dedup/pgstore"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/internal/testenv/kafkatest"
	"github.com/idemkit/idem/internal/testenv/pgtest"
)

// payment is the business message: a payment channel's callback.
type payment struct {
	TxnID  string `json:"txn_id"`
	Amount int64  `json:"amount"`
}

// bank is a per-test Postgres schema with the dedup table and a business
// table without unique constraints, so that a duplicate effect shows as an
// extra row.
type bank struct {
	pool   *pgxpool.Pool
	schema string
	store  *pgstore.Store
	table  string // sanitized effects table
}

func newBank(t testing.TB, pool *pgxpool.Pool, schema string) *bank {
	t.Helper()
	store := pgtest.Store(t, pool, schema)
	ctx := ctxTimeout(t, 30*time.Second)
	b := &bank{pool: pool, schema: schema, store: store, table: pgx.Identifier{schema, "ledger"}.Sanitize()}
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+b.table+` (
		id bigserial PRIMARY KEY, txn_id text NOT NULL, amount bigint NOT NULL, source text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return b
}

func newTestBank(t *testing.T) *bank {
	pool := testenv.Pool(t)
	return newBank(t, pool, testenv.Schema(t, pool))
}

// handler books a payment. A payload that is not a payment is a permanent
// error; a negative amount too.
func (b *bank) handler() consumer.Handler[pgx.Tx] {
	return consumer.HandlerFunc[pgx.Tx](func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		var p payment
		if err := json.Unmarshal(m.Value, &p); err != nil {
			return consumer.Permanent(fmt.Errorf("decode payment: %w", err))
		}
		if p.Amount < 0 {
			return consumer.Permanent(fmt.Errorf("amount %d is negative", p.Amount))
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+b.table+` (txn_id, amount, source) VALUES ($1, $2, $3)`,
			p.TxnID, p.Amount, m.Coordinates())
		return err
	})
}

func (b *bank) config(src source.Source, dl consumer.DeadLetter) consumer.Config[pgx.Tx] {
	return consumer.Config[pgx.Tx]{
		Name:       "payments",
		Source:     src,
		Store:      b.store,
		Handler:    b.handler(),
		DeadLetter: dl,
		Key:        consumer.ByJSONField("txn_id"),
		BatchSize:  100,
	}
}

// rows returns the ledger's rows and distinct transactions.
func (b *bank) rows(t testing.TB) (rows, distinct int) {
	t.Helper()
	ctx := ctxTimeout(t, 10*time.Second)
	if err := b.pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT txn_id) FROM `+b.table).Scan(&rows, &distinct); err != nil {
		t.Fatal(err)
	}
	return rows, distinct
}

// requireLedger fails unless the ledger holds exactly one row per
// transaction in want and nothing else, and the dedup table one row per
// transaction.
func (b *bank) requireLedger(t testing.TB, want map[string]bool) {
	t.Helper()
	ctx := ctxTimeout(t, 30*time.Second)
	rows, err := b.pool.Query(ctx, `SELECT txn_id, count(*) FROM `+b.table+` GROUP BY txn_id`)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			t.Fatal(err)
		}
		got[id] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	bad := 0
	for id := range want {
		if got[id] != 1 {
			if bad++; bad <= 10 {
				t.Errorf("txn %s: %d ledger rows, want 1", id, got[id])
			}
		}
	}
	for id, n := range got {
		if !want[id] {
			if bad++; bad <= 10 {
				t.Errorf("txn %s: %d unexpected ledger rows", id, n)
			}
		}
	}
	if bad > 0 {
		t.Fatalf("%d transactions wrong (%d expected, %d booked)", bad, len(want), len(got))
	}
	var dedupRows int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM `+b.store.Table()+` WHERE outcome = 'done'`).Scan(&dedupRows); err != nil {
		t.Fatal(err)
	}
	if dedupRows != len(want) {
		t.Fatalf("%d dedup rows, want %d", dedupRows, len(want))
	}
}

// payments builds n callbacks with every fifth a re-send of an earlier one
// (same payload), spread round-robin over the partitions.
func payments(prefix string, n, partitions int) ([]kafkago.Message, map[string]bool) {
	msgs := make([]kafkago.Message, n)
	want := make(map[string]bool)
	for i := range msgs {
		k := i
		if i%5 == 4 {
			k = i / 2
		}
		id := fmt.Sprintf("%s-%06d", prefix, k)
		want[id] = true
		v, _ := json.Marshal(payment{TxnID: id, Amount: int64(k%97 + 1)})
		msgs[i] = kafkago.Message{Partition: i % partitions, Key: []byte(id), Value: v}
	}
	return msgs, want
}

// kafkaTest sets a real-broker test up: brokers, an admin client, a topic.
func kafkaTest(t *testing.T, partitions int) (brokers []string, a *admin, topic, group string) {
	t.Helper()
	return kafkaTestOn(t, testenv.KafkaBrokers(t), partitions)
}

func kafkaTestOn(t *testing.T, brokers []string, partitions int) (_ []string, a *admin, topic, group string) {
	t.Helper()
	a = newAdmin(t, brokers)
	topic, group = name(t, "t"), name(t, "g")
	a.CreateTopic(t, topic, partitions)
	return brokers, a, topic, group
}

// realSourceConfig: quick heartbeats and rebalances; the broker allows
// sessions down to 1s (group.min.session.timeout.ms).
func realSourceConfig(t testing.TB, brokers []string, topic, group string) kafka.Config {
	cfg := sourceConfig(t, brokers, topic, group)
	cfg.SessionTimeout = 3 * time.Second
	cfg.HeartbeatInterval = 200 * time.Millisecond
	return cfg
}

func startBank(t testing.TB, b *bank, src source.Source, dl consumer.DeadLetter) *running {
	cfg := b.config(src, dl)
	cfg.Logger = testLogger(t)
	return start(t, cfg)
}

// TestKafkaRestartsAndCrash: 10,000 callbacks, a fifth of them re-sends,
// over 4 partitions; the consumer is stopped gracefully, stopped hard, and
// killed (SIGKILL, in a child process that never commits an offset) in the
// middle of the stream, and restarted each time. The ledger ends with one
// row per transaction and the group with no lag.
func TestKafkaRestartsAndCrash(t *testing.T) {
	const partitions = 4
	brokers, a, topic, group := kafkaTest(t, partitions)
	b := newTestBank(t)
	msgs, want := payments("pay", 10000, partitions)
	a.Produce(t, topic, msgs...)
	samples := sampleOffsets(t, a, group, topic)
	dl := &consumertest.DeadLetters{}
	atLeast := func(n int) func() bool {
		return func() bool { rows, _ := b.rows(t); return rows >= n }
	}

	// 1: graceful stop.
	r := startBank(t, b, newSource(t, realSourceConfig(t, brokers, topic, group)), dl)
	waitUntil(t, time.Minute, "2,000 rows", atLeast(2000))
	r.Stop(t)
	// 2: hard stop: Run's context cancelled, transactions in flight roll back.
	r = startBank(t, b, newSource(t, realSourceConfig(t, brokers, topic, group)), dl)
	waitUntil(t, time.Minute, "4,000 rows", atLeast(4000))
	r.Kill(t)
	// 3: crash: a child process that never commits an offset is killed.
	before := a.committed(t, group, topic)
	child := startChild(t, topic, group, b.schema)
	waitUntil(t, time.Minute, "6,000 rows", atLeast(6000))
	child.kill(t)
	if after := a.committed(t, group, topic); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("the child committed offsets: %v before, %v after", before, after)
	}
	if rows, _ := b.rows(t); rows >= len(want) {
		t.Logf("the child finished the stream before it was killed (%d rows)", rows)
	}
	// 4: the rest, and everything the child did again.
	r = startBank(t, b, newSource(t, realSourceConfig(t, brokers, topic, group)), dl)
	waitUntil(t, 2*time.Minute, "every transaction booked", atLeast(len(want)))
	a.WaitNoLag(t, group, topic)
	r.Stop(t)

	b.requireLedger(t, want)
	a.requireNoLag(t, group, topic)
	samples.RequireMonotonic(t)
	if n := len(dl.Letters()); n != 0 {
		t.Fatalf("%d dead letters, want none: %v", n, dl.Letters()[0].Reason)
	}
	if st := r.Stats(); st.Duplicates == 0 {
		t.Errorf("last run: %+v; want it to skip the child's work as duplicates", st)
	}
}

// TestKafkaMembersJoinAndLeave: three members share a group; one leaves and
// another joins while messages are in flight. No effect twice, none lost,
// committed offsets never go down.
func TestKafkaMembersJoinAndLeave(t *testing.T) {
	const partitions = 6
	brokers, a, topic, group := kafkaTest(t, partitions)
	b := newTestBank(t)
	samples := sampleOffsets(t, a, group, topic)
	dl := &consumertest.DeadLetters{}
	member := func() *running {
		cfg := b.config(newSource(t, realSourceConfig(t, brokers, topic, group)), dl)
		cfg.Logger = testLogger(t)
		inner := cfg.Handler
		cfg.Handler = consumer.HandlerFunc[pgx.Tx](func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			time.Sleep(time.Millisecond) // pace: members change while messages are in flight
			return inner.Handle(ctx, tx, m)
		})
		return start(t, cfg)
	}
	m1, m2, m3 := member(), member(), member()
	waitUntil(t, time.Minute, "three members", func() bool { return a.StableMembers(group) == 3 })
	first, want := payments("w1", 3000, partitions)
	a.Produce(t, topic, first...)
	waitUntil(t, time.Minute, "800 rows", func() bool { rows, _ := b.rows(t); return rows >= 800 })
	m3.Stop(t) // leaves mid-stream
	m4 := member()
	waitUntil(t, time.Minute, "m4 joined", func() bool { return a.StableMembers(group) == 3 })
	rows, _ := b.rows(t)
	t.Logf("m4 joined with %d of %d rows of the first wave booked", rows, len(want))
	second, want2 := payments("w2", 3000, partitions)
	a.Produce(t, topic, second...)
	maps.Copy(want, want2)
	waitUntil(t, 2*time.Minute, "every transaction booked", func() bool { rows, _ := b.rows(t); return rows >= len(want) })
	a.WaitNoLag(t, group, topic)
	for _, m := range []*running{m1, m2, m4} {
		m.Stop(t)
	}
	b.requireLedger(t, want)
	a.requireNoLag(t, group, topic)
	samples.RequireMonotonic(t)
	if m3.Stats().Applied == 0 || m4.Stats().Applied == 0 {
		t.Errorf("the leaving member applied %d, the joining one %d; want both to have worked",
			m3.Stats().Applied, m4.Stats().Applied)
	}
}

// TestKafkaDeadLettersAndRetries: undecodable payloads, handler Permanent
// errors and a re-used transaction number with another payload land on the
// dead-letter topic with their reasons while their partitions go on; a
// handler failing twice with a transient error books once.
func TestKafkaDeadLettersAndRetries(t *testing.T) {
	const partitions = 2
	brokers, a, topic, group := kafkaTest(t, partitions)
	a.CreateTopic(t, topic+".dlq", partitions)
	b := newTestBank(t)
	pay := func(p int, id string, amount int64) kafkago.Message {
		v, _ := json.Marshal(payment{TxnID: id, Amount: amount})
		return kafkago.Message{Partition: p, Key: []byte(id), Value: v}
	}
	want := map[string]bool{}
	var msgs []kafkago.Message
	for i := range 10 {
		for p := range partitions {
			id := fmt.Sprintf("ok-%d-%d", p, i)
			want[id] = true
			msgs = append(msgs, pay(p, id, 10))
		}
		switch i {
		case 2:
			msgs = append(msgs, kafkago.Message{Partition: 0, Key: []byte("garbage"), Value: []byte("<xml/>"),
				Headers: []kafkago.Header{{Key: "trace-id", Value: []byte("abc")}}})
			msgs = append(msgs, pay(1, "negative", -5))
		case 4:
			msgs = append(msgs, pay(0, "flaky", 7))
			want["flaky"] = true
			msgs = append(msgs, kafkago.Message{Partition: 1, Key: []byte("truncated"), Value: []byte(`{"txn_id":"t`)})
		case 6:
			msgs = append(msgs, pay(0, "ok-0-0", 999)) // same transaction, another amount
		}
	}
	a.Produce(t, topic, msgs...)

	var flakyCalls atomic.Int32
	src := newSource(t, realSourceConfig(t, brokers, topic, group))
	cfg := b.config(src, src)
	cfg.Logger = testLogger(t)
	cfg.Clock = consumertest.NewClock() // retries without sleeping
	inner := cfg.Handler
	cfg.Handler = consumer.HandlerFunc[pgx.Tx](func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if string(m.Key) == "flaky" && flakyCalls.Add(1) <= 2 {
			return consumer.Retryable(errors.New("channel API timed out"))
		}
		return inner.Handle(ctx, tx, m)
	})
	r := start(t, cfg)
	waitUntil(t, time.Minute, "good transactions booked", func() bool { rows, _ := b.rows(t); return rows >= len(want) })
	a.WaitNoLag(t, group, topic)
	r.Stop(t)

	b.requireLedger(t, want)
	if n := flakyCalls.Load(); n != 3 {
		t.Errorf("flaky handler ran %d times, want 3", n)
	}
	if st := r.Stats(); st.DeadLettered != 4 {
		t.Errorf("stats %+v: want 4 dead letters", st)
	}
	letters := a.readAll(t, topic+".dlq", 4)
	byKey := map[string]kafkago.Message{}
	for _, l := range letters {
		byKey[string(l.Key)] = l
	}
	check := func(key, reason string, partition int, attempts string) {
		t.Helper()
		l, ok := byKey[key]
		if !ok {
			t.Errorf("no dead letter for %s", key)
			return
		}
		if got := kafkatest.Header(l, wire.MetaReason); !strings.Contains(got, reason) {
			t.Errorf("%s: reason %q, want it to contain %q", key, got, reason)
		}
		wantHeaders(t, l, map[string]string{
			wire.MetaTopic: topic, wire.MetaPartition: strconv.Itoa(partition), wire.MetaAttempts: attempts,
		})
		if off, err := strconv.ParseInt(kafkatest.Header(l, wire.MetaOffset), 10, 64); err != nil || off < 0 {
			t.Errorf("%s: offset header %q", key, kafkatest.Header(l, wire.MetaOffset))
		}
		if l.Partition != partition {
			t.Errorf("%s: dead letter on partition %d, want %d", key, l.Partition, partition)
		}
	}
	check("garbage", "malformed payload", 0, "0")
	check("truncated", "malformed payload", 1, "0")
	check("negative", "amount -5 is negative", 1, "1")
	check("ok-0-0", "different payload", 0, "0")
	if g := byKey["garbage"]; kafkatest.Header(g, "trace-id") != "abc" || string(g.Value) != "<xml/>" {
		t.Errorf("garbage letter lost its payload or headers: %q %v", g.Value, g.Headers)
	}
	if n := byKey["negative"]; kafkatest.Header(n, wire.MetaKey) != "negative" || kafkatest.Header(n, wire.MetaKeyScope) != "payments" {
		t.Errorf("negative letter key headers: %v", n.Headers)
	}
}

// TestKafkaBrokerRestart: the broker is killed (SIGKILL) and started again
// while the consumer works; the consumer resumes by itself and books
// everything, produced before and after, once.
func TestKafkaBrokerRestart(t *testing.T) {
	const partitions = 4
	// No other test, of this package or another, may use the broker while
	// this one kills it.
	brokers, a, topic, group := kafkaTestOn(t, testenv.KafkaExclusive(t), partitions)
	script := kafkaScript(t)
	if out, err := exec.Command(script, "status").CombinedOutput(); err != nil {
		// The test kills and restarts the broker through the script; a
		// broker it does not manage cannot take part.
		msg := fmt.Sprintf("the broker at %v is not managed by scripts/testenv/kafka.sh: %s", brokers, out)
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	t.Cleanup(func() {
		// Whatever happened, leave a running broker to the tests after us.
		if out, err := exec.Command(script, "start").CombinedOutput(); err != nil {
			t.Errorf("kafka.sh start: %v\n%s", err, out)
		}
	})
	b := newTestBank(t)
	msgs, want := payments("pre", 3000, partitions)
	a.Produce(t, topic, msgs...)
	dl := &consumertest.DeadLetters{}
	cfg := b.config(newSource(t, realSourceConfig(t, brokers, topic, group)), dl)
	cfg.Logger = testLogger(t)
	inner := cfg.Handler
	cfg.Handler = consumer.HandlerFunc[pgx.Tx](func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		time.Sleep(time.Millisecond) // pace: the broker dies in the middle of the stream
		return inner.Handle(ctx, tx, m)
	})
	r := start(t, cfg)
	waitUntil(t, time.Minute, "500 rows", func() bool { rows, _ := b.rows(t); return rows >= 500 })

	if out, err := exec.Command(script, "kill").CombinedOutput(); err != nil {
		t.Fatalf("kafka.sh kill: %v\n%s", err, out)
	}
	rowsAtKill, _ := b.rows(t)
	if out, err := exec.Command(script, "start").CombinedOutput(); err != nil {
		t.Fatalf("kafka.sh start: %v\n%s", err, out)
	}
	// What was fetched before the kill may all be booked by now; the second
	// wave can only come from the restarted broker.
	t.Logf("%d of %d rows booked when the broker was killed", rowsAtKill, len(want))
	a.Transport.CloseIdleConnections() // the admin's connections died with the broker
	more, want2 := payments("post", 1000, partitions)
	a.Produce(t, topic, more...)
	maps.Copy(want, want2)
	waitUntil(t, 3*time.Minute, "every transaction booked", func() bool { rows, _ := b.rows(t); return rows >= len(want) })
	a.WaitNoLag(t, group, topic)
	r.Stop(t)
	b.requireLedger(t, want)
	a.requireNoLag(t, group, topic)
	if n := len(dl.Letters()); n != 0 {
		t.Fatalf("%d dead letters: %v", n, dl.Letters()[0].Reason)
	}
}

func kafkaScript(t testing.TB) string {
	_, file, _, _ := runtime.Caller(0)
	p := filepath.Join(filepath.Dir(file), "..", "..", "scripts", "testenv", "kafka.sh")
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("kafka.sh: %v", err)
	}
	return p
}

// The child process: a consumer that commits no offset (CommitInterval of
// an hour), run until the parent kills it.
const childEnv = "IDEM_KAFKA_TEST_CHILD"

type childProc struct{ *testenv.Child }

func startChild(t *testing.T, topic, group, schema string, env ...string) *childProc {
	t.Helper()
	c := testenv.StartChild(t, append([]string{childEnv + "=1", "CHILD_TOPIC=" + topic, "CHILD_GROUP=" + group, "CHILD_SCHEMA=" + schema}, env...)...)
	t.Cleanup(func() {
		c.Kill()
		if t.Failed() {
			t.Logf("child output:\n%s", c.Out)
		}
	})
	return &childProc{c}
}

func (c *childProc) kill(testing.TB) { c.Kill() } // SIGKILL: no stop, no commit, no LeaveGroup

func slogStderr() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

func runChild() int {
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("IDEM_TEST_PG_URL"))
	if err != nil {
		return fail(err)
	}
	b := &bank{pool: pool, schema: os.Getenv("CHILD_SCHEMA")}
	b.table = pgx.Identifier{b.schema, "ledger"}.Sanitize()
	if b.store, err = pgstore.New(pool, pgstore.Config{Schema: b.schema}); err != nil {
		return fail(err)
	}
	log := slogStderr()
	src, err := kafka.New(kafka.Config{
		Brokers:           strings.Split(os.Getenv("IDEM_TEST_KAFKA_BROKERS"), ","),
		Topics:            []string{os.Getenv("CHILD_TOPIC")},
		Group:             os.Getenv("CHILD_GROUP"),
		MaxWait:           100 * time.Millisecond,
		SessionTimeout:    2 * time.Second,
		HeartbeatInterval: 200 * time.Millisecond,
		CommitInterval:    time.Hour,
		Logger:            log,
	})
	if err != nil {
		return fail(err)
	}
	cfg := b.config(src, &consumertest.DeadLetters{})
	cfg.Logger = log
	if os.Getenv("CHILD_OFFSETS") != "" { // offsets in the store: see offsets_test.go
		cfg.Offsets, cfg.Key = b.store, nil
	}
	c, err := consumer.New(cfg)
	if err != nil {
		return fail(err)
	}
	if err := c.Run(ctx); err != nil {
		return fail(err)
	}
	return 0
}

// pay is a payment callback on partition p.
func pay(p int, id string, amount int64) kafkago.Message {
	v, _ := json.Marshal(payment{TxnID: id, Amount: amount})
	return kafkago.Message{Partition: p, Key: []byte(id), Value: v}
}

// TestKafkaTransactionalTopic: a topic written by an exactly-once producer,
// committed and aborted transactions interleaved with records written
// outside any transaction, read across a restart, with a transaction open
// while the consumer stops and committed after it started again. The
// ledger books exactly the committed and the non-transactional payments
// (an aborted payment or a transaction marker would be a wrong row or a
// dead letter), and the group ends without lag although partitions end
// with markers.
func TestKafkaTransactionalTopic(t *testing.T) {
	const partitions = 2
	brokers, a, topic, group := kafkaTest(t, partitions)
	b := newTestBank(t)
	tp := newTxnProducer(t, brokers, topic)
	dl := &consumertest.DeadLetters{}
	want := map[string]bool{}
	// wave produces 12 transactions of 10 payments each over both
	// partitions, every third one aborted, with payments outside any
	// transaction written while some of them are open.
	wave := func(prefix string) {
		for i := range 12 {
			commit := i%3 != 1
			tp.begin(t)
			for j := range 10 {
				id := fmt.Sprintf("%s-t%02d-%d", prefix, i, j)
				tp.write(t, pay(j%partitions, id, 10))
				if commit {
					want[id] = true
				}
				if j == 4 {
					id := fmt.Sprintf("%s-n%02d", prefix, i)
					a.Produce(t, topic, pay(i%partitions, id, 1))
					want[id] = true
				}
			}
			tp.end(t, commit)
		}
	}
	wave("w1")
	r := startBank(t, b, newSource(t, realSourceConfig(t, brokers, topic, group)), dl)
	waitUntil(t, 2*time.Minute, "the first wave booked", func() bool { rows, _ := b.rows(t); return rows >= len(want) })
	a.WaitNoLag(t, group, topic)

	// A transaction open across the restart holds its partition back at
	// its first record: neither it nor the payment written after it on the
	// same partition is booked before it commits.
	open := newTxnProducer(t, brokers, topic)
	open.begin(t)
	open.write(t, pay(0, "open-1", 5))
	a.Produce(t, topic, pay(0, "after-open", 5), pay(1, "probe", 5))
	want["probe"] = true
	waitUntil(t, time.Minute, "the probe on the other partition booked", func() bool { rows, _ := b.rows(t); return rows >= len(want) })
	r.Stop(t)
	if rows, _ := b.rows(t); rows != len(want) {
		t.Fatalf("%d rows, want %d: payments past an open transaction were booked", rows, len(want))
	}
	wave("w2")
	a.Produce(t, topic, pay(1, "probe-2", 5))
	want["probe-2"] = true
	r = startBank(t, b, newSource(t, realSourceConfig(t, brokers, topic, group)), dl)
	waitUntil(t, 2*time.Minute, "the second probe booked", func() bool {
		var n int
		err := b.pool.QueryRow(ctxTimeout(t, 10*time.Second), `SELECT count(*) FROM `+b.table+` WHERE txn_id = 'probe-2'`).Scan(&n)
		return err == nil && n > 0
	})
	if rows, _ := b.rows(t); rows >= len(want) {
		t.Fatalf("%d rows of %d with a transaction open on partition 0: payments past it were booked", rows, len(want))
	}
	open.end(t, true)
	want["open-1"], want["after-open"] = true, true
	waitUntil(t, 2*time.Minute, "everything booked", func() bool { rows, _ := b.rows(t); return rows >= len(want) })
	a.WaitNoLag(t, group, topic)
	r.Stop(t)

	b.requireLedger(t, want)
	a.requireNoLag(t, group, topic)
	if n := len(dl.Letters()); n != 0 {
		l := dl.Letters()[0]
		t.Fatalf("%d dead letters, the first %s (value %q): %v", n, l.Message.Coordinates(), l.Message.Value, l.Reason)
	}
	if st := r.Stats(); st.Delivered >= int64(len(want)) {
		t.Errorf("the second run had %d deliveries for %d payments of its own: it read the first run's again", st.Delivered, len(want)/2)
	}
}

// TestKafkaTopicRecreated: the topic is deleted and created again while
// the consumer owns its partition and a message of the old topic is in
// flight. The fetcher finds its offset past the new log's end and starts
// over at the log start (as auto.offset.reset would); the old message is
// settled without its offset being committed for the new log, the new
// messages are booked and committed to the new log's end, and Stop returns.
func TestKafkaTopicRecreated(t *testing.T) {
	brokers, a, topic, group := kafkaTest(t, 1)
	b := newTestBank(t)
	want := map[string]bool{}
	for i := range 10 {
		id := fmt.Sprintf("old-%d", i)
		a.Produce(t, topic, pay(0, id, 1))
		want[id] = true
	}
	dl := &consumertest.DeadLetters{}
	scfg := realSourceConfig(t, brokers, topic, group)
	scfg.PartitionWatchInterval = -1 // the assignment outlives the topic
	cfg := b.config(newSource(t, scfg), dl)
	cfg.Logger = testLogger(t)
	release := make(chan struct{})
	cfg.Handler = holdKey(cfg.Handler, "old-9", release) // in flight while the topic is recreated
	r := start(t, cfg)
	waitUntil(t, time.Minute, "the old messages delivered", func() bool { return r.Stats().Delivered == 10 })

	a.recreate(t, topic, 1)
	for i := range 3 {
		id := fmt.Sprintf("new-%d", i)
		a.Produce(t, topic, pay(0, id, 1))
		want[id] = true
	}
	waitUntil(t, 2*time.Minute, "the new topic's messages delivered behind old-9", func() bool { return r.Stats().Delivered == 13 })
	close(release)
	waitUntil(t, time.Minute, "every payment booked", func() bool { rows, _ := b.rows(t); return rows >= len(want) })
	a.WaitNoLag(t, group, topic)
	r.StopWithin(t, 30*time.Second)
	b.requireLedger(t, want)
	a.requireNoLag(t, group, topic)
	if n := len(dl.Letters()); n != 0 {
		t.Fatalf("%d dead letters: %v", n, dl.Letters()[0].Reason)
	}
}
