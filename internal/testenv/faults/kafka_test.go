package faults_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/idemkit/idem/consumer/wire"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/internal/testenv/kafkatest"
)

// kafkaBroker is the test environment's Kafka, for one test.
type kafkaBroker struct {
	*kafkatest.Admin
	label string // name(); default "kafka"
}

// newKafka returns the shared Kafka; exclusive keeps every other test of
// every package off the broker while this one kills it.
func newKafka(t *testing.T, exclusive bool) *kafkaBroker {
	t.Helper()
	var brokers []string
	if exclusive {
		brokers = testenv.KafkaExclusive(t)
	} else {
		brokers = testenv.KafkaBrokers(t)
	}
	return &kafkaBroker{Admin: kafkatest.NewAdmin(t, brokers)}
}

func (k *kafkaBroker) name() string {
	if k.label != "" {
		return k.label
	}
	return "kafka"
}

func (k *kafkaBroker) addrs() []string { return k.Brokers }

func (k *kafkaBroker) newTopic(t *testing.T, n int) (string, string) {
	t.Helper()
	topic, group := testenv.Name(t, "t"), testenv.Name(t, "g")
	k.CreateTopic(t, topic, n)
	k.CreateTopic(t, topic+".dlq", n)
	return topic, group
}

func (k *kafkaBroker) produce(t *testing.T, topic string, msgs []outMsg) {
	t.Helper()
	k.Produce(t, topic, kafkaMessages(msgs)...)
}

// kafkaMessages are msgs as Kafka records: the ID as key (or in idHeader),
// the tenant in tenantHeader.
func kafkaMessages(msgs []outMsg) []kafkago.Message {
	km := make([]kafkago.Message, len(msgs))
	for i, m := range msgs {
		km[i] = kafkago.Message{Partition: m.Part, Key: []byte(m.ID), Value: m.Value}
		if m.Tenant != "" {
			km[i].Headers = []kafkago.Header{{Key: tenantHeader, Value: []byte(m.Tenant)}}
		}
		if m.Key != "" {
			km[i].Key = []byte(m.Key)
			km[i].Headers = append(km[i].Headers, kafkago.Header{Key: idHeader, Value: []byte(m.ID)})
		}
	}
	return km
}

func (k *kafkaBroker) waitNoLag(t *testing.T, topic, group string) { k.WaitNoLag(t, group, topic) }

func (k *kafkaBroker) deadLetters(t *testing.T, topic string, want int) []letter {
	t.Helper()
	var letters []letter
	testenv.WaitUntilProgress(t, 2*time.Minute, fmt.Sprintf("%d dead letters", want), func() (bool, string) {
		letters = letters[:0]
		seen := map[string]bool{}
		for _, m := range k.ReadAll(t, topic+".dlq") {
			h := func(key string) string { return kafkatest.Header(m, key) }
			letters = append(letters, letter{ID: idOf(m), Reason: h(wire.MetaReason),
				Attempts: h(wire.MetaAttempts), Key: h(wire.MetaKey), Scope: h(wire.MetaKeyScope)})
			seen[idOf(m)] = true
		}
		return len(seen) >= want, fmt.Sprintf("%d distinct", len(seen))
	})
	return letters
}

func (k *kafkaBroker) offsets(ctx context.Context, topic, group string) (map[int]int64, error) {
	return k.Offsets(group, topic)(ctx)
}

func (k *kafkaBroker) positions(t *testing.T, topic string) map[string]pos {
	t.Helper()
	out := map[string]pos{}
	for _, m := range k.ReadAll(t, topic) {
		out[idOf(m)] = pos{Part: m.Partition, Off: m.Offset}
	}
	return out
}

// idHeader carries a message's ID when its record key is not the ID.
const idHeader = "faults-id"

// idOf returns the ID of a message the rig produced (or its dead letter).
func idOf(m kafkago.Message) string {
	if id := kafkatest.Header(m, idHeader); id != "" {
		return id
	}
	return string(m.Key)
}
