package kafka_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"

	"github.com/idemkit/idem/adapters/kafka"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/internal/testenv"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(runChild())
	}
	goleak.VerifyTestMain(m)
}

var uniq atomic.Int64

// name returns a topic or group name unique to this test run.
func name(t testing.TB, what string) string {
	s := strings.NewReplacer("/", "-", " ", "-").Replace(t.Name())
	return fmt.Sprintf("idem-%s-%s-%d-%d", what, s, os.Getpid(), uniq.Add(1))
}

// testLogger is testenv.Logger.
func testLogger(t testing.TB) *slog.Logger { return testenv.Logger(t) }

// admin is a kafka-go client for topic setup and offset checks.
type admin struct {
	brokers []string
	client  *kafkago.Client
	tr      *kafkago.Transport
}

func newAdmin(t testing.TB, brokers []string) *admin {
	tr := &kafkago.Transport{DialTimeout: 5 * time.Second, MetadataTTL: time.Second}
	t.Cleanup(tr.CloseIdleConnections)
	return &admin{
		brokers: brokers,
		tr:      tr,
		client:  &kafkago.Client{Addr: kafkago.TCP(brokers...), Transport: tr, Timeout: 10 * time.Second},
	}
}

func ctxTimeout(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// createTopic creates topic and waits until every partition has a leader.
func (a *admin) createTopic(t testing.TB, topic string, partitions int) {
	t.Helper()
	ctx := ctxTimeout(t, 30*time.Second)
	res, err := a.client.CreateTopics(ctx, &kafkago.CreateTopicsRequest{
		Topics: []kafkago.TopicConfig{{Topic: topic, NumPartitions: partitions, ReplicationFactor: 1}},
	})
	if err != nil {
		t.Fatalf("create topic %s: %v", topic, err)
	}
	if err := res.Errors[topic]; err != nil && !errors.Is(err, kafkago.TopicAlreadyExists) {
		t.Fatalf("create topic %s: %v", topic, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		res, err := a.client.DeleteTopics(ctx, &kafkago.DeleteTopicsRequest{Topics: []string{topic}})
		if err == nil {
			err = res.Errors[topic]
		}
		if err != nil {
			t.Logf("delete topic %s: %v", topic, err)
		}
	})
	a.waitLeaders(t, topic, partitions)
}

// waitLeaders waits until topic has the given number of partitions, each
// with a leader.
func (a *admin) waitLeaders(t testing.TB, topic string, partitions int) {
	t.Helper()
	waitUntil(t, 30*time.Second, "topic "+topic+" has leaders", func() bool {
		md, err := a.client.Metadata(ctxTimeout(t, 10*time.Second), &kafkago.MetadataRequest{Topics: []string{topic}})
		if err != nil || len(md.Topics) != 1 || md.Topics[0].Error != nil || len(md.Topics[0].Partitions) != partitions {
			return false
		}
		for _, p := range md.Topics[0].Partitions {
			if p.Error != nil || p.Leader.Host == "" {
				return false
			}
		}
		return true
	})
}

// recreate deletes topic and creates it again with as many partitions.
func (a *admin) recreate(t testing.TB, topic string, partitions int) {
	t.Helper()
	res, err := a.client.DeleteTopics(ctxTimeout(t, 30*time.Second), &kafkago.DeleteTopicsRequest{Topics: []string{topic}})
	if err == nil {
		err = res.Errors[topic]
	}
	if err != nil {
		t.Fatalf("delete topic %s: %v", topic, err)
	}
	waitUntil(t, time.Minute, "topic "+topic+" created again", func() bool {
		res, err := a.client.CreateTopics(ctxTimeout(t, 30*time.Second), &kafkago.CreateTopicsRequest{
			Topics: []kafkago.TopicConfig{{Topic: topic, NumPartitions: partitions, ReplicationFactor: 1}},
		})
		if err == nil {
			err = res.Errors[topic]
		}
		if errors.Is(err, kafkago.TopicAlreadyExists) {
			// A broker with auto.create.topics.enable may have created it
			// for a client that looked it up (a fetcher reconnecting).
			md, err := a.client.Metadata(ctxTimeout(t, 10*time.Second), &kafkago.MetadataRequest{Topics: []string{topic}})
			if err == nil && len(md.Topics) == 1 && md.Topics[0].Error == nil {
				t.Logf("topic %s was created again with %d partitions before the test did", topic, len(md.Topics[0].Partitions))
				partitions = len(md.Topics[0].Partitions)
				return true
			}
		}
		return err == nil
	})
	a.waitLeaders(t, topic, partitions)
}

// produce writes msgs to topic, each to msgs[i].Partition.
func (a *admin) produce(t testing.TB, topic string, msgs ...kafkago.Message) {
	t.Helper()
	w := &kafkago.Writer{
		Addr:         kafkago.TCP(a.brokers...),
		Topic:        topic,
		Balancer:     kafkago.BalancerFunc(func(m kafkago.Message, _ ...int) int { return m.Partition }),
		RequiredAcks: kafkago.RequireAll,
		BatchSize:    1000,
		BatchBytes:   16 << 20,
		BatchTimeout: 5 * time.Millisecond,
		Transport:    a.tr,
	}
	defer w.Close()
	ctx := ctxTimeout(t, time.Minute)
	for len(msgs) > 0 {
		n := min(len(msgs), 2000)
		if err := w.WriteMessages(ctx, msgs[:n]...); err != nil {
			t.Fatalf("produce to %s: %v", topic, err)
		}
		msgs = msgs[n:]
	}
}

// offsets returns the group's committed offsets of topic's partitions (-1:
// none).
func (a *admin) committed(t testing.TB, group, topic string, partitions int) []int64 {
	t.Helper()
	ids := make([]int, partitions)
	for i := range ids {
		ids[i] = i
	}
	ctx := ctxTimeout(t, 10*time.Second)
	res, err := a.client.OffsetFetch(ctx, &kafkago.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: ids}})
	if err == nil {
		err = res.Error
	}
	if err != nil {
		t.Fatalf("offset fetch %s: %v", group, err)
	}
	out := make([]int64, partitions)
	for i := range out {
		out[i] = -1
	}
	for _, p := range res.Topics[topic] {
		if p.Error != nil {
			t.Fatalf("offset fetch %s partition %d: %v", group, p.Partition, p.Error)
		}
		out[p.Partition] = p.CommittedOffset
	}
	return out
}

// highWatermarks returns the end offsets of topic's partitions.
func (a *admin) highWatermarks(t testing.TB, topic string, partitions int) []int64 {
	t.Helper()
	reqs := make([]kafkago.OffsetRequest, partitions)
	for i := range reqs {
		reqs[i] = kafkago.LastOffsetOf(i)
	}
	ctx := ctxTimeout(t, 10*time.Second)
	res, err := a.client.ListOffsets(ctx, &kafkago.ListOffsetsRequest{Topics: map[string][]kafkago.OffsetRequest{topic: reqs}})
	if err != nil {
		t.Fatalf("list offsets %s: %v", topic, err)
	}
	out := make([]int64, partitions)
	for _, p := range res.Topics[topic] {
		if p.Error != nil {
			t.Fatalf("list offsets %s partition %d: %v", topic, p.Partition, p.Error)
		}
		out[p.Partition] = p.LastOffset
	}
	return out
}

// requireNoLag fails unless group committed every partition of topic up to
// its high watermark.
func (a *admin) requireNoLag(t testing.TB, group, topic string, partitions int) {
	t.Helper()
	hwm := a.highWatermarks(t, topic, partitions)
	got := a.committed(t, group, topic, partitions)
	for i := range hwm {
		if got[i] != hwm[i] {
			t.Fatalf("partition %d: committed %d, high watermark %d (lag %d); all: committed %v, hwm %v",
				i, got[i], hwm[i], hwm[i]-got[i], got, hwm)
		}
	}
}

// stableMembers returns how many members the group has once it is stable,
// -1 while it rebalances.
func (a *admin) stableMembers(t testing.TB, group string) int {
	t.Helper()
	ctx := ctxTimeout(t, 10*time.Second)
	res, err := a.client.DescribeGroups(ctx, &kafkago.DescribeGroupsRequest{GroupIDs: []string{group}})
	if err != nil || len(res.Groups) != 1 || res.Groups[0].Error != nil {
		return -1
	}
	if g := res.Groups[0]; g.GroupState == "Stable" {
		return len(g.Members)
	}
	return -1
}

// readAll reads topic's partitions from the start until it has n messages.
func (a *admin) readAll(t testing.TB, topic string, partitions, n int) []kafkago.Message {
	t.Helper()
	var out []kafkago.Message
	deadline := time.Now().Add(time.Minute)
	for p := 0; p < partitions; p++ {
		r := kafkago.NewReader(kafkago.ReaderConfig{Brokers: a.brokers, Topic: topic, Partition: p, MaxWait: 100 * time.Millisecond})
		hwm := a.highWatermarks(t, topic, partitions)[p]
		for off := int64(0); off < hwm; off++ {
			ctx, cancel := context.WithDeadline(context.Background(), deadline)
			m, err := r.ReadMessage(ctx)
			cancel()
			if err != nil {
				r.Close()
				t.Fatalf("read %s/%d at %d: %v", topic, p, off, err)
			}
			out = append(out, m)
		}
		r.Close()
	}
	if len(out) != n {
		t.Fatalf("%s holds %d messages, want %d", topic, len(out), n)
	}
	return out
}

// waitUntil polls cond until it holds, failing the test after d. The wait
// bounds a hang; no assertion depends on how long it took.
func waitUntil(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up after %v waiting until %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
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

// runner is a consumer.Consumer of any transaction type.
type runner interface {
	Run(ctx context.Context) error
	Stop(ctx context.Context) error
	Stats() consumer.Stats
}

// running is a consumer running in the background.
type running struct {
	c      runner
	cancel context.CancelFunc
	done   chan error
}

func start[TTx any](t testing.TB, cfg consumer.Config[TTx]) *running {
	t.Helper()
	c, err := consumer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{c: c, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- c.Run(ctx) }()
	t.Cleanup(func() { r.kill(t) })
	return r
}

// stop stops the consumer gracefully and fails the test unless it stopped
// within 30s.
func (r *running) stop(t testing.TB) {
	t.Helper()
	r.stopWithin(t, 30*time.Second)
}

// stopWithin stops the consumer gracefully and fails the test unless Stop
// returned nil, which it does only when Run returned before d passed.
func (r *running) stopWithin(t testing.TB, d time.Duration) {
	t.Helper()
	if r.done == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	if err := r.c.Stop(ctx); err != nil {
		t.Errorf("Stop: %v", err)
	}
	if err := <-r.done; err != nil {
		t.Errorf("Run: %v", err)
	}
	r.cancel()
	r.done = nil
}

// kill is a hard stop: Run's context is cancelled.
func (r *running) kill(t testing.TB) {
	t.Helper()
	if r.done == nil {
		return
	}
	r.cancel()
	if err := <-r.done; err != nil {
		t.Errorf("Run: %v", err)
	}
	r.done = nil
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

// offsetSampler samples a group's committed offsets and records any that
// went down.
type offsetSampler struct {
	stop chan struct{}
	done chan struct{}
	mu   sync.Mutex
	errs []string
	n    int
}

func sampleOffsets(t testing.TB, a *admin, group, topic string, partitions int) *offsetSampler {
	s := &offsetSampler{stop: make(chan struct{}), done: make(chan struct{})}
	ids := make([]int, partitions)
	for i := range ids {
		ids[i] = i
	}
	go func() {
		defer close(s.done)
		last := make([]int64, partitions)
		for i := range last {
			last[i] = -1
		}
		for {
			select {
			case <-s.stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			res, err := a.client.OffsetFetch(ctx, &kafkago.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: ids}})
			cancel()
			if err != nil || res.Error != nil {
				continue // the broker may be restarting
			}
			s.mu.Lock()
			s.n++
			for _, p := range res.Topics[topic] {
				if p.Error != nil || p.CommittedOffset < 0 {
					continue
				}
				if p.CommittedOffset < last[p.Partition] {
					s.errs = append(s.errs, fmt.Sprintf("partition %d: committed offset went from %d to %d",
						p.Partition, last[p.Partition], p.CommittedOffset))
				}
				last[p.Partition] = p.CommittedOffset
			}
			s.mu.Unlock()
		}
	}()
	t.Cleanup(s.finish)
	return s
}

func (s *offsetSampler) finish() {
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	<-s.done
}

// check stops sampling and fails the test if an offset went down.
func (s *offsetSampler) check(t testing.TB) {
	t.Helper()
	s.finish()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range s.errs {
		t.Error(e)
	}
	if s.n == 0 {
		t.Error("no offset sample was taken")
	}
	t.Logf("%d offset samples", s.n)
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
