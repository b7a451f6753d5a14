package rocketmq

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"strconv"
	"strings"
	"unicode"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/dedup"
)

// Properties a dead letter in idem's own topic carries (DeadLetterTopic
// mode), besides the original message's user properties, KEYS and TAGS. The
// names are those of the Kafka adapter's headers.
const (
	PropReason    = "idem-reason"           // why: the error text, at most dedup.MaxReasonLen bytes
	PropAttempts  = "idem-attempts"         // failed handler runs, decimal
	PropTopic     = "idem-original-topic"   // the message's topic
	PropQueue     = "idem-original-queue"   // the queue it was consumed from: topic/broker/queueId
	PropOffset    = "idem-original-offset"  // its offset in that queue, decimal
	PropMessageID = "idem-original-msg-id"  // its message ID (consumer.Message.ID)
	PropKeyScope  = "idem-key-scope"        // the dedup key's scope; absent when no key was derived
	PropKey       = "idem-key"              // the dedup key's ID; absent when no key was derived
	PropAttempt   = "idem-original-attempt" // the broker's delivery attempt (reconsume times + 1)
	PropValueSize = "idem-value-size"       // body bytes, decimal, when the body was left out
	// PropValueSHA256 is the hex SHA-256 of a body larger than
	// Config.MaxDeadLetterBodyBytes, which is left out of the letter.
	PropValueSHA256 = "idem-value-sha256"
)

// dlqProducerGroup is the producer group of idem's dead-letter producers. A
// producer group matters to the broker only for transactional messages.
const dlqProducerGroup = "IDEM_DLQ_PRODUCER"

// sender is the part of the client's producer the source uses.
type sender interface {
	Start() error
	Shutdown() error
	SendSync(ctx context.Context, msgs ...*primitive.Message) (*primitive.SendResult, error)
}

// DeadLetter implements consumer.DeadLetter; give the Source to
// consumer.Config.DeadLetter. It works only for messages this Source
// delivered, while Run runs.
//
// DeadLetterTopic mode: the letter is produced to the dead-letter topic and
// DeadLetter returns once the broker stored it (SEND_OK); the consumer then
// acks the original. Letters of one original queue go to one queue of the
// dead-letter topic.
//
// DeadLetterBroker mode: DeadLetter only marks the message and returns nil.
// The consumer then acks it, which completes its consume call (one message
// per call in this mode); the call returns so that the client moves the
// message to %DLQ%<group> (see Config.DeadLetter). Until the client's
// send-back succeeded the queue's offset does not pass the message: a crash
// in between redelivers it, and the consumer dead-letters it again (a
// permanent failure is recorded in the dedup store, so the handler does not
// run again).
func (s *Source) DeadLetter(ctx context.Context, l consumer.Letter) error {
	s.mu.Lock()
	r, dlq := s.cur, s.dlq
	s.mu.Unlock()
	if r == nil {
		return errors.New("rocketmq: dead letter outside Source.Run")
	}
	if s.cfg.DeadLetter == DeadLetterBroker {
		if err := r.markDead(l.Message); err != nil {
			return err
		}
		s.log.Info("rocketmq: message goes to the broker's dead-letter queue",
			slog.String("dlq", "%DLQ%"+s.cfg.Group), slog.String("message", l.Message.Coordinates()),
			slog.String("id", l.Message.ID), slog.String("reason", reasonOf(l)))
		return nil
	}
	msg := s.letter(l)
	ctx, cancel := context.WithTimeout(ctx, s.cfg.DeadLetterTimeout)
	defer cancel()
	res, err := dlq.SendSync(ctx, msg)
	if err != nil {
		return fmt.Errorf("rocketmq: dead letter of %s to %s: %w", l.Message.Coordinates(), msg.Topic, err)
	}
	if res.Status != primitive.SendOK {
		return fmt.Errorf("rocketmq: dead letter of %s to %s: send status %d", l.Message.Coordinates(), msg.Topic, res.Status)
	}
	return nil
}

// letter builds the dead letter of l for idem's topic.
func (s *Source) letter(l consumer.Letter) *primitive.Message {
	m := l.Message
	topic := s.cfg.DeadLetterTopic
	if topic == "" {
		topic = m.Topic + "_DLQ"
	}
	body := m.Value
	msg := primitive.NewMessage(topic, nil)
	for _, h := range m.Headers {
		if !strings.HasPrefix(h.Key, "idem-") {
			msg.WithProperty(h.Key, string(h.Value))
		}
	}
	if mx, ok := m.Raw.(*primitive.MessageExt); ok {
		msg.WithProperty(primitive.PropertyKeys, mx.GetKeys())
		msg.WithProperty(primitive.PropertyTags, mx.GetTags())
	}
	msg.WithProperty(PropReason, clean(dedup.ShortReason(reasonOf(l))))
	msg.WithProperty(PropAttempts, strconv.Itoa(l.Attempts))
	msg.WithProperty(PropTopic, m.Topic)
	msg.WithProperty(PropQueue, m.Lane)
	msg.WithProperty(PropOffset, strconv.FormatInt(m.Offset, 10))
	msg.WithProperty(PropMessageID, clean(m.ID))
	msg.WithProperty(PropAttempt, strconv.Itoa(m.Attempt))
	if l.Key.ID != "" {
		msg.WithProperty(PropKeyScope, clean(l.Key.Scope))
		msg.WithProperty(PropKey, clean(l.Key.ID))
	}
	if len(body) > s.cfg.MaxDeadLetterBodyBytes {
		sum := sha256.Sum256(body)
		msg.WithProperty(PropValueSHA256, hex.EncodeToString(sum[:]))
		msg.WithProperty(PropValueSize, strconv.Itoa(len(body)))
		body = []byte("idem: body of " + strconv.Itoa(len(body)) + " bytes left out, see " + PropValueSHA256)
	}
	if len(body) == 0 {
		body = []byte{} // the broker stores empty bodies; keep it explicit
	}
	msg.Body = body
	return msg
}

func reasonOf(l consumer.Letter) string {
	if l.Reason == nil {
		return "unknown"
	}
	return l.Reason.Error()
}

// clean keeps a property value from breaking RocketMQ's property encoding
// (\x01 and \x02 separate names and values): control characters become
// spaces.
func clean(s string) string {
	return strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, s)
}

// sameQueue sends the letters of one original queue to one queue of the
// dead-letter topic, so that they stay in order.
type sameQueue struct{}

func (sameQueue) Select(msg *primitive.Message, mqs []*primitive.MessageQueue, _ string) *primitive.MessageQueue {
	if len(mqs) == 0 {
		return nil
	}
	h := fnv.New32a()
	h.Write([]byte(msg.GetProperty(PropQueue)))
	return mqs[h.Sum32()%uint32(len(mqs))]
}

func (s *Source) startProducer(instance string) (sender, error) {
	opts := []producer.Option{
		producer.WithNsResolver(primitive.NewPassthroughResolver(s.cfg.NameServers)),
		producer.WithGroupName(dlqProducerGroup),
		producer.WithInstanceName(instance),
		producer.WithQueueSelector(sameQueue{}),
		producer.WithRetry(2),
		producer.WithSendMsgTimeout(s.cfg.DeadLetterTimeout),
	}
	if s.cfg.AccessKey != "" {
		opts = append(opts, producer.WithCredentials(s.credentials()))
	}
	p, err := producer.NewDefaultProducer(opts...)
	if err != nil {
		return nil, fmt.Errorf("rocketmq: dead-letter producer: %w", err)
	}
	if err := p.Start(); err != nil {
		return nil, fmt.Errorf("rocketmq: dead-letter producer: %w", err)
	}
	return p, nil
}

func (s *Source) shutdownProducer(p sender) {
	if err := p.Shutdown(); err != nil {
		s.log.Warn("rocketmq: dead-letter producer shutdown", slog.Any("error", err))
	}
}
