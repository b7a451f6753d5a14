package kafka

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/idemkit/idem/adapters/internal/retrytopic"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/wire"
	"github.com/idemkit/idem/internal/retry"
)

// Retry topics (consumer.NonBlocking): a message that used up its attempts
// in its lane is written to the retry topic of its delay, and the same
// Source reads it back once it is due.
//
// One Source, and so one consumer, reads a topic and its retry topics: a
// retry copy must be deduplicated in the scope of its original (the
// consumer's Name), by the same store, and each retry partition is a lane
// of its own, so a copy waiting to be due holds no partition of the topic
// and no other retry topic. A second consumer could read them too (with
// the same Name), but it would only duplicate the configuration.

// RetryTopic is the retry topic of topic for delay d: topic + ".retry." +
// d in the largest whole unit (h, m, s, ms): "payments.retry.10s",
// "payments.retry.1m", "payments.retry.1500ms".
func RetryTopic(topic string, d time.Duration) string {
	return topic + ".retry." + delayName(d)
}

func delayName(d time.Duration) string { return wire.RetryDelayName(d) }

// retryTopicOf reports whether topic is a retry topic of the Source's
// (Config.RetryDelays), and of which topic (source.Description.RetryOf).
func (s *Source) retryTopicOf(topic string) (string, bool) {
	t, ok := s.retryOf[topic]
	return t, ok
}

// Retry implements consumer.RetrySink: it writes r to the retry topic of
// its delay for the original's topic (RetryTopic), on the partition of the
// original's number (modulo the retry topic's partitions), and returns
// once all in-sync replicas acknowledged it. The record is wire.Letter(r.Letter).RetryRecord(r.Retry): the
// original key and value, its headers, the lineage and the retry headers.
// It uses the dead-letter writer (DeadLetterTimeout, DeadLetterAutoCreate),
// and returns ErrNotRunning outside Run.
func (s *Source) Retry(ctx context.Context, r consumer.RetryLetter) error {
	m := r.Message
	if m == nil {
		return errors.New("kafka: retry without a message")
	}
	topic, partition := retrytopic.Original(m, s.retryOf)
	if !slices.Contains(s.cfg.RetryDelays, r.Delay) {
		return fmt.Errorf("kafka: retry of %s: no retry topic for delay %v (Config.RetryDelays %v)", m.Ref(), r.Delay, s.cfg.RetryDelays)
	}
	headers, value := wire.Letter(r.Letter).RetryRecord(r.Retry)
	err := s.writeLetter(ctx, outRecord(RetryTopic(topic, r.Delay), partition, m.Key, headers, value))
	if tooLarge(err) {
		return fmt.Errorf("kafka: retry of %s: %w: %w", m.Ref(), consumer.ErrRetryTooLarge, err)
	}
	if err != nil {
		return fmt.Errorf("kafka: retry of %s: %w", m.Ref(), err)
	}
	return nil
}

// tooLarge reports whether err is a write refused for the record's size:
// by the writer (a record past its batch size), or by the broker
// (MESSAGE_TOO_LARGE, RECORD_LIST_TOO_LARGE: past the topic's
// max.message.bytes).
func tooLarge(err error) bool {
	if err == nil {
		return false
	}
	var werrs kafkago.WriteErrors
	if errors.As(err, &werrs) {
		for _, e := range werrs {
			if tooLarge(e) {
				return true
			}
		}
	}
	return errors.Is(err, kafkago.MessageSizeTooLarge) || errors.Is(err, kafkago.RecordListTooLarge)
}

// waitDue waits until m, a record of a retry topic, is due
// (wire.MetaRetryDue); false when ctx ended first (the generation
// ended, or Run's). A record without a readable due time is due at once.
// While it waits the partition counts as fetching (Lanes).
func (s *Source) waitDue(ctx context.Context, p *partition, m *consumer.Message) bool {
	due, ok := wire.RetryDue(m)
	if !ok {
		return true
	}
	d := time.Until(due)
	if d <= 0 {
		return true
	}
	p.fetchAt.Store(due.UnixNano())
	defer p.fetchAt.Store(time.Now().UnixNano())
	return retry.Sleep(ctx, d) == nil
}

var _ consumer.RetrySink = (*Source)(nil)
