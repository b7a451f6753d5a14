package redrive

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"

	"github.com/idemkit/idem/adapters/rocketmq"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/wire"
	"github.com/idemkit/idem/internal/rmqremoting"
)

// RocketMQ is a dead-letter topic on RocketMQ: idem's own
// (rocketmq.DeadLetterTopic mode, <topic>_DLQ by default), whose letters
// carry the metadata as user properties. The broker's %DLQ%<group>
// (DeadLetterBroker mode) holds the bare messages, without an idem key or
// lineage: Run refuses it with ErrBrokerDeadLetterQueue.
//
// The position is the redrive group's consumer offset of each queue of the
// topic on each broker, committed with the broker's answer awaited (no
// consumer of the group runs). A copy goes to its original topic, to the
// queue its original was delivered from when the topic still has it on
// that broker, else to a queue the producer chooses: the consumer honours
// a copy's lineage in any queue (the Source reports
// source.Description.ProducerChosenIDs) and keys it by the original's message ID. The
// copy keeps the letter's KEYS and TAGS, so that a consumer subscribed by
// tag receives it.
type RocketMQ struct {
	NameServers []string      // host:port; required
	Timeout     time.Duration // bounds one request; default 10s
}

// Name returns "rocketmq".
func (RocketMQ) Name() string { return "rocketmq" }

// ErrBrokerDeadLetterQueue is returned for a topic %DLQ%<group>: the
// broker's own dead-letter queue, whose messages carry no idem metadata.
var ErrBrokerDeadLetterQueue = errors.New("the broker's dead-letter queue (%DLQ%<group>, rocketmq.DeadLetterBroker mode) holds the messages as they were, without an idem key (idem-key) or lineage (idem-original-*): redrive cannot check that a key was released, nor make the consumer deduplicate the copy; it redrives idem's dead-letter topics (rocketmq.DeadLetterTopic mode)")

// ErrRetryTopic is returned for a topic %RETRY%<group>.
var ErrRetryTopic = errors.New("a retry topic (%RETRY%<group>) is the broker's, for redeliveries: not a dead-letter topic")

// pullBatch is the most letters one pull asks for.
const pullBatch = 32

// redriveProducerGroup is the producer group of the redrive's producer (it
// matters to the broker only for transactional messages).
const redriveProducerGroup = "IDEM_REDRIVE_PRODUCER"

func (r RocketMQ) open(ctx context.Context, topic, group string) (session, error) {
	switch {
	case len(r.NameServers) == 0:
		return nil, errors.New("rocketmq: no name servers")
	case strings.HasPrefix(topic, "%DLQ%"):
		return nil, fmt.Errorf("rocketmq: %s: %w", topic, ErrBrokerDeadLetterQueue)
	case strings.HasPrefix(topic, "%RETRY%"):
		return nil, fmt.Errorf("rocketmq: %s: %w", topic, ErrRetryTopic)
	}
	timeout := r.Timeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	s := &rocketSession{nameServers: r.NameServers, topic: topic, group: group, timeout: timeout}
	var err error
	if s.route, err = s.topicRoute(ctx, topic); err != nil {
		return nil, err
	}
	return s, nil
}

type rocketSession struct {
	nameServers  []string
	topic, group string
	timeout      time.Duration
	route        []rmqremoting.RouteBroker

	producer *rocketProducer // started at the first send
}

// topicRoute asks the name servers, in turn, for topic's route.
func (s *rocketSession) topicRoute(ctx context.Context, topic string) ([]rmqremoting.RouteBroker, error) {
	var errs []error
	for _, ns := range s.nameServers {
		rctx, cancel := context.WithTimeout(ctx, s.timeout)
		route, err := rmqremoting.TopicRoute(rctx, ns, topic)
		cancel()
		switch {
		case err == nil:
			return route, nil
		case errors.Is(err, rmqremoting.ErrTopicNotExist):
			return nil, fmt.Errorf("rocketmq: topic %s does not exist (name server %s)", topic, ns)
		case rmqremoting.IsCode(err, rmqremoting.CodeRequestNotSupported):
			return nil, &WrongBrokerError{Addr: ns, Want: "rocketmq", Seems: "a RocketMQ broker", Err: err}
		}
		if wrong := notRocketMQ(ctx, ns, err); wrong != nil {
			return nil, wrong
		}
		errs = append(errs, fmt.Errorf("rocketmq: name server %s: %w", ns, err))
	}
	return nil, errors.Join(errs...)
}

func (s *rocketSession) close() {
	if s.producer != nil {
		_ = s.producer.p.Shutdown()
	}
}

// queues reads, on each broker of the topic, where the group stopped in
// each queue and where the queue ends now.
func (s *rocketSession) queues(ctx context.Context) ([]queue, error) {
	var out []queue
	for _, b := range s.route {
		if !b.Readable() {
			continue
		}
		if b.Addr == "" {
			return nil, fmt.Errorf("rocketmq: broker %s of %s has no master now: its queues' offsets cannot be read or committed", b.Name, s.topic)
		}
		for id := range b.ReadQueues {
			q := rmqremoting.Queue{Addr: b.Addr, Broker: b.Name, Topic: s.topic, ID: id}
			rctx, cancel := context.WithTimeout(ctx, s.timeout)
			first, last, from, err := s.span(rctx, q)
			cancel()
			if err != nil {
				return nil, fmt.Errorf("rocketmq: %w", err)
			}
			if from < first {
				from = first
			}
			if from < last {
				out = append(out, queue{ref: q, from: from, to: last})
			}
		}
	}
	return out, nil
}

func (s *rocketSession) span(ctx context.Context, q rmqremoting.Queue) (first, last, committed int64, err error) {
	if first, err = rmqremoting.MinOffset(ctx, q); err != nil {
		return
	}
	if last, err = rmqremoting.MaxOffset(ctx, q); err != nil {
		return
	}
	committed, _, err = rmqremoting.ConsumerOffset(ctx, s.group, q)
	return
}

func (s *rocketSession) read(ctx context.Context, q queue, each func(letter) (bool, error)) error {
	rq := q.ref.(rmqremoting.Queue)
	for offset := q.from; offset < q.to; {
		pctx, cancel := context.WithTimeout(ctx, s.timeout)
		r, err := rmqremoting.Pull(pctx, s.group, rq, offset, int(min(pullBatch, q.to-offset)))
		cancel()
		if err != nil {
			return fmt.Errorf("rocketmq: read %s: %w", rq, err)
		}
		next := r.NextBegin
		switch r.Status {
		case rmqremoting.PullFound:
			for _, m := range r.Messages {
				if m.QueueOffset < offset {
					continue
				}
				if m.QueueOffset >= q.to {
					return nil // past the end as it was at the start
				}
				if more, err := each(rocketLetter(s.topic, rq, m)); err != nil || !more {
					return err
				}
				next = max(next, m.QueueOffset+1)
			}
		case rmqremoting.PullNoNew:
			return fmt.Errorf("rocketmq: read %s: no message at %d, before the end %d it had at the start", rq, offset, q.to)
		case rmqremoting.PullOffsetMoved:
			next = max(next, r.Min) // letters deleted (retention) since the start: on from the first kept
		}
		if next <= offset {
			return fmt.Errorf("rocketmq: read %s: the broker's next offset %d does not pass %d", rq, next, offset)
		}
		offset = next
	}
	return nil
}

// rocketLetter is a message of the dead-letter topic as a letter: its user
// properties are the headers (sorted), KEYS the key.
func rocketLetter(topic string, q rmqremoting.Queue, m *primitive.MessageExt) letter {
	props := m.GetProperties()
	l := letter{pos: fmt.Sprintf("%s/%s/%d/%d", topic, q.Broker, q.ID, m.QueueOffset), offset: m.QueueOffset,
		value: m.Body, raw: props}
	if keys := props[primitive.PropertyKeys]; keys != "" {
		l.key = []byte(keys)
	}
	for k, v := range props {
		if !rocketmq.IsSystemProperty(k) {
			l.headers = append(l.headers, consumer.Header{Key: k, Value: []byte(v)})
		}
	}
	sort.Slice(l.headers, func(i, j int) bool { return l.headers[i].Key < l.headers[j].Key })
	return l
}

func (s *rocketSession) name(q queue) string {
	rq := q.ref.(rmqremoting.Queue)
	return fmt.Sprintf("%s/%d", rq.Broker, rq.ID)
}

func (s *rocketSession) target(c *message) string { return c.topic }

func (s *rocketSession) send(ctx context.Context, c *message) (string, error) {
	if s.producer == nil {
		p, err := startProducer(s.nameServers, s.timeout)
		if err != nil {
			return "", err
		}
		s.producer = p
	}
	msg := primitive.NewMessage(c.topic, c.value)
	for _, h := range c.headers {
		msg.WithProperty(h.Key, string(h.Value))
	}
	props, _ := c.letter.raw.(map[string]string)
	for _, k := range []string{primitive.PropertyKeys, primitive.PropertyTags} {
		if v := props[k]; v != "" {
			msg.WithProperty(k, v)
		}
	}
	// The original's queue: its lane is topic/broker/queueId.
	lane, _ := c.letter.header(wire.MetaLane)
	if t, rest, ok := strings.Cut(lane, "/"); ok && t == c.topic {
		if i := strings.LastIndexByte(rest, '/'); i > 0 {
			if id, err := strconv.Atoi(rest[i+1:]); err == nil && id == c.partition {
				s.producer.want(rest[:i], id)
			}
		}
	}
	defer s.producer.want("", -1)
	sctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	res, err := s.producer.p.SendSync(sctx, msg)
	if err != nil {
		return "", fmt.Errorf("rocketmq: send %s to %s: %w", c.letter.pos, c.topic, err)
	}
	if res.Status != primitive.SendOK {
		return "", fmt.Errorf("rocketmq: send %s to %s: send status %d", c.letter.pos, c.topic, res.Status)
	}
	at := c.topic
	if mq := res.MessageQueue; mq != nil {
		at = fmt.Sprintf("%s/%s/%d", c.topic, mq.BrokerName, mq.QueueId)
	}
	return at, nil
}

func (s *rocketSession) commit(ctx context.Context, q queue, next int64) error {
	cctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	if err := rmqremoting.CommitOffset(cctx, s.group, q.ref.(rmqremoting.Queue), next); err != nil {
		return fmt.Errorf("rocketmq: commit the redrive's offset: %w", err)
	}
	return nil
}

// rocketProducer is the client's producer with a queue selector that picks
// the queue want names, when the topic has it.
type rocketProducer struct {
	p interface {
		SendSync(ctx context.Context, msgs ...*primitive.Message) (*primitive.SendResult, error)
		Shutdown() error
	}
	mu     sync.Mutex
	broker string
	queue  int
	rr     int
}

func (p *rocketProducer) want(broker string, queue int) {
	p.mu.Lock()
	p.broker, p.queue = broker, queue
	p.mu.Unlock()
}

// Select picks the wanted queue, else the next in turn.
func (p *rocketProducer) Select(_ *primitive.Message, mqs []*primitive.MessageQueue, _ string) *primitive.MessageQueue {
	if len(mqs) == 0 {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, mq := range mqs {
		if mq.BrokerName == p.broker && mq.QueueId == p.queue {
			return mq
		}
	}
	p.rr++
	return mqs[p.rr%len(mqs)]
}

func startProducer(nameServers []string, timeout time.Duration) (*rocketProducer, error) {
	rp := &rocketProducer{queue: -1}
	p, err := producer.NewDefaultProducer(
		producer.WithNsResolver(primitive.NewPassthroughResolver(nameServers)),
		producer.WithGroupName(redriveProducerGroup),
		// An instance of its own: the client shares one connection pool
		// per instance name in a process.
		producer.WithInstanceName(fmt.Sprintf("idem-redrive-%d-%d", os.Getpid(), time.Now().UnixNano())),
		producer.WithQueueSelector(rp),
		producer.WithRetry(2),
		producer.WithSendMsgTimeout(timeout),
	)
	if err != nil {
		return nil, fmt.Errorf("rocketmq: producer: %w", err)
	}
	if err := p.Start(); err != nil {
		return nil, fmt.Errorf("rocketmq: producer: %w", err)
	}
	rp.p = p
	return rp, nil
}
