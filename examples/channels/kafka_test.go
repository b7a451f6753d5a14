package channels_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	kafkago "github.com/segmentio/kafka-go"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/internal/testenv/rmqtest"
)

func TestMain(m *testing.M) {
	testenv.ChildMain(childEnv, (*killSpec).run) // in a child: consume, then exit
	// The RocketMQ client's known races suppressed, its logs discarded,
	// goleak but for what the client leaves behind.
	rmqtest.Main(m, slog.New(slog.NewTextHandler(io.Discard, nil)), slog.LevelError)
}

const partitions = 4

// lineHeader carries a record's line of stream.jsonl, for the test only.
const lineHeader = "stream-line"

var uniq atomic.Int64

// topicName is unique to this test process and call.
func topicName(t *testing.T) string {
	s := strings.NewReplacer("/", "-", " ", "-").Replace(t.Name())
	return fmt.Sprintf("idem-channels-%s-%d-%d", s, os.Getpid(), uniq.Add(1))
}

// admin creates topics, produces and reads offsets on the test broker.
type admin struct {
	brokers []string
	client  *kafkago.Client
	tr      *kafkago.Transport
}

func newAdmin(t *testing.T, brokers []string) *admin {
	tr := &kafkago.Transport{DialTimeout: 5 * time.Second, MetadataTTL: time.Second}
	t.Cleanup(tr.CloseIdleConnections)
	return &admin{brokers: brokers, tr: tr, client: &kafkago.Client{Addr: kafkago.TCP(brokers...), Transport: tr, Timeout: 10 * time.Second}}
}

func timeout(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// createTopic creates topic, waits until its partitions have leaders, and
// deletes it when the test ends.
func (a *admin) createTopic(t *testing.T, topic string, n int) {
	t.Helper()
	ctx := timeout(t, 30*time.Second)
	res, err := a.client.CreateTopics(ctx, &kafkago.CreateTopicsRequest{
		Topics: []kafkago.TopicConfig{{Topic: topic, NumPartitions: n, ReplicationFactor: 1}},
	})
	if err == nil {
		err = res.Errors[topic]
	}
	if err != nil && !errors.Is(err, kafkago.TopicAlreadyExists) {
		t.Fatalf("create topic %s: %v", topic, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := a.client.DeleteTopics(ctx, &kafkago.DeleteTopicsRequest{Topics: []string{topic}}); err != nil {
			t.Logf("delete topic %s: %v", topic, err)
		}
	})
	waitUntil(t, 30*time.Second, "topic "+topic+" has leaders", func() bool {
		md, err := a.client.Metadata(ctx, &kafkago.MetadataRequest{Topics: []string{topic}})
		if err != nil || len(md.Topics) != 1 || md.Topics[0].Error != nil || len(md.Topics[0].Partitions) != n {
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

// produce writes msgs in one call: kafka-go keeps their order per partition.
func (a *admin) produce(t *testing.T, topic string, msgs []kafkago.Message) {
	t.Helper()
	w := &kafkago.Writer{
		Addr: kafkago.TCP(a.brokers...), Topic: topic, Transport: a.tr,
		Balancer: &kafkago.Hash{}, RequiredAcks: kafkago.RequireAll,
		BatchSize: len(msgs), BatchBytes: 16 << 20, BatchTimeout: 5 * time.Millisecond,
	}
	defer w.Close()
	if err := w.WriteMessages(timeout(t, time.Minute), msgs...); err != nil {
		t.Fatalf("produce to %s: %v", topic, err)
	}
}

// offsets returns topic's high watermarks and group's committed offsets.
func (a *admin) offsets(ctx context.Context, group, topic string, n int) (hwm, committed []int64, err error) {
	ids := make([]int, n)
	reqs := make([]kafkago.OffsetRequest, n)
	for i := range ids {
		ids[i], reqs[i] = i, kafkago.LastOffsetOf(i)
	}
	lo, err := a.client.ListOffsets(ctx, &kafkago.ListOffsetsRequest{Topics: map[string][]kafkago.OffsetRequest{topic: reqs}})
	if err != nil {
		return nil, nil, err
	}
	hwm, committed = make([]int64, n), make([]int64, n)
	for _, p := range lo.Topics[topic] {
		if p.Error != nil {
			return nil, nil, p.Error
		}
		hwm[p.Partition] = p.LastOffset
	}
	of, err := a.client.OffsetFetch(ctx, &kafkago.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: ids}})
	if err == nil {
		err = of.Error
	}
	if err != nil {
		return nil, nil, err
	}
	for i := range committed {
		committed[i] = -1
	}
	for _, p := range of.Topics[topic] {
		if p.Error == nil {
			committed[p.Partition] = p.CommittedOffset
		}
	}
	return hwm, committed, nil
}

// readAll reads partition 0 of topic from its start to its high watermark.
func (a *admin) readAll(t *testing.T, topic string) []kafkago.Message {
	t.Helper()
	ctx := timeout(t, time.Minute)
	hwm, _, err := a.offsets(ctx, "idem-channels-nobody", topic, 1)
	if err != nil {
		t.Fatal(err)
	}
	r := kafkago.NewReader(kafkago.ReaderConfig{Brokers: a.brokers, Topic: topic, Partition: 0, MaxWait: 100 * time.Millisecond})
	defer r.Close()
	var out []kafkago.Message
	for int64(len(out)) < hwm[0] {
		m, err := r.ReadMessage(ctx)
		if err != nil {
			t.Fatalf("read %s: %v", topic, err)
		}
		out = append(out, m)
	}
	return out
}

// waitUntil polls cond until it holds, failing the test after d: the
// deadline bounds a hang, nothing depends on how long it took.
func waitUntil(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up after %v waiting until %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// lineOf returns the stream line a record carries.
func lineOf(m *consumer.Message) int {
	v, _ := m.Header(lineHeader)
	n, _ := strconv.Atoi(string(v))
	return n
}

// letterHeader returns the stream line a record of the dead-letter topic
// carries and the value of its header key ("" without one).
func letterHeader(m kafkago.Message, key string) (line int, value string) {
	for _, h := range m.Headers {
		switch h.Key {
		case lineHeader:
			line, _ = strconv.Atoi(string(h.Value))
		case key:
			value = string(h.Value)
		}
	}
	return line, value
}

// seen collects what the consumer did with each line.
type seen struct {
	consumer.NopObserver
	mu         sync.Mutex
	byID       map[string]int          // message ID -> line, for every message handled
	duplicates map[int]bool            // lines skipped as duplicates
	stale      map[int]bool            // lines settled stale (consumer.OutcomeStale)
	letters    map[int]consumer.Letter // lines dead-lettered, the last letter
	at         map[int32]map[int64]int // partition -> offset -> line
	dead       consumer.DeadLetter     // where letters go on to
}

func newSeen(next consumer.DeadLetter) *seen {
	return &seen{byID: map[string]int{}, duplicates: map[int]bool{}, stale: map[int]bool{}, letters: map[int]consumer.Letter{},
		at: map[int32]map[int64]int{}, dead: next}
}

func (s *seen) note(m *consumer.Message) int {
	line := lineOf(m)
	s.byID[m.ID] = line
	if s.at[m.Partition] == nil {
		s.at[m.Partition] = map[int64]int{}
	}
	s.at[m.Partition][m.Offset] = line
	return line
}

// middleware notes every message the handler sees.
func (s *seen) middleware(next consumer.Handler[pgx.Tx]) consumer.Handler[pgx.Tx] {
	return consumer.HandlerFunc[pgx.Tx](func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		s.mu.Lock()
		s.note(m)
		s.mu.Unlock()
		return next.Handle(ctx, tx, m)
	})
}

func (s *seen) onDuplicate(_ context.Context, d consumer.Duplicate) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.duplicates[s.note(d.Message)] = true
}

// Settled notes the lines settled stale (the consumer's Observer).
func (s *seen) Settled(_ context.Context, st consumer.Settlement) {
	if st.Outcome != consumer.OutcomeStale {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stale[s.note(st.Message)] = true
}

// DeadLetter records the letter, then writes it to Kafka.
func (s *seen) DeadLetter(ctx context.Context, l consumer.Letter) error {
	s.mu.Lock()
	s.letters[s.note(l.Message)] = l
	s.mu.Unlock()
	return s.dead.DeadLetter(ctx, l)
}
