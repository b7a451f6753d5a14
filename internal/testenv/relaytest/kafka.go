package relaytest

import (
	"testing"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/idemkit/idem/internal/testenv/kafkatest"
)

// Kafka is the test environment's Kafka admin (kafkatest), for topic setup
// and reading topics back.
type Kafka struct{ *kafkatest.Admin }

// NewKafka returns a client on brokers, closed when the test ends.
func NewKafka(t testing.TB, brokers []string) *Kafka { return &Kafka{kafkatest.NewAdmin(t, brokers)} }

// CloseIdle drops the client's connections (after a broker restart).
func (k *Kafka) CloseIdle() { k.Transport.CloseIdleConnections() }

// CreateTopic creates topic with partitions and the given topic configs,
// waits until every partition has a leader, and deletes it when the test
// ends.
func (k *Kafka) CreateTopic(t testing.TB, topic string, partitions int, configs map[string]string) {
	t.Helper()
	var entries []kafkago.ConfigEntry
	for name, v := range configs {
		entries = append(entries, kafkago.ConfigEntry{ConfigName: name, ConfigValue: v})
	}
	k.CreateTopicWith(t, topic, partitions, entries)
}
