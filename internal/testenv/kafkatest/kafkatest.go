// Package kafkatest is the Kafka side of idem's integration tests: topics,
// producing, reading, committed offsets and group state, through kafka-go,
// on the test environment's broker or on kfake. It is apart from testenv so
// that tests without Kafka do not build kafka-go.
package kafkatest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/idemkit/idem/internal/testenv"
)

// Admin is a kafka-go client for topic setup, producing and offset checks.
type Admin struct {
	Brokers   []string
	Client    *kafkago.Client
	Transport *kafkago.Transport
	// ReplicationFactor of the topics CreateTopic creates; default 1.
	ReplicationFactor int
	// TopicConfigs are set on the topics CreateTopic creates.
	TopicConfigs []kafkago.ConfigEntry

	mu    sync.Mutex
	parts map[string]int // partitions of the topics CreateTopic created
}

// NewAdmin returns an Admin of brokers whose connections close when the
// test ends.
func NewAdmin(t testing.TB, brokers []string) *Admin {
	tr := &kafkago.Transport{DialTimeout: 5 * time.Second, MetadataTTL: time.Second}
	t.Cleanup(tr.CloseIdleConnections)
	return &Admin{
		Brokers:   brokers,
		Transport: tr,
		Client:    &kafkago.Client{Addr: kafkago.TCP(brokers...), Transport: tr, Timeout: 10 * time.Second},
		parts:     map[string]int{},
	}
}

// CreateTopic creates topic (an existing one is fine), deletes it when the
// test ends, and waits until each of its partitions has a leader.
func (a *Admin) CreateTopic(t testing.TB, topic string, partitions int) {
	t.Helper()
	a.CreateTopicWith(t, topic, partitions, a.TopicConfigs)
}

// CreateTopicWith is CreateTopic with these topic configs instead of
// a.TopicConfigs.
//
// A broker that has just (re)started may answer BROKER_NOT_AVAILABLE (8)
// for a while; CreateTopicWith tries again until it answers otherwise, for
// up to a minute.
func (a *Admin) CreateTopicWith(t testing.TB, topic string, partitions int, configs []kafkago.ConfigEntry) {
	t.Helper()
	var err error
	testenv.WaitUntilProgress(t, time.Minute, "the brokers take topic "+topic, func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var res *kafkago.CreateTopicsResponse
		res, err = a.Client.CreateTopics(ctx, &kafkago.CreateTopicsRequest{
			Topics: []kafkago.TopicConfig{{Topic: topic, NumPartitions: partitions,
				ReplicationFactor: max(a.ReplicationFactor, 1), ConfigEntries: configs}},
		})
		if err == nil {
			err = res.Errors[topic]
		}
		if errors.Is(err, kafkago.BrokerNotAvailable) {
			return false, err.Error()
		}
		return true, ""
	})
	if err != nil && !errors.Is(err, kafkago.TopicAlreadyExists) {
		t.Fatalf("create topic %s: %v", topic, err)
	}
	a.mu.Lock()
	a.parts[topic] = partitions
	a.mu.Unlock()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		res, err := a.Client.DeleteTopics(ctx, &kafkago.DeleteTopicsRequest{Topics: []string{topic}})
		if err == nil {
			err = res.Errors[topic]
		}
		if err != nil {
			t.Logf("delete topic %s: %v", topic, err)
		}
	})
	a.WaitLeaders(t, topic, partitions)
}

// WaitLeaders waits until topic has the given number of partitions, each
// with a leader.
func (a *Admin) WaitLeaders(t testing.TB, topic string, partitions int) {
	t.Helper()
	testenv.WaitUntilProgress(t, time.Minute, "topic "+topic+" has leaders", func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		md, err := a.Client.Metadata(ctx, &kafkago.MetadataRequest{Topics: []string{topic}})
		switch {
		case err != nil:
			return false, err.Error()
		case len(md.Topics) != 1 || md.Topics[0].Error != nil:
			return false, fmt.Sprintf("metadata %+v", md.Topics)
		case len(md.Topics[0].Partitions) != partitions:
			return false, fmt.Sprintf("%d partitions", len(md.Topics[0].Partitions))
		}
		for _, p := range md.Topics[0].Partitions {
			if p.Error != nil || p.Leader.Host == "" {
				return false, fmt.Sprintf("partition %d has no leader", p.ID)
			}
		}
		return true, ""
	})
}

// Partitions returns how many partitions topic has: as CreateTopic created
// it, else as the brokers say.
func (a *Admin) Partitions(ctx context.Context, topic string) (int, error) {
	a.mu.Lock()
	n, ok := a.parts[topic]
	a.mu.Unlock()
	if ok {
		return n, nil
	}
	md, err := a.Client.Metadata(ctx, &kafkago.MetadataRequest{Topics: []string{topic}})
	if err != nil {
		return 0, err
	}
	if len(md.Topics) != 1 || md.Topics[0].Error != nil {
		return 0, fmt.Errorf("metadata of %s: %+v", topic, md.Topics)
	}
	return len(md.Topics[0].Partitions), nil
}

// Produce writes msgs to topic, each to msgs[i].Partition, acknowledged by
// all in-sync replicas.
func (a *Admin) Produce(t testing.TB, topic string, msgs ...kafkago.Message) {
	t.Helper()
	w := &kafkago.Writer{
		Addr:         kafkago.TCP(a.Brokers...),
		Topic:        topic,
		Balancer:     kafkago.BalancerFunc(func(m kafkago.Message, _ ...int) int { return m.Partition }),
		RequiredAcks: kafkago.RequireAll,
		BatchSize:    1000,
		BatchBytes:   16 << 20,
		BatchTimeout: 5 * time.Millisecond,
		Transport:    a.Transport,
	}
	defer w.Close()
	ctx := testenv.Context(t, 2*time.Minute)
	for len(msgs) > 0 {
		n := min(len(msgs), 1000)
		if err := w.WriteMessages(ctx, msgs[:n]...); err != nil {
			t.Fatalf("produce to %s: %v", topic, err)
		}
		msgs = msgs[n:]
	}
}

// HighWatermarks returns the end offsets of topic's partitions.
func (a *Admin) HighWatermarks(ctx context.Context, topic string) ([]int64, error) {
	n, err := a.Partitions(ctx, topic)
	if err != nil {
		return nil, err
	}
	reqs := make([]kafkago.OffsetRequest, n)
	for i := range reqs {
		reqs[i] = kafkago.LastOffsetOf(i)
	}
	res, err := a.Client.ListOffsets(ctx, &kafkago.ListOffsetsRequest{Topics: map[string][]kafkago.OffsetRequest{topic: reqs}})
	if err != nil {
		return nil, err
	}
	out := make([]int64, n)
	for _, p := range res.Topics[topic] {
		if p.Error != nil {
			return nil, fmt.Errorf("partition %d: %w", p.Partition, p.Error)
		}
		out[p.Partition] = p.LastOffset
	}
	return out, nil
}

// Committed returns group's committed offsets of topic's partitions (-1:
// none).
func (a *Admin) Committed(ctx context.Context, group, topic string) ([]int64, error) {
	n, err := a.Partitions(ctx, topic)
	if err != nil {
		return nil, err
	}
	ids := make([]int, n)
	for i := range ids {
		ids[i] = i
	}
	res, err := a.Client.OffsetFetch(ctx, &kafkago.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: ids}})
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
			return nil, fmt.Errorf("partition %d: %w", p.Partition, p.Error)
		}
		out[p.Partition] = p.CommittedOffset
	}
	return out, nil
}

// Offsets returns the reader of group's committed offsets of topic for
// testenv.SampleOffsets: partition -> offset, partitions without one left
// out.
func (a *Admin) Offsets(group, topic string) func(context.Context) (map[int]int64, error) {
	return func(ctx context.Context) (map[int]int64, error) {
		got, err := a.Committed(ctx, group, topic)
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
}

// WaitNoLag waits until group committed every partition of topic up to its
// high watermark.
func (a *Admin) WaitNoLag(t testing.TB, group, topic string) {
	t.Helper()
	testenv.WaitUntilProgress(t, 2*time.Minute, "the group has no lag", func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		hwm, err := a.HighWatermarks(ctx, topic)
		if err != nil {
			return false, err.Error()
		}
		got, err := a.Committed(ctx, group, topic)
		if err != nil {
			return false, err.Error()
		}
		return fmt.Sprint(hwm) == fmt.Sprint(got), fmt.Sprintf("committed %v, high watermarks %v", got, hwm)
	})
}

// StableMembers returns how many members group has once it is stable, -1
// while it rebalances (or cannot be described).
func (a *Admin) StableMembers(group string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := a.Client.DescribeGroups(ctx, &kafkago.DescribeGroupsRequest{GroupIDs: []string{group}})
	if err != nil || len(res.Groups) != 1 || res.Groups[0].Error != nil {
		return -1
	}
	if g := res.Groups[0]; g.GroupState == "Stable" {
		return len(g.Members)
	}
	return -1
}

// ReadAll reads every message of topic, partition by partition, up to the
// high watermarks it finds first. It waits out a partition without a
// leader for up to two minutes, as a client would: on one node under load
// the controller can fence its own broker for a few seconds when their
// heartbeats fall behind the broker's session (6 s in the test broker).
func (a *Admin) ReadAll(t testing.TB, topic string) []kafkago.Message {
	t.Helper()
	ctx := testenv.Context(t, 2*time.Minute)
	var hwm []int64
	if err := untilNotTemporary(ctx, func() (err error) {
		hwm, err = a.HighWatermarks(ctx, topic)
		return err
	}); err != nil {
		t.Fatalf("high watermarks of %s: %v", topic, err)
	}
	var out []kafkago.Message
	for p, end := range hwm {
		if end == 0 {
			continue
		}
		// The reader retries what it cannot start (no leader, among
		// others) MaxAttempts times, 100 ms to 1 s apart, before it
		// reports it: about a minute.
		r := kafkago.NewReader(kafkago.ReaderConfig{Brokers: a.Brokers, Topic: topic, Partition: p,
			MaxWait: 100 * time.Millisecond, MaxBytes: 4 << 20, Dialer: &kafkago.Dialer{Timeout: 5 * time.Second},
			MaxAttempts: readAttempts})
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

// readAttempts is ReadAll's kafkago.ReaderConfig.MaxAttempts.
const readAttempts = 60

// untilNotTemporary calls op until it returns nil or an error that is not
// a temporary Kafka error (kafkago.Error.Temporary: no leader, a
// coordinator loading, a timeout), waiting a second between calls, until
// ctx ends.
func untilNotTemporary(ctx context.Context, op func() error) error {
	for {
		err := op()
		var kerr kafkago.Error
		if err == nil || !errors.As(err, &kerr) || !kerr.Temporary() {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (still after %v)", err, context.Cause(ctx))
		case <-time.After(time.Second):
		}
	}
}

// Header returns the value of m's header k, "" when it has none.
func Header(m kafkago.Message, k string) string {
	v, _ := HeaderOK(m, k)
	return v
}

// HeaderOK returns the value of m's header k and whether m has it.
func HeaderOK(m kafkago.Message, k string) (string, bool) {
	for _, h := range m.Headers {
		if h.Key == k {
			return string(h.Value), true
		}
	}
	return "", false
}
