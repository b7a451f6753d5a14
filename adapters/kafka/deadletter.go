package kafka

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/dedup"
)

// Headers the DeadLetterWriter adds to a dead letter. The original message's
// headers come first, unchanged (except earlier idem headers, which are
// replaced), then these.
const (
	HeaderReason    = "idem-reason"             // why: the error text, at most dedup.MaxReasonLen bytes
	HeaderAttempts  = "idem-attempts"           // failed handler runs, decimal
	HeaderTopic     = "idem-original-topic"     // where the message came from
	HeaderPartition = "idem-original-partition" // decimal
	HeaderOffset    = "idem-original-offset"    // decimal
	HeaderKeyScope  = "idem-key-scope"          // the dedup key's scope; absent when no key was derived
	HeaderKey       = "idem-key"                // the dedup key's ID; absent when no key was derived
	// When the value is larger than DeadLetterConfig.MaxValueBytes it is left
	// out; these say what it was.
	HeaderValueSHA256 = "idem-value-sha256" // hex
	HeaderValueSize   = "idem-value-size"   // bytes, decimal
)

var idemHeaders = []string{
	HeaderReason, HeaderAttempts, HeaderTopic, HeaderPartition, HeaderOffset,
	HeaderKeyScope, HeaderKey, HeaderValueSHA256, HeaderValueSize,
}

// DeadLetterConfig configures a DeadLetterWriter. Zero values take the
// documented defaults.
type DeadLetterConfig struct {
	// Brokers are the seed brokers, "host:port". Required.
	Brokers []string
	// Topic is the dead-letter topic; default the message's topic plus
	// ".dlq". Create it beforehand (or set AllowAutoTopicCreation): a write
	// to a missing topic fails, and the consumer retries it, holding the
	// partition, until it succeeds.
	Topic string
	// AllowAutoTopicCreation lets the broker create a missing dead-letter
	// topic (when the broker allows it).
	AllowAutoTopicCreation bool

	// TLS and SASL: as in Config.
	TLS  *tls.Config
	SASL sasl.Mechanism
	// ClientID is sent to the brokers; default "idem".
	ClientID string
	// DialTimeout bounds opening one connection; default 10s.
	DialTimeout time.Duration
	// WriteTimeout bounds one write, retries included; default 10s.
	WriteTimeout time.Duration

	// MaxValueBytes is the largest value copied into a dead letter; a larger
	// one is replaced by its SHA-256 and size (headers HeaderValueSHA256,
	// HeaderValueSize), so that an oversized message cannot block its
	// partition. Default 900 KiB, below the brokers' default message size
	// limit.
	MaxValueBytes int
}

// DeadLetterWriter is a consumer.DeadLetter that writes to Kafka with a
// kafka-go Writer, acknowledged by all in-sync replicas. A letter keeps the
// original key, value and headers and goes to the partition of the same
// number as the original (modulo the dead-letter topic's partition count),
// so one partition's letters stay in order. Safe for concurrent use.
type DeadLetterWriter struct {
	cfg DeadLetterConfig
	w   *kafkago.Writer
	tr  *kafkago.Transport
}

// NewDeadLetterWriter validates cfg and returns a writer. Close it when the
// consumer has stopped.
func NewDeadLetterWriter(cfg DeadLetterConfig) (*DeadLetterWriter, error) {
	var errs []error
	add := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("kafka: DeadLetterConfig."+format, args...))
	}
	if len(cfg.Brokers) == 0 {
		add("Brokers is empty")
	}
	for i, b := range cfg.Brokers {
		if _, _, err := net.SplitHostPort(b); err != nil {
			add("Brokers[%d] %q: want host:port: %v", i, b, err)
		}
	}
	if cfg.DialTimeout < 0 || cfg.WriteTimeout < 0 {
		add("DialTimeout and WriteTimeout must not be negative")
	}
	if cfg.MaxValueBytes < 0 {
		add("MaxValueBytes is negative (%d)", cfg.MaxValueBytes)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if cfg.ClientID == "" {
		cfg.ClientID = "idem"
	}
	if cfg.DialTimeout == 0 {
		cfg.DialTimeout = 10 * time.Second
	}
	if cfg.WriteTimeout == 0 {
		cfg.WriteTimeout = 10 * time.Second
	}
	if cfg.MaxValueBytes == 0 {
		cfg.MaxValueBytes = 900 << 10
	}
	tr := &kafkago.Transport{
		DialTimeout: cfg.DialTimeout,
		ClientID:    cfg.ClientID,
		TLS:         cfg.TLS,
		SASL:        cfg.SASL,
	}
	w := &kafkago.Writer{
		Addr:                   kafkago.TCP(cfg.Brokers...),
		Balancer:               samePartition{},
		RequiredAcks:           kafkago.RequireAll,
		BatchTimeout:           5 * time.Millisecond,
		WriteTimeout:           cfg.WriteTimeout,
		ReadTimeout:            cfg.WriteTimeout,
		AllowAutoTopicCreation: cfg.AllowAutoTopicCreation,
		Transport:              tr,
	}
	return &DeadLetterWriter{cfg: cfg, w: w, tr: tr}, nil
}

// DeadLetter writes l and returns once the brokers acknowledged it; the
// consumer acknowledges the original message only then. A failed write
// returns the error; the consumer retries.
func (d *DeadLetterWriter) DeadLetter(ctx context.Context, l consumer.Letter) error {
	if l.Message == nil {
		return errors.New("kafka: dead letter without a message")
	}
	ctx, cancel := context.WithTimeout(ctx, d.cfg.WriteTimeout)
	defer cancel()
	if err := d.w.WriteMessages(ctx, d.letter(l)); err != nil {
		return fmt.Errorf("kafka: dead letter of %s: %w", l.Message.Coordinates(), err)
	}
	return nil
}

func (d *DeadLetterWriter) letter(l consumer.Letter) kafkago.Message {
	m := l.Message
	topic := d.cfg.Topic
	if topic == "" {
		topic = m.Topic + ".dlq"
	}
	headers := make([]kafkago.Header, 0, len(m.Headers)+len(idemHeaders))
	for _, h := range m.Headers {
		if !isIdemHeader(h.Key) {
			headers = append(headers, kafkago.Header{Key: h.Key, Value: h.Value})
		}
	}
	add := func(k, v string) { headers = append(headers, kafkago.Header{Key: k, Value: []byte(v)}) }
	reason := "unknown"
	if l.Reason != nil {
		reason = l.Reason.Error()
	}
	add(HeaderReason, dedup.ShortReason(reason))
	add(HeaderAttempts, strconv.Itoa(l.Attempts))
	add(HeaderTopic, m.Topic)
	add(HeaderPartition, strconv.Itoa(int(m.Partition)))
	add(HeaderOffset, strconv.FormatInt(m.Offset, 10))
	if l.Key != (dedup.Key{}) {
		add(HeaderKeyScope, l.Key.Scope)
		add(HeaderKey, l.Key.ID)
	}
	value := m.Value
	if len(value) > d.cfg.MaxValueBytes {
		sum := sha256.Sum256(value)
		add(HeaderValueSHA256, hex.EncodeToString(sum[:]))
		add(HeaderValueSize, strconv.Itoa(len(value)))
		value = nil
	}
	return kafkago.Message{
		Topic:     topic,
		Partition: int(m.Partition), // read by samePartition only
		Key:       m.Key,
		Value:     value,
		Headers:   headers,
	}
}

func isIdemHeader(k string) bool {
	if !strings.HasPrefix(k, "idem-") {
		return false
	}
	for _, h := range idemHeaders {
		if k == h {
			return true
		}
	}
	return false
}

// Close flushes and closes the writer and its connections.
func (d *DeadLetterWriter) Close() error {
	err := d.w.Close()
	d.tr.CloseIdleConnections()
	return err
}

// samePartition routes a letter to the partition numbered like the
// original, modulo the dead-letter topic's partitions.
type samePartition struct{}

func (samePartition) Balance(m kafkago.Message, partitions ...int) int {
	if len(partitions) == 0 {
		return 0
	}
	i := m.Partition % len(partitions)
	if i < 0 {
		i = 0
	}
	return partitions[i]
}

var _ consumer.DeadLetter = (*DeadLetterWriter)(nil)
