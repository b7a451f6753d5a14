// Package rmqtest is the RocketMQ side of idem's integration tests: the
// broker behind the test environment's name server (or a private one),
// topics, producing, reading, and queue and consumer offsets. It is apart
// from testenv so that tests without RocketMQ do not build its client.
package rmqtest

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/admin"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"

	"github.com/idemkit/idem/adapters/rocketmq"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/internal/testenv"
)

// Broker is a name server and its (single) master broker, with an admin
// client.
type Broker struct {
	NameServers []string
	Addr        string // the master broker's address
	Name        string // its broker name
	Admin       admin.Admin

	mu     sync.Mutex
	queues map[string]int // queues of the topics CreateTopic created
}

// Connect finds the master broker through the name server and starts an
// admin client. Close it.
func Connect(namesrv []string) (*Broker, error) {
	addr, bname, err := ClusterBroker(namesrv[0])
	if err != nil {
		return nil, err
	}
	adm, err := admin.NewAdmin(admin.WithResolver(primitive.NewPassthroughResolver(namesrv)))
	if err != nil {
		return nil, fmt.Errorf("rocketmq admin: %w", err)
	}
	return &Broker{NameServers: namesrv, Addr: addr, Name: bname, Admin: adm, queues: map[string]int{}}, nil
}

// ConnectAll is Connect for each master broker the name server knows (the
// brokers of a cluster), sorted by broker name, each with its own admin
// client. Close each.
func ConnectAll(namesrv []string) ([]*Broker, error) {
	masters, err := Masters(namesrv[0])
	if err != nil {
		return nil, err
	}
	if len(masters) == 0 {
		return nil, fmt.Errorf("the name server %s knows no master broker", namesrv[0])
	}
	var out []*Broker
	for _, m := range masters {
		adm, err := admin.NewAdmin(admin.WithResolver(primitive.NewPassthroughResolver(namesrv)))
		if err != nil {
			for _, b := range out {
				_ = b.Close()
			}
			return nil, fmt.Errorf("rocketmq admin: %w", err)
		}
		out = append(out, &Broker{NameServers: namesrv, Addr: m.Addr, Name: m.Name, Admin: adm, queues: map[string]int{}})
	}
	return out, nil
}

// Close closes the admin client.
func (b *Broker) Close() error { return b.Admin.Close() }

var (
	sharedMu sync.Mutex
	shared   *Broker
)

// Shared returns the test environment's RocketMQ, connected once per
// process (CloseShared closes it, in TestMain), or skips (fails under CI)
// when IDEM_TEST_ROCKETMQ_NAMESRV is unset.
func Shared(t testing.TB) *Broker {
	t.Helper()
	ns := testenv.RocketMQNamesrv(t)
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if shared == nil {
		b, err := Connect(ns)
		if err != nil {
			t.Fatal(err)
		}
		shared = b
	}
	return shared
}

// CloseShared closes what Shared connected.
func CloseShared() {
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if shared != nil {
		_ = shared.Close()
		shared = nil
	}
}

// CreateTopic creates topic with queues read and write queues on the
// broker, deletes it when the test ends, and waits until the name server
// routes it.
func (b *Broker) CreateTopic(t testing.TB, topic string, queues int) []*primitive.MessageQueue {
	t.Helper()
	return CreateTopicOn(t, []*Broker{b}, topic, queues)
}

// CreateTopicOn creates topic with queues read and write queues on each of
// brokers (the masters of one name server's cluster, see ConnectAll),
// deletes it when the test ends, and waits until the name server routes
// queues of it to each of them.
func CreateTopicOn(t testing.TB, brokers []*Broker, topic string, queues int) []*primitive.MessageQueue {
	t.Helper()
	ctx := testenv.Context(t, time.Minute)
	for _, b := range brokers {
		err := b.Admin.CreateTopic(ctx, admin.WithTopicCreate(topic), admin.WithBrokerAddrCreate(b.Addr),
			admin.WithReadQueueNums(queues), admin.WithWriteQueueNums(queues))
		if err != nil {
			t.Fatalf("create topic %s on %s: %v", topic, b.Name, err)
		}
		b.mu.Lock()
		b.queues[topic] = queues
		b.mu.Unlock()
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = b.Admin.DeleteTopic(ctx, admin.WithTopicDelete(topic), admin.WithBrokerAddrDelete(b.Addr),
				admin.WithNameSrvAddr(b.NameServers))
		})
	}
	var mqs []*primitive.MessageQueue
	testenv.WaitUntilProgress(t, time.Minute, "route of topic "+topic, func() (bool, string) {
		var err error
		mqs, err = brokers[0].Admin.FetchPublishMessageQueues(ctx, topic)
		if err != nil {
			return false, err.Error()
		}
		per := map[string]int{}
		for _, mq := range mqs {
			per[mq.BrokerName]++
		}
		for _, b := range brokers {
			if per[b.Name] != queues {
				return false, fmt.Sprintf("queues by broker %v, want %d on each of %d", per, queues, len(brokers))
			}
		}
		return len(mqs) == queues*len(brokers), fmt.Sprintf("queues by broker %v", per)
	})
	return mqs
}

// Queues returns how many queues topic has, as CreateTopic created it (1
// for any other topic: a retry topic).
func (b *Broker) Queues(topic string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	if n, ok := b.queues[topic]; ok {
		return n
	}
	return 1
}

// Count returns how many messages topic holds.
func (b *Broker) Count(topic string) (int64, error) {
	var n int64
	for q := range b.Queues(topic) {
		hi, err := b.MaxOffset(topic, q)
		if err != nil {
			return 0, err
		}
		lo, err := b.MinOffset(topic, q)
		if err != nil {
			return 0, err
		}
		n += hi - lo
	}
	return n, nil
}

// Sender is the part of the client's producer the tests use.
type Sender interface {
	SendSync(ctx context.Context, msgs ...*primitive.Message) (*primitive.SendResult, error)
}

// NewProducer starts a producer of its own group and instance, shut down
// when the test ends. opts come after idem's (a queue selector, say).
func (b *Broker) NewProducer(t testing.TB, opts ...producer.Option) Sender {
	t.Helper()
	opts = append([]producer.Option{
		producer.WithNsResolver(primitive.NewPassthroughResolver(b.NameServers)),
		producer.WithGroupName(testenv.Name(t, "pg")),
		producer.WithInstanceName(testenv.Name(t, "pi")),
		producer.WithRetry(2),
		producer.WithSendMsgTimeout(10 * time.Second),
	}, opts...)
	p, err := producer.NewDefaultProducer(opts...)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Shutdown() })
	return p
}

// Position is where the broker stored a message.
type Position struct {
	Broker string // the broker's name
	Queue  int
	Offset int64
}

// Send sends msgs synchronously, consecutive messages for one queue (or
// without one chosen) in one batch of at most 64 messages and 256 KiB, and
// returns where each was stored.
func Send(t testing.TB, p Sender, msgs ...*primitive.Message) []Position {
	t.Helper()
	ctx := testenv.Context(t, 2*time.Minute)
	out := make([]Position, 0, len(msgs))
	for len(msgs) > 0 {
		n := BatchLen(msgs)
		res, err := p.SendSync(ctx, msgs[:n]...)
		if err != nil || res.Status != primitive.SendOK {
			t.Fatalf("send to %s: %v (%v)", msgs[0].Topic, err, res)
		}
		// The messages of a batch get consecutive offsets from the first.
		for i := range n {
			out = append(out, Position{Broker: res.MessageQueue.BrokerName, Queue: res.MessageQueue.QueueId, Offset: res.QueueOffset + int64(i)})
		}
		msgs = msgs[n:]
	}
	return out
}

// BatchLen returns how many of msgs, from the first, Send sends in one
// batch: consecutive messages for one queue (or without one chosen), at most
// 64 and 256 KiB.
func BatchLen(msgs []*primitive.Message) int {
	n, size := 1, len(msgs[0].Body)
	for n < len(msgs) && n < 64 && size+len(msgs[n].Body) <= 256<<10 && sameQueue(msgs[0], msgs[n]) {
		size += len(msgs[n].Body)
		n++
	}
	return n
}

func sameQueue(a, b *primitive.Message) bool {
	if a.Queue == nil || b.Queue == nil {
		return a.Queue == b.Queue
	}
	return *a.Queue == *b.Queue
}

// ReadTopic consumes topic from the start with a fresh group, acking every
// message at once, until it has seen n messages, and returns them.
func ReadTopic(t testing.TB, b *Broker, topic string, n int) []*consumer.Message {
	t.Helper()
	src, err := rocketmq.New(rocketmq.Config{NameServers: b.NameServers, Group: testenv.Name(t, "reader"),
		Topics: []string{topic}, Logger: testenv.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var got []*consumer.Message
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- src.Run(ctx, func(ctx context.Context, m *consumer.Message) error {
			mu.Lock()
			got = append(got, m)
			mu.Unlock()
			go src.Ack(ctx, []*consumer.Message{m})
			return nil
		})
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("reading %s: %v", topic, err)
		}
	}()
	testenv.WaitUntilProgress(t, 2*time.Minute, fmt.Sprintf("%d messages read from %s", n, topic), func() (bool, string) {
		select {
		case err := <-done:
			done <- err
			return false, fmt.Sprintf("the reader stopped: %v", err)
		default:
		}
		mu.Lock()
		defer mu.Unlock()
		return len(got) >= n, fmt.Sprintf("%d read", len(got))
	})
	mu.Lock()
	defer mu.Unlock()
	return append([]*consumer.Message(nil), got...)
}

// Open waits until a broker has registered with namesrv (a private one
// may still be booting), connects to it, and closes the connection when
// the test ends.
func Open(t testing.TB, namesrv []string) *Broker {
	t.Helper()
	var b *Broker
	testenv.WaitUntilProgress(t, 2*time.Minute, "a broker registered with "+namesrv[0], func() (bool, string) {
		var err error
		b, err = Connect(namesrv)
		return err == nil, fmt.Sprint(err)
	})
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// ReadAll reads every message topic holds (Count) with ReadTopic.
func (b *Broker) ReadAll(t testing.TB, topic string) []*consumer.Message {
	t.Helper()
	n, err := b.Count(topic)
	if err != nil {
		t.Fatalf("count %s: %v", topic, err)
	}
	return ReadTopic(t, b, topic, int(n))
}
