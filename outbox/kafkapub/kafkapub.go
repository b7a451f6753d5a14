// Package kafkapub publishes outbox records to Kafka with a kafka-go
// Writer, acknowledged by all in-sync replicas (RequiredAcks all).
//
// Per-key order rests on two facts: a key always hashes to the same
// partition (while the topic's partition count stays the same), and Kafka
// appends one produce request's records for a partition as one batch, all
// or none. So a Publish call is cut into chunks that kafka-go sends as one
// request each (at most Config.BatchSize messages and Config.BatchBytes
// bytes), chunks go one after the other, and after a chunk with a failure
// the rest of its topic is held back. The writer does not retry by itself
// (MaxAttempts 1): the relay retries, with backoff, and never out of order.
//
// A message over Config.MaxMessageBytes is refused without being sent. When
// the broker refuses a batch as too large (MESSAGE_TOO_LARGE, a topic's
// max.message.bytes), its messages are sent again one by one, so that only
// the one at fault is refused.
package kafkapub

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"sync"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"

	"github.com/idemkit/idem/internal/hostport"
	"github.com/idemkit/idem/outbox"
)

// Config configures a Publisher. Zero values take the documented defaults.
type Config struct {
	// Brokers are the seed brokers, "host:port". Required.
	Brokers []string
	// TLS and SASL, when set, secure every connection.
	TLS  *tls.Config
	SASL sasl.Mechanism
	// ClientID is sent to the brokers; default "idem-outbox".
	ClientID string
	// DialTimeout bounds opening one connection; default 10s.
	DialTimeout time.Duration
	// WriteTimeout bounds one produce request; default 10s.
	WriteTimeout time.Duration

	// MaxMessageBytes is the largest message (key, value and headers) sent;
	// a larger one is refused without trying, and dead-lettered by the
	// relay. Default 1 MiB, under the brokers' default message.max.bytes
	// (1048588).
	MaxMessageBytes int
	// BatchSize and BatchBytes bound one produce request; default 1000
	// messages and 1 MiB. Keep BatchBytes at most the brokers'
	// message.max.bytes: one partition's share of a request is one batch on
	// the broker.
	BatchSize  int
	BatchBytes int

	// Balancer picks a message's partition; default kafka-go's
	// Murmur2Balancer, the Java client's default partitioner, so that the
	// outbox and Java producers put a key on the same partition.
	Balancer kafkago.Balancer
	// Compression compresses the batches; default none.
	Compression kafkago.Compression
}

// Publisher is an outbox.Publisher on a kafka-go Writer. Safe for
// concurrent use.
type Publisher struct {
	cfg Config
	w   *kafkago.Writer
	tr  *kafkago.Transport
}

// New validates cfg and returns a Publisher. Close it after the relay
// stopped.
func New(cfg Config) (*Publisher, error) {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf("kafkapub: Config."+format, args...)) }
	hostport.CheckList("Brokers", cfg.Brokers, add)
	if cfg.DialTimeout < 0 || cfg.WriteTimeout < 0 {
		add("DialTimeout and WriteTimeout must not be negative")
	}
	if cfg.MaxMessageBytes < 0 || cfg.BatchSize < 0 || cfg.BatchBytes < 0 {
		add("MaxMessageBytes, BatchSize and BatchBytes must not be negative")
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	cfg.ClientID = cmp.Or(cfg.ClientID, "idem-outbox")
	cfg.DialTimeout = cmp.Or(cfg.DialTimeout, 10*time.Second)
	cfg.WriteTimeout = cmp.Or(cfg.WriteTimeout, 10*time.Second)
	cfg.MaxMessageBytes = cmp.Or(cfg.MaxMessageBytes, 1<<20)
	cfg.BatchSize = cmp.Or(cfg.BatchSize, 1000)
	cfg.BatchBytes = cmp.Or(cfg.BatchBytes, 1<<20)
	if cfg.Balancer == nil {
		cfg.Balancer = &kafkago.Murmur2Balancer{}
	}
	tr := &kafkago.Transport{DialTimeout: cfg.DialTimeout, ClientID: cfg.ClientID, TLS: cfg.TLS, SASL: cfg.SASL}
	w := &kafkago.Writer{
		Addr:         kafkago.TCP(cfg.Brokers...),
		Balancer:     cfg.Balancer,
		RequiredAcks: kafkago.RequireAll,
		MaxAttempts:  1, // the relay retries, with backoff, in order
		BatchSize:    cfg.BatchSize,
		// A chunk never exceeds BatchBytes by the estimate below, which is
		// above kafka-go's own count: each partition's share of a chunk is
		// one batch, never split.
		BatchBytes:   int64(max(cfg.BatchBytes, cfg.MaxMessageBytes)) + 1024,
		BatchTimeout: time.Millisecond, // a chunk is complete when WriteMessages is called
		WriteTimeout: cfg.WriteTimeout,
		ReadTimeout:  cfg.WriteTimeout,
		Compression:  cfg.Compression,
		Transport:    tr,
	}
	return &Publisher{cfg: cfg, w: w, tr: tr}, nil
}

// Close flushes and closes the writer and its connections.
func (p *Publisher) Close() error {
	err := p.w.Close()
	p.tr.CloseIdleConnections()
	return err
}

// size is at least kafka-go's count of a message's bytes.
func size(r *outbox.Record) int {
	n := 40 + len(r.Key) + len(r.Value)
	for _, h := range r.Headers {
		n += 10 + len(h.Key) + len(h.Value)
	}
	return n
}

// Publish sends recs; see outbox.Publisher.
func (p *Publisher) Publish(ctx context.Context, recs []outbox.Record, errs []error) {
	byTopic := map[string][]int{}
	var topics []string
	for i := range recs {
		r := &recs[i]
		if err := checkTopic(r.Topic); err != nil {
			errs[i] = outbox.Refused(err)
			continue
		}
		if n := size(r); n > p.cfg.MaxMessageBytes {
			errs[i] = outbox.Refused(fmt.Errorf("message of %d bytes, the limit is %d (kafkapub.Config.MaxMessageBytes)", n, p.cfg.MaxMessageBytes))
			continue
		}
		if byTopic[r.Topic] == nil {
			topics = append(topics, r.Topic)
		}
		byTopic[r.Topic] = append(byTopic[r.Topic], i)
	}
	var wg sync.WaitGroup
	for _, t := range topics {
		wg.Add(1)
		go func(idx []int) {
			defer wg.Done()
			p.publishTopic(ctx, recs, errs, idx)
		}(byTopic[t])
	}
	wg.Wait()
}

// publishTopic sends one topic's records in chunks, one after the other,
// and holds back the rest after a chunk with a failure.
func (p *Publisher) publishTopic(ctx context.Context, recs []outbox.Record, errs []error, idx []int) {
	for len(idx) > 0 {
		n, bytes := 0, 0
		for n < len(idx) && n < p.cfg.BatchSize && (n == 0 || bytes+size(&recs[idx[n]]) <= p.cfg.BatchBytes) {
			bytes += size(&recs[idx[n]])
			n++
		}
		chunk := idx[:n]
		idx = idx[n:]
		if failed := p.write(ctx, recs, errs, chunk); failed != nil {
			for _, i := range idx {
				errs[i] = fmt.Errorf("%w: %w", outbox.ErrHeldBack, failed)
			}
			return
		}
	}
}

// write sends one chunk and sets its records' errors; it returns a failure
// other than a refusal, if any.
func (p *Publisher) write(ctx context.Context, recs []outbox.Record, errs []error, chunk []int) error {
	msgs := make([]kafkago.Message, len(chunk))
	for j, i := range chunk {
		msgs[j] = message(&recs[i])
	}
	err := p.w.WriteMessages(ctx, msgs...)
	if err == nil {
		return nil
	}
	var werrs kafkago.WriteErrors
	if !errors.As(err, &werrs) || len(werrs) != len(chunk) {
		for _, i := range chunk {
			errs[i] = fmt.Errorf("kafkapub: %w", err)
		}
		return err
	}
	var failed error
	var tooLarge []int // refused in a batch: find out which one
	for j, i := range chunk {
		switch e := werrs[j]; {
		case e == nil:
		case refusal(e) && len(chunk) == 1:
			errs[i] = outbox.Refused(fmt.Errorf("kafkapub: %w", e))
		case refusal(e):
			tooLarge = append(tooLarge, i)
		default:
			errs[i] = fmt.Errorf("kafkapub: %w", e)
			failed = e
		}
	}
	// One by one, in order: a key whose message failed holds back the
	// rest of its own.
	held := map[string]error{}
	for _, i := range tooLarge {
		k := recs[i].OrderKey()
		if e, ok := held[k]; ok {
			errs[i] = fmt.Errorf("%w: %w", outbox.ErrHeldBack, e)
			continue
		}
		if p.write(ctx, recs, errs, []int{i}) != nil {
			held[k] = errs[i]
			failed = errs[i]
		}
	}
	return failed
}

func message(r *outbox.Record) kafkago.Message {
	hs := make([]kafkago.Header, len(r.Headers))
	for i, h := range r.Headers {
		hs[i] = kafkago.Header{Key: h.Key, Value: h.Value}
	}
	return kafkago.Message{Topic: r.Topic, Key: r.Key, Value: r.Value, Headers: hs}
}

// refusal reports the broker errors that no retry can fix for the message
// that caused them.
func refusal(err error) bool {
	var kerr kafkago.Error
	if !errors.As(err, &kerr) {
		return false
	}
	switch kerr {
	case kafkago.MessageSizeTooLarge, kafkago.RecordListTooLarge, kafkago.InvalidRecord, kafkago.InvalidTopic:
		return true
	}
	return false
}

// checkTopic refuses names Kafka cannot have.
func checkTopic(t string) error {
	if t == "." || t == ".." {
		return fmt.Errorf("topic %q: not a Kafka topic name", t)
	}
	for _, r := range t {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-') {
			return fmt.Errorf("topic %q: Kafka topic names have letters, digits, '.', '_' and '-' only", t)
		}
	}
	return nil
}

var _ outbox.Publisher = (*Publisher)(nil)
