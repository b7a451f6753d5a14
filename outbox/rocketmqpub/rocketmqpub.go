// Package rocketmqpub publishes outbox records to RocketMQ with
// rocketmq-client-go's producer, one SendSync per message: a message is
// published when the broker answered SEND_OK.
//
// A record's Key is the message's KEYS and its sharding key: the producer
// picks the queue by a hash of it, so one key stays on one queue (while the
// topic's queue count stays the same), and consumers in orderly mode see it
// in order. Messages of one key are sent one after the other, the next only
// once the last was stored; messages of different keys are sent in
// parallel (Config.Parallelism). Headers become user properties.
//
// Refused for good, and dead-lettered by the relay: a body over
// Config.MaxBodyBytes, properties over 32 KiB, a topic name RocketMQ cannot
// have, a header name it reserves — all checked before sending — and what
// the broker refuses with MESSAGE_ILLEGAL (13, a broker configured with a
// lower maxMessageSize) or an illegal topic (29). The client reports the
// broker's refusals only as text ("CODE: 13, DESC: ..."); that text is
// parsed here and nowhere else.
package rocketmqpub

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/apache/rocketmq-client-go/v2"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"

	"github.com/idemkit/idem/internal/hostport"
	"github.com/idemkit/idem/internal/rmqprops"
	"github.com/idemkit/idem/outbox"
)

// Config configures a Publisher. Zero values take the documented defaults.
type Config struct {
	// NameServers are the name servers, "host:port". Required.
	NameServers []string
	// Group is the producer group; default "idem_outbox".
	Group string
	// SendTimeout bounds one send; default 10s.
	SendTimeout time.Duration
	// Retries is how often the client itself retries a failed send (on
	// another broker, when there is one) before the relay's backoff takes
	// over; default 1, negative for none.
	Retries int
	// Parallelism is how many keys are sent to at once; default 32.
	Parallelism int
	// MaxBodyBytes is the largest body sent; a larger one is refused
	// without trying. Default 4 MiB, the brokers' default maxMessageSize.
	MaxBodyBytes int
}

// Publisher is an outbox.Publisher on a rocketmq-client-go producer. Safe
// for concurrent use.
type Publisher struct {
	cfg Config
	p   rocketmq.Producer
}

var instances atomic.Int64

// New validates cfg, starts a producer and returns a Publisher. Close it
// after the relay stopped.
func New(cfg Config) (*Publisher, error) {
	var errs []error
	add := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("rocketmqpub: Config."+format, args...))
	}
	hostport.CheckList("NameServers", cfg.NameServers, add)
	if cfg.Group != "" && !nameRE.MatchString(cfg.Group) {
		add("Group %q: want letters, digits, '%%', '|', '_' and '-', at most 255 bytes", cfg.Group)
	}
	if cfg.SendTimeout < 0 || cfg.Parallelism < 0 || cfg.MaxBodyBytes < 0 {
		add("SendTimeout, Parallelism and MaxBodyBytes must not be negative")
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	cfg.Group = cmp.Or(cfg.Group, "idem_outbox")
	cfg.SendTimeout = cmp.Or(cfg.SendTimeout, 10*time.Second)
	switch {
	case cfg.Retries == 0:
		cfg.Retries = 1
	case cfg.Retries < 0:
		cfg.Retries = 0
	}
	cfg.Parallelism = cmp.Or(cfg.Parallelism, 32)
	cfg.MaxBodyBytes = cmp.Or(cfg.MaxBodyBytes, 4<<20)
	p, err := producer.NewDefaultProducer(
		producer.WithNsResolver(primitive.NewPassthroughResolver(cfg.NameServers)),
		producer.WithGroupName(cfg.Group),
		// One client per Publisher: the client library shares a client
		// between producers of one instance name.
		producer.WithInstanceName(fmt.Sprintf("idem_outbox_%d_%d", os.Getpid(), instances.Add(1))),
		producer.WithQueueSelector(producer.NewHashQueueSelector()),
		producer.WithRetry(cfg.Retries),
		producer.WithSendMsgTimeout(cfg.SendTimeout),
	)
	if err != nil {
		return nil, fmt.Errorf("rocketmqpub: %w", err)
	}
	if err := p.Start(); err != nil {
		return nil, fmt.Errorf("rocketmqpub: start: %w", err)
	}
	return &Publisher{cfg: cfg, p: p}, nil
}

// Close shuts the producer down.
func (p *Publisher) Close() error { return p.p.Shutdown() }

var nameRE = regexp.MustCompile(`^[%|a-zA-Z0-9_-]{1,255}$`)

// Publish sends recs; see outbox.Publisher.
func (p *Publisher) Publish(ctx context.Context, recs []outbox.Record, errs []error) {
	var order []string
	lists := map[string][]int{}
	for i := range recs {
		k := recs[i].OrderKey()
		if lists[k] == nil {
			order = append(order, k)
		}
		lists[k] = append(lists[k], i)
	}
	work := make(chan []int)
	var wg sync.WaitGroup
	for range min(p.cfg.Parallelism, len(order)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for list := range work {
				p.sendList(ctx, recs, errs, list)
			}
		}()
	}
	for _, k := range order {
		work <- lists[k]
	}
	close(work)
	wg.Wait()
}

// sendList sends one key's records in order and holds back the rest after
// a failure other than a refusal.
func (p *Publisher) sendList(ctx context.Context, recs []outbox.Record, errs []error, list []int) {
	for n, i := range list {
		err := p.send(ctx, &recs[i])
		errs[i] = err
		if err != nil && !errors.Is(err, outbox.ErrRefused) {
			for _, j := range list[n+1:] {
				errs[j] = fmt.Errorf("%w: %w", outbox.ErrHeldBack, err)
			}
			return
		}
	}
}

func (p *Publisher) send(ctx context.Context, r *outbox.Record) error {
	m, err := p.message(r)
	if err != nil {
		return outbox.Refused(err)
	}
	res, err := p.p.SendSync(ctx, m)
	switch {
	case err != nil && brokerRefusal(err):
		return outbox.Refused(fmt.Errorf("rocketmqpub: %w", err))
	case err != nil:
		return fmt.Errorf("rocketmqpub: %w", err)
	case res.Status != primitive.SendOK:
		// Stored, but not flushed or not replicated as the broker is
		// configured to: not durable yet. Sent again later.
		return fmt.Errorf("rocketmqpub: send status %d", res.Status)
	}
	return nil
}

// maxProperties is the brokers' limit on a message's properties.
const maxProperties = 32 << 10

// message builds the producer's message, refusing what RocketMQ cannot
// carry.
func (p *Publisher) message(r *outbox.Record) (*primitive.Message, error) {
	if len(r.Topic) > 127 || !nameRE.MatchString(r.Topic) {
		return nil, fmt.Errorf("topic %q: RocketMQ topic names have at most 127 letters, digits, '%%', '|', '_' and '-'", r.Topic)
	}
	if len(r.Value) > p.cfg.MaxBodyBytes {
		return nil, fmt.Errorf("body of %d bytes, the limit is %d (rocketmqpub.Config.MaxBodyBytes)", len(r.Value), p.cfg.MaxBodyBytes)
	}
	m := primitive.NewMessage(r.Topic, r.Value)
	size := 0
	for _, h := range r.Headers {
		if reserved(h.Key) {
			return nil, fmt.Errorf("header %q: a RocketMQ system property", h.Key)
		}
		if strings.ContainsAny(h.Key, "\x01\x02") || strings.ContainsAny(string(h.Value), "\x01\x02") {
			return nil, fmt.Errorf("header %q: RocketMQ properties cannot hold the bytes 0x01 and 0x02", h.Key)
		}
		size += len(h.Key) + len(h.Value) + 2
		m.WithProperty(h.Key, string(h.Value))
	}
	if r.Key != nil {
		k := string(r.Key)
		if strings.ContainsAny(k, "\x01\x02") {
			return nil, errors.New("key: RocketMQ properties cannot hold the bytes 0x01 and 0x02")
		}
		m.WithKeys([]string{k})
		m.WithShardingKey(k)
		size += 2 * (len(k) + 16)
	}
	if size > maxProperties {
		return nil, fmt.Errorf("properties (headers and key) of about %d bytes, RocketMQ's limit is %d", size, maxProperties)
	}
	return m, nil
}

// reserved reports whether a header name is a RocketMQ system property
// (rmqprops.System) or starts with "__", as the client's own do: a header
// by such a name would be taken for the broker's, or vanish
// (adapters/rocketmq does not deliver them as headers).
func reserved(name string) bool { return rmqprops.System(name) || strings.HasPrefix(name, "__") }

// codeRE reads the broker's response code out of the client's error text,
// the only form in which the client reports it.
var codeRE = regexp.MustCompile(`^CODE: (\d+), DESC:`)

// brokerRefusal reports MESSAGE_ILLEGAL (13: body or properties over the
// broker's limits) and the illegal topic name (29).
func brokerRefusal(err error) bool {
	m := codeRE.FindStringSubmatch(err.Error())
	if m == nil {
		return false
	}
	code, _ := strconv.Atoi(m[1])
	return code == 13 || code == 29
}

var _ outbox.Publisher = (*Publisher)(nil)
