package faults_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/internal/testenv"
)

// kafkaBroker is the test environment's Kafka, for one test.
type kafkaBroker struct {
	brokers []string
	tr      *kafkago.Transport
	client  *kafkago.Client
	parts   map[string]int // partitions per topic
	mu      sync.Mutex
}

// newKafka returns the shared Kafka; exclusive keeps every other test of
// every package off the broker while this one kills it.
func newKafka(t *testing.T, exclusive bool) *kafkaBroker {
	t.Helper()
	var brokers []string
	if exclusive {
		brokers = testenv.KafkaExclusive(t)
	} else {
		brokers = testenv.KafkaBrokers(t)
	}
	tr := &kafkago.Transport{DialTimeout: 5 * time.Second, MetadataTTL: time.Second}
	t.Cleanup(tr.CloseIdleConnections)
	return &kafkaBroker{brokers: brokers, tr: tr, parts: map[string]int{},
		client: &kafkago.Client{Addr: kafkago.TCP(brokers...), Transport: tr, Timeout: 10 * time.Second}}
}

func (k *kafkaBroker) name() string    { return "kafka" }
func (k *kafkaBroker) addrs() []string { return k.brokers }

// topicName is a topic or group name unique to this run.
func topicName(t *testing.T, what string) string {
	s := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			return r
		}
		return '_'
	}, t.Name())
	if len(s) > 60 {
		s = s[len(s)-60:]
	}
	return fmt.Sprintf("idem_faults_%s_%s_%d_%d", what, s, os.Getpid(), uniq.Add(1))
}

func (k *kafkaBroker) newTopic(t *testing.T, n int) (string, string) {
	t.Helper()
	topic, group := topicName(t, "t"), topicName(t, "g")
	k.createTopic(t, topic, n)
	k.createTopic(t, topic+".dlq", n)
	return topic, group
}

func (k *kafkaBroker) createTopic(t *testing.T, topic string, n int) {
	t.Helper()
	ctx := ctxTimeout(t, time.Minute)
	res, err := k.client.CreateTopics(ctx, &kafkago.CreateTopicsRequest{
		Topics: []kafkago.TopicConfig{{Topic: topic, NumPartitions: n, ReplicationFactor: 1}},
	})
	if err == nil {
		err = res.Errors[topic]
	}
	if err != nil && !errors.Is(err, kafkago.TopicAlreadyExists) {
		t.Fatalf("create topic %s: %v", topic, err)
	}
	k.mu.Lock()
	k.parts[topic] = n
	k.mu.Unlock()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = k.client.DeleteTopics(ctx, &kafkago.DeleteTopicsRequest{Topics: []string{topic}})
	})
	waitUntil(t, time.Minute, "topic "+topic+" has leaders", func() (bool, string) {
		md, err := k.client.Metadata(ctx, &kafkago.MetadataRequest{Topics: []string{topic}})
		if err != nil || len(md.Topics) != 1 || md.Topics[0].Error != nil || len(md.Topics[0].Partitions) != n {
			return false, fmt.Sprint(err)
		}
		for _, p := range md.Topics[0].Partitions {
			if p.Error != nil || p.Leader.Host == "" {
				return false, "no leader"
			}
		}
		return true, ""
	})
}

func (k *kafkaBroker) produce(t *testing.T, topic string, msgs []outMsg) {
	t.Helper()
	w := &kafkago.Writer{
		Addr:         kafkago.TCP(k.brokers...),
		Topic:        topic,
		Balancer:     kafkago.BalancerFunc(func(m kafkago.Message, _ ...int) int { return m.Partition }),
		RequiredAcks: kafkago.RequireAll,
		BatchSize:    500,
		BatchBytes:   16 << 20,
		BatchTimeout: 5 * time.Millisecond,
		Transport:    k.tr,
	}
	defer w.Close()
	km := make([]kafkago.Message, len(msgs))
	for i, m := range msgs {
		km[i] = kafkago.Message{Partition: m.Part, Key: []byte(m.ID), Value: m.Value}
		if m.Tenant != "" {
			km[i].Headers = []kafkago.Header{{Key: tenantHeader, Value: []byte(m.Tenant)}}
		}
	}
	ctx := ctxTimeout(t, 2*time.Minute)
	for len(km) > 0 {
		n := min(len(km), 500)
		if err := w.WriteMessages(ctx, km[:n]...); err != nil {
			t.Fatalf("produce to %s: %v", topic, err)
		}
		km = km[n:]
	}
}

func (k *kafkaBroker) partitions(topic string) int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.parts[topic]
}

// highWatermarks returns the end offsets of topic's partitions.
func (k *kafkaBroker) highWatermarks(ctx context.Context, topic string) ([]int64, error) {
	n := k.partitions(topic)
	reqs := make([]kafkago.OffsetRequest, n)
	for i := range reqs {
		reqs[i] = kafkago.LastOffsetOf(i)
	}
	res, err := k.client.ListOffsets(ctx, &kafkago.ListOffsetsRequest{Topics: map[string][]kafkago.OffsetRequest{topic: reqs}})
	if err != nil {
		return nil, err
	}
	out := make([]int64, n)
	for _, p := range res.Topics[topic] {
		if p.Error != nil {
			return nil, p.Error
		}
		out[p.Partition] = p.LastOffset
	}
	return out, nil
}

// committed returns group's committed offsets of topic (-1: none).
func (k *kafkaBroker) committed(ctx context.Context, group, topic string) ([]int64, error) {
	n := k.partitions(topic)
	ids := make([]int, n)
	for i := range ids {
		ids[i] = i
	}
	res, err := k.client.OffsetFetch(ctx, &kafkago.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: ids}})
	if err == nil {
		err = res.Error
	}
	if err != nil {
		return nil, err
	}
	out := make([]int64, n)
	for i := range out {
		out[i] = -1
	}
	for _, p := range res.Topics[topic] {
		if p.Error != nil {
			return nil, p.Error
		}
		out[p.Partition] = p.CommittedOffset
	}
	return out, nil
}

func (k *kafkaBroker) waitNoLag(t *testing.T, topic, group string) {
	t.Helper()
	waitUntil(t, 2*time.Minute, "the group has no lag", func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		hwm, err := k.highWatermarks(ctx, topic)
		if err != nil {
			return false, err.Error()
		}
		got, err := k.committed(ctx, group, topic)
		if err != nil {
			return false, err.Error()
		}
		return fmt.Sprint(hwm) == fmt.Sprint(got), fmt.Sprintf("committed %v, high watermarks %v", got, hwm)
	})
}

// readAll reads every message of topic, partition by partition.
func (k *kafkaBroker) readAll(t *testing.T, topic string) []kafkago.Message {
	t.Helper()
	ctx := ctxTimeout(t, 2*time.Minute)
	hwm, err := k.highWatermarks(ctx, topic)
	if err != nil {
		t.Fatalf("high watermarks of %s: %v", topic, err)
	}
	var out []kafkago.Message
	for p, end := range hwm {
		if end == 0 {
			continue
		}
		r := kafkago.NewReader(kafkago.ReaderConfig{Brokers: k.brokers, Topic: topic, Partition: p,
			MaxWait: 100 * time.Millisecond, MaxBytes: 4 << 20})
		for off := int64(0); off < end; {
			m, err := r.ReadMessage(ctx)
			if err != nil {
				r.Close()
				t.Fatalf("read %s/%d at %d: %v", topic, p, off, err)
			}
			out = append(out, m)
			off = m.Offset + 1
		}
		r.Close()
	}
	return out
}

func header(m kafkago.Message, key string) string {
	for _, h := range m.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

func (k *kafkaBroker) deadLetters(t *testing.T, topic string, want int) []letter {
	t.Helper()
	var letters []letter
	waitUntil(t, 2*time.Minute, fmt.Sprintf("%d dead letters", want), func() (bool, string) {
		letters = letters[:0]
		seen := map[string]bool{}
		for _, m := range k.readAll(t, topic+".dlq") {
			letters = append(letters, letter{ID: string(m.Key), Reason: header(m, consumer.MetaReason),
				Attempts: header(m, consumer.MetaAttempts), Key: header(m, consumer.MetaKey), Scope: header(m, consumer.MetaKeyScope)})
			seen[string(m.Key)] = true
		}
		return len(seen) >= want, fmt.Sprintf("%d distinct", len(seen))
	})
	return letters
}

// stableMembers returns how many members the group has once it is stable,
// -1 while it rebalances.
func (k *kafkaBroker) stableMembers(group string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := k.client.DescribeGroups(ctx, &kafkago.DescribeGroupsRequest{GroupIDs: []string{group}})
	if err != nil || len(res.Groups) != 1 || res.Groups[0].Error != nil {
		return -1
	}
	if g := res.Groups[0]; g.GroupState == "Stable" {
		return len(g.Members)
	}
	return -1
}

// kafkaScript runs scripts/testenv/kafka.sh.
func kafkaScript(t *testing.T, args ...string) {
	t.Helper()
	out, err := exec.Command(scriptPath("kafka.sh"), args...).CombinedOutput()
	if err != nil {
		t.Fatalf("kafka.sh %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

func scriptPath(name string) string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "scripts", "testenv", name)
}

func (k *kafkaBroker) offsets(ctx context.Context, topic, group string) (map[int]int64, error) {
	got, err := k.committed(ctx, group, topic)
	if err != nil {
		return nil, err
	}
	out := map[int]int64{}
	for p, off := range got {
		if off >= 0 {
			out[p] = off
		}
	}
	return out, nil
}

func (k *kafkaBroker) positions(t *testing.T, topic string) map[string]pos {
	t.Helper()
	out := map[string]pos{}
	for _, m := range k.readAll(t, topic) {
		out[string(m.Key)] = pos{Part: m.Partition, Off: m.Offset}
	}
	return out
}
