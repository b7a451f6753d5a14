package kafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/idemkit/idem/adapters/internal/retrytopic"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/wire"
	"github.com/idemkit/idem/internal/kafkabal"
)

// ErrNotRunning is what Source.DeadLetter returns outside Source.Run: the
// consumer calls it only while Run runs.
var ErrNotRunning = errors.New("kafka: Source.Run is not running")

// DeadLetter implements consumer.DeadLetter: give the Source to
// consumer.Config as both Source and DeadLetter. It writes the letter to
// Config.DeadLetterTopic (default the message's topic plus ".dlq") and
// returns once all in-sync replicas acknowledged it; the consumer acks the
// original only then. A failed write returns the error, and the consumer
// retries it.
//
// The letter is wire.Letter(l).Record(Config.DeadLetterMaxBytes), as in every idem
// adapter: the original key, value (left out past DeadLetterMaxBytes) and
// headers, then the consumer.Meta* headers. It goes to the partition of the
// same number as the original (modulo the dead-letter topic's partition
// count), so that one partition's letters stay in order.
//
// The writer is the Source's own, on its brokers, TLS and SASL: Run opens
// it and closes it before it returns, and outside Run DeadLetter returns
// ErrNotRunning. (To write dead letters elsewhere, give consumer.Config a
// consumer.DeadLetter of your own; consumer.Letter.Record lays a letter
// out the same way.)
func (s *Source) DeadLetter(ctx context.Context, l consumer.Letter) error {
	if l.Message == nil {
		return errors.New("kafka: dead letter without a message")
	}
	if err := s.writeLetter(ctx, s.letter(l)); err != nil {
		return fmt.Errorf("kafka: dead letter of %s: %w", l.Message.Ref(), err)
	}
	return nil
}

// writeLetter writes m, a dead letter or a retry, with the writer of the
// Run, within Config.DeadLetterTimeout; ErrNotRunning outside Run.
func (s *Source) writeLetter(ctx context.Context, m kafkago.Message) error {
	s.dlqMu.RLock()
	defer s.dlqMu.RUnlock()
	if s.dlq == nil {
		return ErrNotRunning
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.DeadLetterTimeout)
	defer cancel()
	return s.dlq.w.WriteMessages(ctx, m)
}

// outRecord lays out a record of the consumer (a letter's or a retry's
// headers and value) as a Kafka record of topic on partition.
func outRecord(topic string, partition int32, key []byte, recHeaders []consumer.Header, value []byte) kafkago.Message {
	headers := make([]kafkago.Header, len(recHeaders))
	for i, h := range recHeaders {
		headers[i] = kafkago.Header{Key: h.Key, Value: h.Value}
	}
	return kafkago.Message{
		Topic:     topic,
		Partition: int(partition), // read by kafkabal.SamePartition only
		Key:       key,
		Value:     value,
		Headers:   headers,
	}
}

// letter lays l out as a Kafka record.
func (s *Source) letter(l consumer.Letter) kafkago.Message {
	m := l.Message
	// A retry copy's letter (CauseExhausted) goes with its original's
	// letters, not to a ".dlq" of its retry topic.
	topic := retrytopic.DeadLetterTopic(m, s.retryOf, s.cfg.DeadLetterTopic, ".dlq")
	headers, value := wire.Letter(l).Record(s.cfg.DeadLetterMaxBytes)
	return outRecord(topic, m.Partition, m.Key, headers, value)
}

// deadLetterWriter is the kafka-go Writer of one Run and its transport.
type deadLetterWriter struct {
	w  *kafkago.Writer
	tr *kafkago.Transport
}

// openDeadLetters makes the writer of a Run. It dials nothing until the
// first letter.
func (s *Source) openDeadLetters() {
	tr := &kafkago.Transport{
		DialTimeout: s.cfg.DialTimeout,
		ClientID:    s.cfg.ClientID,
		TLS:         s.cfg.TLS,
		SASL:        s.cfg.SASL,
	}
	w := &kafkago.Writer{
		Addr:                   kafkago.TCP(s.cfg.Brokers...),
		Balancer:               kafkabal.SamePartition{},
		RequiredAcks:           kafkago.RequireAll,
		BatchTimeout:           5 * time.Millisecond,
		WriteTimeout:           s.cfg.DeadLetterTimeout,
		ReadTimeout:            s.cfg.DeadLetterTimeout,
		AllowAutoTopicCreation: s.cfg.DeadLetterAutoCreate,
		Transport:              tr,
	}
	s.dlqMu.Lock()
	s.dlq = &deadLetterWriter{w: w, tr: tr}
	s.dlqMu.Unlock()
}

// closeDeadLetters waits for the letters being written and closes the
// writer of the Run. A second call does nothing.
func (s *Source) closeDeadLetters() {
	s.dlqMu.Lock()
	d := s.dlq
	s.dlq = nil
	s.dlqMu.Unlock()
	if d == nil {
		return
	}
	if err := d.w.Close(); err != nil {
		s.log.Warn("kafka: closing the dead-letter writer", slog.Any("error", err))
	}
	d.tr.CloseIdleConnections()
}

var _ consumer.DeadLetter = (*Source)(nil)
