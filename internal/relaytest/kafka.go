package relaytest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"
)

var uniq atomic.Int64

// Name returns a topic or group name unique to this test run, of letters,
// digits, '_' and '-' (valid for Kafka and RocketMQ).
func Name(t testing.TB, what string) string {
	s := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			return r
		}
		return '_'
	}, t.Name())
	if len(s) > 50 {
		s = s[len(s)-50:]
	}
	return fmt.Sprintf("idem_%s_%s_%d_%d", what, s, os.Getpid(), uniq.Add(1))
}

// Kafka is a client for topic setup and reading topics back.
type Kafka struct {
	Brokers []string
	client  *kafkago.Client
	tr      *kafkago.Transport
}

// NewKafka returns a client on brokers, closed when the test ends.
func NewKafka(t testing.TB, brokers []string) *Kafka {
	tr := &kafkago.Transport{DialTimeout: 5 * time.Second, MetadataTTL: time.Second}
	t.Cleanup(tr.CloseIdleConnections)
	return &Kafka{Brokers: brokers, tr: tr, client: &kafkago.Client{Addr: kafkago.TCP(brokers...), Transport: tr, Timeout: 10 * time.Second}}
}

// CloseIdle drops the client's connections (after a broker restart).
func (k *Kafka) CloseIdle() { k.tr.CloseIdleConnections() }

// CreateTopic creates topic with partitions and the given topic configs,
// waits until every partition has a leader, and deletes it when the test
// ends.
func (k *Kafka) CreateTopic(t testing.TB, topic string, partitions int, configs map[string]string) {
	t.Helper()
	var entries []kafkago.ConfigEntry
	for name, v := range configs {
		entries = append(entries, kafkago.ConfigEntry{ConfigName: name, ConfigValue: v})
	}
	res, err := k.client.CreateTopics(Ctx(t, 30*time.Second), &kafkago.CreateTopicsRequest{
		Topics: []kafkago.TopicConfig{{Topic: topic, NumPartitions: partitions, ReplicationFactor: 1, ConfigEntries: entries}},
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
		_, _ = k.client.DeleteTopics(ctx, &kafkago.DeleteTopicsRequest{Topics: []string{topic}})
	})
	WaitFor(t, time.Minute, "topic "+topic+" has leaders", func() (bool, string) {
		md, err := k.client.Metadata(Ctx(t, 10*time.Second), &kafkago.MetadataRequest{Topics: []string{topic}})
		if err != nil || len(md.Topics) != 1 || md.Topics[0].Error != nil || len(md.Topics[0].Partitions) != partitions {
			return false, fmt.Sprint(err)
		}
		for _, p := range md.Topics[0].Partitions {
			if p.Error != nil || p.Leader.Host == "" {
				return false, fmt.Sprint(p.Error)
			}
		}
		return true, ""
	})
}

// Ends returns the end offset of each of topic's partitions.
func (k *Kafka) Ends(ctx context.Context, topic string, partitions int) ([]int64, error) {
	reqs := make([]kafkago.OffsetRequest, partitions)
	for i := range reqs {
		reqs[i] = kafkago.LastOffsetOf(i)
	}
	res, err := k.client.ListOffsets(ctx, &kafkago.ListOffsetsRequest{Topics: map[string][]kafkago.OffsetRequest{topic: reqs}})
	if err != nil {
		return nil, err
	}
	out := make([]int64, partitions)
	for _, p := range res.Topics[topic] {
		if p.Error != nil {
			return nil, p.Error
		}
		out[p.Partition] = p.LastOffset
	}
	return out, nil
}

// ReadAll reads every message of topic, partition by partition, in offset
// order.
func (k *Kafka) ReadAll(t testing.TB, topic string, partitions int) []kafkago.Message {
	t.Helper()
	ctx := Ctx(t, 2*time.Minute)
	ends, err := k.Ends(ctx, topic, partitions)
	if err != nil {
		t.Fatalf("end offsets of %s: %v", topic, err)
	}
	var out []kafkago.Message
	for p, end := range ends {
		if end == 0 {
			continue
		}
		r := kafkago.NewReader(kafkago.ReaderConfig{Brokers: k.Brokers, Topic: topic, Partition: p,
			MaxWait: 100 * time.Millisecond, MaxBytes: 8 << 20})
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

// Header returns the value of m's header key.
func Header(m kafkago.Message, key string) string {
	for _, h := range m.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}
