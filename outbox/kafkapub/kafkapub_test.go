package kafkapub_test

import (
	"crypto/rand"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/internal/testenv/kafkatest"
	"github.com/idemkit/idem/internal/testenv/relaytest"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/outbox/kafkapub"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func newPublisher(t *testing.T, cfg kafkapub.Config) *kafkapub.Publisher {
	t.Helper()
	p, err := kafkapub.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// read returns topic's messages as CheckKeyOrder and CheckPublishedOnce want them.
func read(t *testing.T, k *relaytest.Kafka, topic string, parts int) []relaytest.Delivered {
	var out []relaytest.Delivered
	for _, m := range k.ReadAll(t, topic) {
		out = append(out, relaytest.Delivered{ID: kafkatest.Header(m, outbox.HeaderID), Key: string(m.Key), Value: string(m.Value),
			Partition: int32(m.Partition), Header: func(name string) string { return kafkatest.Header(m, name) }})
	}
	return out
}

// TestRelayToKafka: what producers enqueue reaches the topic once (no
// fault, no copy), each key on one partition in order, with the identity
// and lineage headers.
func TestRelayToKafka(t *testing.T) {
	k := relaytest.NewKafka(t, testenv.KafkaBrokers(t))
	topic := testenv.Name(t, "t")
	k.CreateTopic(t, topic, 4, nil)
	ob, pool, _ := relaytest.NewOutbox(t)
	relay := relaytest.StartRelay(t, outbox.RelayConfig{Outbox: ob, Publisher: newPublisher(t, kafkapub.Config{Brokers: k.Brokers}), BatchSize: 200})
	want := relaytest.Enqueue(t, pool, ob, 40, 25, topic)
	testenv.WaitUntilProgress(t, 5*time.Minute, "the outbox drained", func() (bool, string) {
		n := relaytest.Pending(t, pool, ob)
		return n == 0, strconv.Itoa(n) + " pending"
	})
	// Failed rounds are allowed (a new topic's leader not known yet for a
	// moment): the relay retries; nothing may be dead-lettered or repeated.
	relaytest.CheckPublishedOnce(t, relay, read(t, k, topic, 4), want)
}

// TestRefusalsAreDeadLettered: the broker refuses a message over the
// topic's max.message.bytes — sent in a batch with others of its key, which
// are then sent one by one so that only it is refused; kafkapub refuses one
// over MaxMessageBytes and one to a topic name Kafka cannot have. All three
// land in the dead-letter table with the reason; the others are published,
// in order.
func TestRefusalsAreDeadLettered(t *testing.T) {
	k := relaytest.NewKafka(t, testenv.KafkaBrokers(t))
	topic := testenv.Name(t, "t")
	k.CreateTopic(t, topic, 2, map[string]string{"max.message.bytes": "16384"})
	ob, pool, _ := relaytest.NewOutbox(t)
	big := make([]byte, 50<<10)
	huge := make([]byte, 3<<20)
	rand.Read(big)
	rand.Read(huge)
	ctx := testenv.Context(t, time.Minute)
	msgs := []outbox.Message{
		{Topic: topic, Key: []byte("k"), Value: []byte("k 0")},
		{Topic: topic, Key: []byte("k"), Value: big},
		{Topic: topic, Key: []byte("k"), Value: []byte("k 1")},
		{Topic: topic, Key: []byte("k"), Value: huge},
		{Topic: "bad|name", Key: []byte("k"), Value: []byte("x")},
		{Topic: topic, Key: []byte("k"), Value: []byte("k 2")},
	}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return ob.EnqueueFor(ctx, tx, dedup.Key{Scope: "s", ID: "1"}, msgs...)
	}); err != nil {
		t.Fatal(err)
	}
	relay := relaytest.StartRelay(t, outbox.RelayConfig{Outbox: ob, Publisher: newPublisher(t, kafkapub.Config{Brokers: k.Brokers})})
	testenv.WaitUntilProgress(t, 5*time.Minute, "the outbox drained", func() (bool, string) { return relaytest.Pending(t, pool, ob) == 0, "" })
	relaytest.CheckKeyOrder(t, read(t, k, topic, 2), 3)
	relaytest.CheckRefusals(t, relay, pool, ob, 3,
		relaytest.Refusal{Value: big, Says: "Message Size Too Large"},
		relaytest.Refusal{Value: huge, Says: "the limit is 1048576"},
		relaytest.Refusal{Value: []byte("x"), Says: "Kafka topic names"})
}

// TestMissingTopicWaits: messages to a topic that does not exist wait —
// retried with backoff, never dead-lettered — and are published once it
// is created, while the other shards' messages go on.
func TestMissingTopicWaits(t *testing.T) {
	k := relaytest.NewKafka(t, testenv.KafkaBrokers(t))
	missing, present := testenv.Name(t, "later"), testenv.Name(t, "now")
	k.CreateTopic(t, present, 1, nil)
	ob, pool, _ := relaytest.NewOutbox(t)
	ctx := testenv.Context(t, time.Minute)
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return ob.EnqueueFor(ctx, tx, dedup.Key{Scope: "s", ID: "1"},
			outbox.Message{Topic: missing, Key: []byte("k"), Value: []byte("k 0")}, outbox.Message{Topic: missing, Key: []byte("k"), Value: []byte("k 1")})
	}); err != nil {
		t.Fatal(err)
	}
	relay := relaytest.StartRelay(t, outbox.RelayConfig{Outbox: ob, Publisher: newPublisher(t, kafkapub.Config{Brokers: k.Brokers})})
	testenv.WaitUntilProgress(t, time.Minute, "the relay tried and failed three times", func() (bool, string) {
		return relay.Stats().Failed >= 6, ""
	})
	want := relaytest.Enqueue(t, pool, ob, 30, 2, present)
	// The present topic's messages in the missing one's shard wait out its
	// backoff, then go.
	testenv.WaitUntilProgress(t, time.Minute, "all but the missing topic's messages published", func() (bool, string) {
		n := relaytest.Pending(t, pool, ob)
		return n == 2, strconv.Itoa(n) + " pending"
	})
	if d := relaytest.DeadLetters(t, pool, ob); len(d) != 0 {
		t.Fatalf("dead letters %v: the missing topic's messages must wait", d)
	}
	k.CreateTopic(t, missing, 1, nil)
	testenv.WaitUntilProgress(t, time.Minute, "the outbox drained", func() (bool, string) { return relaytest.Pending(t, pool, ob) == 0, "" })
	relaytest.CheckKeyOrder(t, read(t, k, missing, 1), 2)
	relaytest.CheckKeyOrder(t, read(t, k, present, 1), want)
}
