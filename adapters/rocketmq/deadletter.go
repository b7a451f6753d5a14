package rocketmq

import (
	"context"
	"fmt"
	"hash/fnv"
	"log/slog"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"

	"github.com/idemkit/idem/adapters/internal/retrytopic"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/wire"
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
		return ErrNotRunning
	}
	if s.cfg.DeadLetter == DeadLetterBroker {
		if err := r.markDead(l.Message); err != nil {
			return err
		}
		s.log.Info("rocketmq: message goes to the broker's dead-letter queue",
			slog.String("dlq", "%DLQ%"+s.cfg.Group), slog.String("message", l.Message.Ref()),
			slog.String("cause", l.Cause.String()), slog.String("reason", reasonOf(l)))
		return nil
	}
	msg := s.letter(l)
	ctx, cancel := context.WithTimeout(ctx, s.cfg.DeadLetterTimeout)
	defer cancel()
	res, err := dlq.SendSync(ctx, msg)
	if err != nil {
		return fmt.Errorf("rocketmq: dead letter of %s to %s: %w", l.Message.Ref(), msg.Topic, err)
	}
	if res.Status != primitive.SendOK {
		return fmt.Errorf("rocketmq: dead letter of %s to %s: send status %d", l.Message.Ref(), msg.Topic, res.Status)
	}
	return nil
}

// letter builds the dead letter of l for idem's topic: the body and the
// properties of l.Record (the original's user properties, then the
// consumer.Meta* metadata), and the original's KEYS and TAGS. A body that
// Record left out (or an empty one) becomes a note, since the broker
// refuses empty bodies.
func (s *Source) letter(l consumer.Letter) *primitive.Message {
	m := l.Message
	// A retry copy's letter goes with its original's letters.
	topic := retrytopic.DeadLetterTopic(m, s.retryOf, s.cfg.DeadLetterTopic, "_DLQ")
	headers, body := wire.Letter(l).Record(s.cfg.DeadLetterMaxBytes)
	if len(body) == 0 {
		// The broker refuses an empty body (a NullPointerException in
		// 5.3): say why there is none.
		body = []byte("idem: empty value")
		if len(m.Value) > 0 {
			body = []byte("idem: value left out, see the " + wire.MetaValueSize + " and " + wire.MetaValueSHA256 + " properties")
		}
	}
	msg := primitive.NewMessage(topic, body)
	for _, h := range headers {
		msg.WithProperty(h.Key, string(h.Value))
	}
	if mx, ok := m.Raw.(*primitive.MessageExt); ok {
		msg.WithProperty(primitive.PropertyKeys, mx.GetKeys())
		msg.WithProperty(primitive.PropertyTags, mx.GetTags())
	}
	return msg
}

func reasonOf(l consumer.Letter) string {
	if l.Reason == nil {
		return "unknown"
	}
	return l.Reason.Error()
}

// sameQueue sends the letters of one original queue to one queue of the
// dead-letter topic, so that they stay in order, and a retry copy (whose
// Queue Source.Retry sets) to the queue of its original's number.
type sameQueue struct{}

func (sameQueue) Select(msg *primitive.Message, mqs []*primitive.MessageQueue, _ string) *primitive.MessageQueue {
	if len(mqs) == 0 {
		return nil
	}
	if msg.Queue != nil {
		return mqs[uint(msg.Queue.QueueId)%uint(len(mqs))]
	}
	h := fnv.New32a()
	h.Write([]byte(msg.GetProperty(wire.MetaLane)))
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
