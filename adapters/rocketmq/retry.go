package rocketmq

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"

	"github.com/idemkit/idem/adapters/internal/retrytopic"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/wire"
	"github.com/idemkit/idem/internal/retry"
)

// Retry topics (consumer.NonBlocking): a message that used up its attempts
// in its lane is produced to the retry topic of its topic as a timer
// message due after its delay, and the same Source reads it back.
//
// The copy goes to a retry topic of its own, not back to the topic: other
// consumer groups read the topic, and a copy there would be a new message
// to every one of them. Nor does it go through the broker's own
// %RETRY%<group> (a message given back with "retry later"): the broker's
// copy carries no trip of idem's, and its reconsume count also counts
// releases; idem's copy carries its trip in wire.MetaRetryAttempt. One
// retry topic per topic is enough: the broker's timer wheel (RocketMQ 5)
// holds each copy until its own delivery time, so copies of different
// delays need no topic each, as Kafka's do.

// maxRetryDelay is the longest delay a retry copy may have: the broker's
// timerMaxDelaySec default, 3 days. The broker refuses a timer message due
// later (WHEEL_TIMER_MSG_ILLEGAL).
const maxRetryDelay = 3 * 24 * time.Hour

// RetryTopic is the retry topic of topic: topic + "_RETRY"
// ("payments_RETRY"). With Config.RetryDelays the Source consumes it
// beside topic and Source.Retry produces to it.
func RetryTopic(topic string) string { return topic + "_RETRY" }

// retryTopicOf reports whether topic is the retry topic of one of the
// Source's topics (Config.RetryDelays), and of which
// (source.Description.RetryOf).
func (s *Source) retryTopicOf(topic string) (string, bool) {
	t, ok := s.retryOf[topic]
	return t, ok
}

// Retry implements consumer.RetrySink: it produces r to the retry topic of
// the original's topic (RetryTopic), on the queue of the original's number
// (modulo the retry topic's queues), as a timer message the broker
// delivers after r's delay (the TIMER_DELAY_MS property), and returns once
// the broker stored it (SEND_OK). The message is wire.Letter(r.Letter).RetryRecord(r.Retry): the original
// body and user properties, the lineage and the retry properties, and the
// original's KEYS and TAGS. It uses the dead-letter producer
// (DeadLetterTimeout) and returns ErrNotRunning outside Run.
func (s *Source) Retry(ctx context.Context, r consumer.RetryLetter) error {
	m := r.Message
	if m == nil {
		return errors.New("rocketmq: retry without a message")
	}
	if !slices.Contains(s.cfg.RetryDelays, r.Delay) {
		return fmt.Errorf("rocketmq: retry of %s: delay %v is not one of Config.RetryDelays %v", m.Ref(), r.Delay, s.cfg.RetryDelays)
	}
	msg := s.retryCopy(r, time.Now())
	if n := len(msg.MarshallProperties()); n > maxPropertiesLen {
		return fmt.Errorf("rocketmq: retry of %s to %s: %w: its properties take %d bytes, the broker's limit is %d",
			m.Ref(), msg.Topic, consumer.ErrRetryTooLarge, n, maxPropertiesLen)
	}
	s.mu.Lock()
	running, p := s.cur != nil, s.dlq
	s.mu.Unlock()
	if !running || p == nil {
		return ErrNotRunning
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.DeadLetterTimeout)
	defer cancel()
	res, err := p.SendSync(ctx, msg)
	if err != nil {
		return fmt.Errorf("rocketmq: retry of %s to %s: %w", m.Ref(), msg.Topic, err)
	}
	if res.Status != primitive.SendOK {
		return fmt.Errorf("rocketmq: retry of %s to %s: send status %d", m.Ref(), msg.Topic, res.Status)
	}
	return nil
}

// retryCopy builds the message Retry sends for r at now.
func (s *Source) retryCopy(r consumer.RetryLetter, now time.Time) *primitive.Message {
	m := r.Message
	topic, queue := retrytopic.Original(m, s.retryOf)
	headers, body := wire.Letter(r.Letter).RetryRecord(r.Retry)
	msg := primitive.NewMessage(RetryTopic(topic), body)
	for _, h := range headers {
		msg.WithProperty(h.Key, string(h.Value))
	}
	if mx, ok := m.Raw.(*primitive.MessageExt); ok {
		if k := mx.GetKeys(); k != "" {
			msg.WithProperty(primitive.PropertyKeys, k)
		}
		if t := mx.GetTags(); t != "" {
			msg.WithProperty(primitive.PropertyTags, t)
		}
	}
	// A delay relative to the broker's clock: the broker rounds the
	// delivery time down to its timerPrecisionMs (1 s), and the source
	// waits out the rest (waitDue), so a skew between the clocks costs at
	// most the wait.
	if d := r.Due.Sub(now); d > 0 {
		msg.WithProperty(timerDelayMs, strconv.FormatInt(d.Milliseconds(), 10))
	}
	msg.Queue = &primitive.MessageQueue{Topic: msg.Topic, QueueId: int(queue)} // read by sameQueue only
	return msg
}

// maxPropertiesLen is the most bytes a message's encoded properties may
// take: the broker stores their length in 2 bytes (Short.MAX_VALUE) and
// answers a larger message with MESSAGE_ILLEGAL, which retrying cannot
// change. A retry copy adds its lineage and retry properties to its
// original's, so an original near the limit makes a copy past it: Retry
// refuses that copy with consumer.ErrRetryTooLarge and the consumer
// dead-letters the message instead of retrying the send for ever. The
// body needs no check: it is the original's, which the broker already
// took (maxMessageSize, 4 MiB by default, is a broker's setting for every
// topic; brokers of one cluster set alike are assumed). The client reports a broker's refusal as text
// only, so the limit is checked here rather than read from its answer.
const maxPropertiesLen = 32767

// timerDelayMs is the property of a RocketMQ 5 timer message that delays
// its delivery by so many milliseconds after the broker stored it.
const timerDelayMs = "TIMER_DELAY_MS"

// waitDue waits until m, a message of a retry topic, is due
// (wire.MetaRetryDue); false when ctx ended first. The broker delivers
// a timer message up to its timerPrecisionMs early; a message without a
// readable due time is due at once. Waiting holds m's queue of the retry
// topic only.
func waitDue(ctx context.Context, m *consumer.Message) bool {
	due, ok := wire.RetryDue(m)
	if !ok {
		return true
	}
	d := time.Until(due)
	if d <= 0 {
		return true
	}
	return retry.Sleep(ctx, d) == nil
}

var _ consumer.RetrySink = (*Source)(nil)
