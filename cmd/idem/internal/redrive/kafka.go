package redrive

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/internal/kafkabal"
)

// Kafka is a dead-letter topic on Kafka (adapters/kafka's letters: the
// metadata in record headers). A letter goes back to its original
// partition (modulo the topic's partitions now); its position is the
// redrive group's committed offset of each partition (an offset commit
// outside any group generation).
type Kafka struct {
	Brokers []string      // host:port; required
	Timeout time.Duration // bounds one request; default 10s
}

// Name returns "kafka".
func (Kafka) Name() string { return "kafka" }

func (k Kafka) open(_ context.Context, topic, group string) (session, error) {
	if len(k.Brokers) == 0 {
		return nil, fmt.Errorf("kafka: no brokers")
	}
	timeout := k.Timeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	tr := &kafkago.Transport{DialTimeout: timeout}
	return &kafkaSession{
		brokers: k.Brokers, topic: topic, group: group, timeout: timeout, tr: tr,
		client: &kafkago.Client{Addr: kafkago.TCP(k.Brokers...), Timeout: timeout, Transport: tr},
		writer: &kafkago.Writer{Addr: kafkago.TCP(k.Brokers...), Balancer: kafkabal.SamePartition{}, RequiredAcks: kafkago.RequireAll,
			BatchTimeout: time.Millisecond, WriteTimeout: timeout, Transport: tr},
	}, nil
}

type kafkaSession struct {
	brokers      []string
	topic, group string
	timeout      time.Duration
	tr           *kafkago.Transport
	client       *kafkago.Client
	writer       *kafkago.Writer
}

func (s *kafkaSession) close() {
	_ = s.writer.Close()
	s.tr.CloseIdleConnections()
}

// queues reads where the group stopped and where each partition ends now.
func (s *kafkaSession) queues(ctx context.Context) ([]queue, error) {
	md, err := s.client.Metadata(ctx, &kafkago.MetadataRequest{Topics: []string{s.topic}})
	if err != nil {
		return nil, notKafka(ctx, s.brokers, fmt.Errorf("kafka: metadata: %w", err))
	}
	if len(md.Topics) != 1 || md.Topics[0].Error != nil {
		var terr error
		if len(md.Topics) == 1 {
			terr = md.Topics[0].Error
		}
		return nil, fmt.Errorf("kafka: topic %s: %v", s.topic, terr)
	}
	var parts []int
	var reqs []kafkago.OffsetRequest
	for _, p := range md.Topics[0].Partitions {
		parts = append(parts, p.ID)
		reqs = append(reqs, kafkago.FirstOffsetOf(p.ID), kafkago.LastOffsetOf(p.ID))
	}
	sort.Ints(parts)
	lo, err := s.client.ListOffsets(ctx, &kafkago.ListOffsetsRequest{Topics: map[string][]kafkago.OffsetRequest{s.topic: reqs}})
	if err != nil {
		return nil, fmt.Errorf("kafka: list offsets: %w", err)
	}
	first, last := map[int]int64{}, map[int]int64{}
	for _, p := range lo.Topics[s.topic] {
		if p.Error != nil {
			return nil, fmt.Errorf("kafka: list offsets of partition %d: %w", p.Partition, p.Error)
		}
		first[p.Partition], last[p.Partition] = p.FirstOffset, p.LastOffset
	}
	of, err := s.client.OffsetFetch(ctx, &kafkago.OffsetFetchRequest{GroupID: s.group, Topics: map[string][]int{s.topic: parts}})
	if err != nil {
		return nil, fmt.Errorf("kafka: offsets of group %s: %w", s.group, err)
	}
	if of.Error != nil {
		return nil, fmt.Errorf("kafka: offsets of group %s: %w", s.group, of.Error)
	}
	committed := map[int]int64{}
	for _, p := range of.Topics[s.topic] {
		if p.Error != nil {
			return nil, fmt.Errorf("kafka: offset of group %s, partition %d: %w", s.group, p.Partition, p.Error)
		}
		committed[p.Partition] = p.CommittedOffset
	}
	var out []queue
	for _, p := range parts {
		from := first[p]
		if c, ok := committed[p]; ok && c > from {
			from = c
		}
		if from < last[p] {
			out = append(out, queue{ref: p, from: from, to: last[p]})
		}
	}
	return out, nil
}

func (s *kafkaSession) read(ctx context.Context, q queue, each func(letter) (bool, error)) error {
	partition := q.ref.(int)
	r := kafkago.NewReader(kafkago.ReaderConfig{Brokers: s.brokers, Topic: s.topic, Partition: partition,
		MinBytes: 1, MaxBytes: 16 << 20, MaxWait: 500 * time.Millisecond, Dialer: &kafkago.Dialer{Timeout: s.timeout}})
	defer r.Close()
	if err := r.SetOffset(q.from); err != nil {
		return err
	}
	for next := q.from; next < q.to; {
		fctx, cancel := context.WithTimeout(ctx, 3*s.timeout)
		m, err := r.FetchMessage(fctx)
		cancel()
		if err != nil {
			return fmt.Errorf("kafka: read %s/%d at %d: %w", s.topic, partition, next, err)
		}
		if m.Offset >= q.to {
			return nil // past the end as it was at the start (compacted or transaction markers before it)
		}
		next = m.Offset + 1
		l := letter{pos: fmt.Sprintf("%s/%d/%d", m.Topic, m.Partition, m.Offset), offset: m.Offset, key: m.Key, value: m.Value, raw: m}
		for _, h := range m.Headers {
			l.headers = append(l.headers, consumer.Header{Key: h.Key, Value: h.Value})
		}
		if more, err := each(l); err != nil || !more {
			return err
		}
	}
	return nil
}

func (s *kafkaSession) name(q queue) string { return strconv.Itoa(q.ref.(int)) }

func (s *kafkaSession) target(c *message) string { return fmt.Sprintf("%s/%d", c.topic, c.partition) }

func (s *kafkaSession) send(ctx context.Context, c *message) (string, error) {
	headers := make([]kafkago.Header, 0, len(c.headers))
	for _, h := range c.headers {
		headers = append(headers, kafkago.Header{Key: h.Key, Value: h.Value})
	}
	wctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	if err := s.writer.WriteMessages(wctx, kafkago.Message{Topic: c.topic, Partition: c.partition, Key: c.key, Value: c.value, Headers: headers}); err != nil {
		return "", fmt.Errorf("kafka: send %s to %s: %w", c.letter.pos, c.topic, err)
	}
	return s.target(c), nil
}

func (s *kafkaSession) commit(ctx context.Context, q queue, next int64) error {
	partition := q.ref.(int)
	res, err := s.client.OffsetCommit(ctx, &kafkago.OffsetCommitRequest{GroupID: s.group, GenerationID: -1,
		Topics: map[string][]kafkago.OffsetCommit{s.topic: {{Partition: partition, Offset: next}}}})
	if err != nil {
		return fmt.Errorf("kafka: commit the redrive's offset: %w", err)
	}
	for _, p := range res.Topics[s.topic] {
		if p.Error != nil {
			return fmt.Errorf("kafka: commit the redrive's offset of partition %d: %w", p.Partition, p.Error)
		}
	}
	return nil
}
