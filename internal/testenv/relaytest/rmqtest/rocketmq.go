package rmqtest

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/admin"
	"github.com/apache/rocketmq-client-go/v2/primitive"

	"github.com/idemkit/idem/adapters/rocketmq"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/internal/testenv/relaytest"
	trmq "github.com/idemkit/idem/internal/testenv/rmqtest"
)

// RocketMQ is a name server and its (single) broker, for topic setup and
// reading topics back.
type RocketMQ struct {
	NameServers []string
	Broker      string // the broker's address
	BrokerName  string
	admin       admin.Admin
}

// NewRocketMQ connects to the broker behind namesrv; closed when the test
// ends.
func NewRocketMQ(t testing.TB, namesrv []string) *RocketMQ {
	t.Helper()
	var addr, name string
	relaytest.WaitFor(t, 2*time.Minute, "a broker registered with "+namesrv[0], func() (bool, string) {
		var err error
		addr, name, err = trmq.ClusterBroker(namesrv[0])
		return err == nil, fmt.Sprint(err)
	})
	adm, err := admin.NewAdmin(admin.WithResolver(primitive.NewPassthroughResolver(namesrv)))
	if err != nil {
		t.Fatalf("rocketmq admin: %v", err)
	}
	t.Cleanup(func() { _ = adm.Close() })
	return &RocketMQ{NameServers: namesrv, Broker: addr, BrokerName: name, admin: adm}
}

// CreateTopic creates topic with queues read and write queues, waits until
// the name server routes it, and deletes it when the test ends.
func (r *RocketMQ) CreateTopic(t testing.TB, topic string, queues int) {
	t.Helper()
	ctx := relaytest.Ctx(t, time.Minute)
	err := r.admin.CreateTopic(ctx, admin.WithTopicCreate(topic), admin.WithBrokerAddrCreate(r.Broker),
		admin.WithReadQueueNums(queues), admin.WithWriteQueueNums(queues))
	if err != nil {
		t.Fatalf("create topic %s: %v", topic, err)
	}
	relaytest.WaitFor(t, time.Minute, "route of topic "+topic, func() (bool, string) {
		mqs, err := r.admin.FetchPublishMessageQueues(ctx, topic)
		return err == nil && len(mqs) == queues, fmt.Sprint(err)
	})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = r.admin.DeleteTopic(ctx, admin.WithTopicDelete(topic), admin.WithBrokerAddrDelete(r.Broker),
			admin.WithNameSrvAddr(r.NameServers))
	})
}

// Count returns how many messages topic's queues hold.
func (r *RocketMQ) Count(topic string, queues int) (int64, error) {
	b := &trmq.Broker{Addr: r.Broker, Name: r.BrokerName} // its offset requests
	var n int64
	for q := range queues {
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

// Read consumes topic from the start with a fresh group (adapters/rocketmq,
// concurrent mode) until it has every message Count counts, and returns
// them.
func (r *RocketMQ) Read(t testing.TB, topic string, queues int) []*consumer.Message {
	t.Helper()
	n, err := r.Count(topic, queues)
	if err != nil {
		t.Fatalf("count %s: %v", topic, err)
	}
	src, err := rocketmq.New(rocketmq.Config{NameServers: r.NameServers, Group: relaytest.Name(t, "reader"), Topics: []string{topic},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
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
			go func() { _ = src.Ack(ctx, []*consumer.Message{m}) }()
			return nil
		})
	}()
	defer func() {
		cancel()
		<-done
	}()
	relaytest.WaitFor(t, 2*time.Minute, fmt.Sprintf("%d messages read from %s", n, topic), func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		return int64(len(got)) >= n, fmt.Sprintf("%d read", len(got))
	})
	mu.Lock()
	defer mu.Unlock()
	return append([]*consumer.Message(nil), got...)
}
