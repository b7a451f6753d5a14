package rocketmqpub_test

import (
	"crypto/rand"
	"log/slog"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/internal/testenv/relaytest"
	"github.com/idemkit/idem/internal/testenv/rmqtest"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/outbox/rocketmqpub"
)

func TestMain(m *testing.M) { rmqtest.Main(m, slog.New(slog.DiscardHandler), slog.LevelError) }

func newPublisher(t *testing.T, cfg rocketmqpub.Config) *rocketmqpub.Publisher {
	t.Helper()
	p, err := rocketmqpub.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// read returns topic's messages in queue order, as CheckKeyOrder wants them.
func read(t *testing.T, r *rmqtest.Broker, topic string) []*consumer.Message {
	got := r.ReadAll(t, topic)
	sort.Slice(got, func(i, j int) bool {
		a, b := got[i], got[j]
		return a.Partition < b.Partition || a.Partition == b.Partition && a.Offset < b.Offset
	})
	return got
}

// delivered lays ms out as CheckKeyOrder and CheckPublishedOnce want them.
func delivered(ms []*consumer.Message) []relaytest.Delivered {
	var out []relaytest.Delivered
	for _, m := range ms {
		id, _ := m.Header(outbox.HeaderID)
		out = append(out, relaytest.Delivered{ID: string(id), Key: string(m.Key), Value: string(m.Value),
			Partition: m.Partition, Header: func(name string) string { v, _ := m.Header(name); return string(v) }})
	}
	return out
}

// TestRelayToRocketMQ: what producers enqueue reaches the topic once, each
// key on one queue in order, with the identity and lineage as user
// properties.
func TestRelayToRocketMQ(t *testing.T) {
	r := rmqtest.Open(t, testenv.RocketMQNamesrv(t))
	topic := testenv.Name(t, "t")
	r.CreateTopic(t, topic, 4)
	ob, pool, _ := relaytest.NewOutbox(t)
	relay := relaytest.StartRelay(t, outbox.RelayConfig{Outbox: ob, Publisher: newPublisher(t, rocketmqpub.Config{NameServers: r.NameServers}), BatchSize: 100})
	want := relaytest.Enqueue(t, pool, ob, 30, 10, topic)
	testenv.WaitUntilProgress(t, 5*time.Minute, "the outbox drained", func() (bool, string) {
		n := relaytest.Pending(t, pool, ob)
		return n == 0, strconv.Itoa(n) + " pending"
	})
	// Failed rounds are allowed: right after the topic is created the name
	// server may not route it yet ("route info not found"), and the relay
	// retries those shards — what a relay is for (seen once under load).
	relaytest.CheckPublishedOnce(t, relay, delivered(read(t, r, topic)), want)
}

// TestRefusalsAreDeadLettered: the broker refuses a body over its
// maxMessageSize (4 MiB here; the publisher's own limit raised above it);
// the publisher refuses a body over its limit, a topic name RocketMQ cannot
// have and a header by a system property's name. All four land in the
// dead-letter table with the reason; the others are published, in order.
func TestRefusalsAreDeadLettered(t *testing.T) {
	r := rmqtest.Open(t, testenv.RocketMQNamesrv(t))
	topic := testenv.Name(t, "t")
	r.CreateTopic(t, topic, 2)
	ob, pool, _ := relaytest.NewOutbox(t)
	big, huge := make([]byte, 5<<20), make([]byte, 9<<20)
	rand.Read(big)
	rand.Read(huge)
	ctx := testenv.Context(t, time.Minute)
	k := []byte("k")
	msgs := []outbox.Message{
		{Topic: topic, Key: k, Value: []byte("k 0")},
		{Topic: topic, Key: k, Value: big},
		{Topic: topic, Key: k, Value: []byte("k 1")},
		{Topic: topic, Key: k, Value: huge},
		{Topic: "order.paid", Key: k, Value: []byte("x")},
		{Topic: topic, Key: k, Value: []byte("y"), Headers: []consumer.Header{{Key: "TAGS", Value: []byte("paid")}}},
		{Topic: topic, Key: k, Value: []byte("k 2")},
	}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return ob.EnqueueFor(ctx, tx, dedup.Key{Scope: "s", ID: "1"}, msgs...)
	}); err != nil {
		t.Fatal(err)
	}
	relay := relaytest.StartRelay(t, outbox.RelayConfig{Outbox: ob,
		Publisher: newPublisher(t, rocketmqpub.Config{NameServers: r.NameServers, MaxBodyBytes: 8 << 20, SendTimeout: 30 * time.Second})})
	// Generous: a 5 MiB send to a broker on a loaded machine can time out
	// (transient, retried) several times before the broker refuses it.
	testenv.WaitUntilProgress(t, 5*time.Minute, "the outbox drained", func() (bool, string) { return relaytest.Pending(t, pool, ob) == 0, "" })
	relaytest.CheckKeyOrder(t, delivered(read(t, r, topic)), 3)
	relaytest.CheckRefusals(t, relay, pool, ob, 3,
		relaytest.Refusal{Value: big, Says: "CODE: 13"},
		relaytest.Refusal{Value: huge, Says: "the limit is 8388608"},
		relaytest.Refusal{Value: []byte("x"), Says: "RocketMQ topic names"},
		relaytest.Refusal{Value: []byte("y"), Says: "system property"})
}
