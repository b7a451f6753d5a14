package kafka_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"

	"github.com/idemkit/idem/adapters/kafka"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/internal/testenv/bgconsumer"
	"github.com/idemkit/idem/internal/testenv/kafkatest"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(runChild())
	}
	goleak.VerifyTestMain(m)
}

// name returns a topic or group name unique to this test run.
func name(t testing.TB, what string) string { return testenv.Name(t, what) }

// testLogger is testenv.Logger.
func testLogger(t testing.TB) *slog.Logger { return testenv.Logger(t) }

// waitUntil is testenv.WaitUntil.
func waitUntil(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	testenv.WaitUntil(t, d, what, cond)
}

// ctxTimeout is testenv.Context.
func ctxTimeout(t testing.TB, d time.Duration) context.Context { return testenv.Context(t, d) }

// admin is kafkatest.Admin with the checks of this package's tests.
type admin struct{ *kafkatest.Admin }

func newAdmin(t testing.TB, brokers []string) *admin { return &admin{kafkatest.NewAdmin(t, brokers)} }

// recreate deletes topic and creates it again with as many partitions.
func (a *admin) recreate(t testing.TB, topic string, partitions int) {
	t.Helper()
	res, err := a.Client.DeleteTopics(ctxTimeout(t, 30*time.Second), &kafkago.DeleteTopicsRequest{Topics: []string{topic}})
	if err == nil {
		err = res.Errors[topic]
	}
	if err != nil {
		t.Fatalf("delete topic %s: %v", topic, err)
	}
	waitUntil(t, time.Minute, "topic "+topic+" created again", func() bool {
		res, err := a.Client.CreateTopics(ctxTimeout(t, 30*time.Second), &kafkago.CreateTopicsRequest{
			Topics: []kafkago.TopicConfig{{Topic: topic, NumPartitions: partitions, ReplicationFactor: 1}},
		})
		if err == nil {
			err = res.Errors[topic]
		}
		if errors.Is(err, kafkago.TopicAlreadyExists) {
			// A broker with auto.create.topics.enable may have created it
			// for a client that looked it up (a fetcher reconnecting).
			md, err := a.Client.Metadata(ctxTimeout(t, 10*time.Second), &kafkago.MetadataRequest{Topics: []string{topic}})
			if err == nil && len(md.Topics) == 1 && md.Topics[0].Error == nil {
				t.Logf("topic %s was created again with %d partitions before the test did", topic, len(md.Topics[0].Partitions))
				partitions = len(md.Topics[0].Partitions)
				return true
			}
		}
		return err == nil
	})
	a.WaitLeaders(t, topic, partitions)
}

// committed returns the group's committed offsets of topic's partitions
// (-1: none).
func (a *admin) committed(t testing.TB, group, topic string) []int64 {
	t.Helper()
	got, err := a.Committed(ctxTimeout(t, 10*time.Second), group, topic)
	if err != nil {
		t.Fatalf("offset fetch %s: %v", group, err)
	}
	return got
}

// highWatermarks returns the end offsets of topic's partitions.
func (a *admin) highWatermarks(t testing.TB, topic string) []int64 {
	t.Helper()
	hwm, err := a.HighWatermarks(ctxTimeout(t, 10*time.Second), topic)
	if err != nil {
		t.Fatalf("high watermarks of %s: %v", topic, err)
	}
	return hwm
}

// requireNoLag fails unless group committed every partition of topic up to
// its high watermark.
func (a *admin) requireNoLag(t testing.TB, group, topic string) {
	t.Helper()
	hwm := a.highWatermarks(t, topic)
	got := a.committed(t, group, topic)
	for i := range hwm {
		if got[i] != hwm[i] {
			t.Fatalf("partition %d: committed %d, high watermark %d (lag %d); all: committed %v, hwm %v",
				i, got[i], hwm[i], hwm[i]-got[i], got, hwm)
		}
	}
}

// readAll reads every message of topic and fails unless there are n.
func (a *admin) readAll(t testing.TB, topic string, n int) []kafkago.Message {
	t.Helper()
	out := a.ReadAll(t, topic)
	if len(out) != n {
		t.Fatalf("%s holds %d messages, want %d", topic, len(out), n)
	}
	return out
}

// sampleOffsets samples group's committed offsets of topic until the test
// checks them (RequireMonotonic) or ends.
func sampleOffsets(t testing.TB, a *admin, group, topic string) *testenv.OffsetSampler {
	return testenv.SampleOffsets(t, 20*time.Millisecond, a.Offsets(group, topic), nil)
}

// sourceConfig is the test's source configuration: quick heartbeats,
// rebalances and reconnects.
func sourceConfig(t testing.TB, brokers []string, topic, group string) kafka.Config {
	return kafka.Config{
		Brokers:           brokers,
		Topics:            []string{topic},
		Group:             group,
		MaxWait:           100 * time.Millisecond,
		RequestTimeout:    3 * time.Second,
		ReconnectBackoff:  500 * time.Millisecond,
		SessionTimeout:    6 * time.Second,
		HeartbeatInterval: 200 * time.Millisecond,
		RebalanceTimeout:  10 * time.Second,
		JoinGroupBackoff:  200 * time.Millisecond,
		CloseTimeout:      10 * time.Second,
		Logger:            testLogger(t),
	}
}

func newSource(t testing.TB, cfg kafka.Config) *kafka.Source {
	t.Helper()
	src, err := kafka.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return src
}

// running is a consumer running in the background.
type running = bgconsumer.Running

func start[TTx any](t testing.TB, cfg consumer.Config[TTx]) *running {
	t.Helper()
	return bgconsumer.Start(t, cfg)
}

// holdKey wraps next: the message of record key key waits for release
// (or its context's end) before next handles it.
func holdKey[TTx any](next consumer.Handler[TTx], key string, release <-chan struct{}) consumer.Handler[TTx] {
	return consumer.HandlerFunc[TTx](func(ctx context.Context, tx TTx, m *consumer.Message) error {
		if string(m.Key) == key {
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return next.Handle(ctx, tx, m)
	})
}

// effects counts the effects per key, as a business table would.
type effects struct {
	mu    sync.Mutex
	byKey map[string]int
	total int
}

func newEffects() *effects { return &effects{byKey: make(map[string]int)} }

func (e *effects) add(key string) {
	e.mu.Lock()
	e.byKey[key]++
	e.total++
	e.mu.Unlock()
}

func (e *effects) counts() (keys, total int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.byKey), e.total
}

// requireOnce fails unless every key in want has exactly one effect and no
// other key has any.
func (e *effects) requireOnce(t testing.TB, want map[string]bool) {
	t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	for k := range want {
		if n := e.byKey[k]; n != 1 {
			t.Errorf("key %s: %d effects, want 1", k, n)
		}
	}
	for k, n := range e.byKey {
		if !want[k] {
			t.Errorf("key %s: %d unexpected effects", k, n)
		}
	}
}

// txnProducer writes to a topic in Kafka transactions, as the exactly-once
// producers of Kafka Streams, Flink or Debezium do: every transaction ends
// with a control record (a commit or abort marker) in each partition it
// wrote to, and the records of an aborted transaction stay in the log.
type txnProducer struct {
	cl    *kgo.Client
	topic string
}

func newTxnProducer(t testing.TB, brokers []string, topic string) *txnProducer {
	t.Helper()
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(brokers...),
		kgo.TransactionalID(name(t, "txn")),
		kgo.TransactionTimeout(5*time.Minute), // longer than any test
		kgo.DefaultProduceTopic(topic),
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
	)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return &txnProducer{cl: cl, topic: topic}
}

// tx runs one transaction: it writes msgs (Partition, Key and Value are
// used) and commits or aborts.
func (p *txnProducer) tx(t testing.TB, commit bool, msgs ...kafkago.Message) {
	t.Helper()
	p.begin(t)
	p.write(t, msgs...)
	p.end(t, commit)
}

func (p *txnProducer) begin(t testing.TB) {
	t.Helper()
	if err := p.cl.BeginTransaction(); err != nil {
		t.Fatalf("begin transaction: %v", err)
	}
}

// write produces msgs in the open transaction and returns their offsets.
func (p *txnProducer) write(t testing.TB, msgs ...kafkago.Message) []int64 {
	t.Helper()
	recs := make([]*kgo.Record, len(msgs))
	for i, m := range msgs {
		recs[i] = &kgo.Record{Topic: p.topic, Partition: int32(m.Partition), Key: m.Key, Value: m.Value}
	}
	if err := p.cl.ProduceSync(ctxTimeout(t, time.Minute), recs...).FirstErr(); err != nil {
		t.Fatalf("transactional produce to %s: %v", p.topic, err)
	}
	offsets := make([]int64, len(recs))
	for i, r := range recs {
		offsets[i] = r.Offset
	}
	return offsets
}

func (p *txnProducer) end(t testing.TB, commit bool) {
	t.Helper()
	if err := p.cl.EndTransaction(ctxTimeout(t, time.Minute), kgo.TransactionEndTry(commit)); err != nil {
		t.Fatalf("end transaction (commit %v): %v", commit, err)
	}
}
