package twohop_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/adapters/kafka"
	"github.com/idemkit/idem/adapters/rocketmq"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/consumer/source"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/internal/testenv/kafkatest"
	"github.com/idemkit/idem/internal/testenv/relaytest"
	"github.com/idemkit/idem/internal/testenv/rmqtest"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/outbox/kafkapub"
	"github.com/idemkit/idem/outbox/rocketmqpub"
)

// parts is the partitions (queues) of the order.paid topic.
const parts = 4

// broker is what a scenario needs of Kafka or RocketMQ.
type broker interface {
	name() string
	addrs() []string
	// newTopic creates the order.paid topic, deleted when the test ends.
	newTopic(t *testing.T) string
	// publisher is the relay's publisher (kafkapub, rocketmqpub).
	publisher(t testing.TB) outbox.Publisher
	// source is the shipping consumer's source over topic: the adapters'
	// Source as it is.
	source(t testing.TB, topic string) source.Source
	// copies counts the messages of topic by outbox identity.
	copies(t *testing.T, topic string) map[string]int
}

// newBroker returns the test environment's broker (Kafka under the shared
// lock), skipping (failing under CI) when it is not set up.
func newBroker(t *testing.T, name string) broker {
	switch name {
	case "kafka":
		return &kafkaBroker{k: relaytest.NewKafka(t, testenv.KafkaBrokers(t))}
	default:
		return &rocketBroker{r: rmqtest.Open(t, testenv.RocketMQNamesrv(t))}
	}
}

var brokers = []string{"kafka", "rocketmq"}

type kafkaBroker struct{ k *relaytest.Kafka }

func (b *kafkaBroker) name() string    { return "kafka" }
func (b *kafkaBroker) addrs() []string { return b.k.Brokers }

func (b *kafkaBroker) newTopic(t *testing.T) string {
	topic := testenv.Name(t, "order.paid")
	b.k.CreateTopic(t, topic, parts, nil)
	return topic
}

func (b *kafkaBroker) publisher(t testing.TB) outbox.Publisher {
	p, err := newPublisher("kafka", b.addrs())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// newPublisher is the relay's publisher for the tests and the relay child.
func newPublisher(broker string, addrs []string) (interface {
	outbox.Publisher
	Close() error
}, error) {
	if broker == "kafka" {
		return kafkapub.New(kafkapub.Config{Brokers: addrs, WriteTimeout: 3 * time.Second, DialTimeout: 3 * time.Second})
	}
	return rocketmqpub.New(rocketmqpub.Config{NameServers: addrs, SendTimeout: 3 * time.Second})
}

func (b *kafkaBroker) source(t testing.TB, topic string) source.Source {
	src, err := kafka.New(kafka.Config{Brokers: b.addrs(), Topics: []string{topic}, Group: testenv.Name(t, "shipping"),
		MaxWait: 100 * time.Millisecond, RequestTimeout: 3 * time.Second, ReconnectBackoff: 500 * time.Millisecond,
		SessionTimeout: 6 * time.Second, HeartbeatInterval: 500 * time.Millisecond, CloseTimeout: 3 * time.Second,
		Logger: testenv.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	return src
}

func (b *kafkaBroker) copies(t *testing.T, topic string) map[string]int {
	out := map[string]int{}
	for _, m := range b.k.ReadAll(t, topic) {
		out[kafkatest.Header(m, outbox.HeaderID)]++
	}
	return out
}

type rocketBroker struct{ r *rmqtest.Broker }

func (b *rocketBroker) name() string    { return "rocketmq" }
func (b *rocketBroker) addrs() []string { return b.r.NameServers }

func (b *rocketBroker) newTopic(t *testing.T) string {
	topic := testenv.Name(t, "order_paid") // RocketMQ names have no dots
	b.r.CreateTopic(t, topic, parts)
	return topic
}

func (b *rocketBroker) publisher(t testing.TB) outbox.Publisher {
	p, err := newPublisher("rocketmq", b.addrs())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func (b *rocketBroker) source(t testing.TB, topic string) source.Source {
	group := testenv.Name(t, "shipping")
	// The broker creates the retry topic when the group shows up; a
	// client started before finds its route only at its next refresh.
	b.r.CreateTopic(t, "%RETRY%"+group, 1)
	src, err := rocketmq.New(rocketmq.Config{NameServers: b.addrs(), Group: group, Topics: []string{topic},
		CloseTimeout: 5 * time.Second, Logger: testenv.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	return src
}

func (b *rocketBroker) copies(t *testing.T, topic string) map[string]int {
	out := map[string]int{}
	for _, m := range b.r.ReadAll(t, topic) {
		id, _ := m.Header(outbox.HeaderID)
		out[string(id)]++
	}
	return out
}

// shipping runs the second hop's consumer in this process until stop.
type shipping struct {
	c    *consumer.Consumer[pgx.Tx]
	dl   *consumertest.DeadLetters
	done chan error
	once sync.Once
}

func startShipping(t *testing.T, w *world, src source.Source) *shipping {
	t.Helper()
	cfg := w.shippingConfig(t)
	s := &shipping{dl: &consumertest.DeadLetters{}, done: make(chan error, 1)}
	cfg.Source, cfg.DeadLetter = src, s.dl
	c, err := consumer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s.c = c
	go func() { s.done <- c.Run(context.Background()) }()
	t.Cleanup(func() { s.stop(t) })
	return s
}

func (s *shipping) stop(t *testing.T) {
	s.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := s.c.Stop(ctx); err != nil {
			t.Errorf("shipping Stop: %v", err)
		}
		if err := <-s.done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("shipping Run: %v", err)
		}
	})
}

// waitShipped waits until shipping has settled as many deliveries as the
// topic holds copies (each is applied once or skipped as a duplicate).
func (s *shipping) waitShipped(t *testing.T, w *world, b broker, topic string) map[string]int {
	t.Helper()
	want := int64(len(w.stream.Expected))
	var copies map[string]int
	testenv.WaitUntilProgress(t, 3*time.Minute, "shipping consumed every copy", func() (bool, string) {
		st := s.c.Stats()
		if st.Applied < want {
			return false, fmt.Sprintf("applied %d of %d", st.Applied, want)
		}
		copies = b.copies(t, topic)
		total := 0
		for _, n := range copies {
			total += n
		}
		return st.Applied+st.Duplicates >= int64(total), fmt.Sprintf("stats %+v, %d copies on the topic", st, total)
	})
	if letters := s.dl.Letters(); len(letters) != 0 {
		t.Fatalf("shipping dead-lettered %d events, first: %v", len(letters), letters[0].Reason)
	}
	return copies
}

// check reconciles both hops and what shipping skipped: every copy beyond
// the first of an event was a duplicate to it.
func check(t *testing.T, w *world, s *shipping, copies map[string]int) (republished int) {
	t.Helper()
	s.stop(t)
	for _, n := range copies {
		republished += n - 1
	}
	if st := s.c.Stats(); st.Applied != int64(len(w.stream.Expected)) || st.Duplicates < int64(republished) {
		t.Errorf("shipping %+v: want %d applied and at least %d duplicates (the republished copies)", st, len(w.stream.Expected), republished)
	}
	if len(copies) != len(w.stream.Expected) {
		t.Errorf("%d distinct events on the topic, want %d", len(copies), len(w.stream.Expected))
	}
	r := w.reconcile(t)
	t.Logf("%v; %d republished copies skipped", r, republished)
	if !r.OK() || r.Shipped != int64(len(w.stream.Expected)) {
		t.Fatalf("%v", r)
	}
	return republished
}
