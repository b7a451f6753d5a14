package kafka_test

import (
	"fmt"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/idemkit/idem/adapters/kafka"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/source"
	"github.com/idemkit/idem/consumer/sourcetest"
	"github.com/idemkit/idem/internal/testenv"
)

// features is what the Kafka source declares to consumer/sourcetest: a
// partition's messages in offset order, acks fenced by generation, and the
// Source as the dead-letter sink. A released message comes back only after
// a restart or rebalance (the partition resumes at it).
var features = sourcetest.Features{OrderedLanes: true, FencedAcks: true, DeadLetters: true, DrainCommits: true}

// TestConformance runs consumer/sourcetest against the real broker.
func TestConformance(t *testing.T) {
	sourcetest.Run(t, features, func(t *testing.T) sourcetest.Topic {
		brokers := testenv.KafkaBrokers(t)
		return conformanceTopic(t, newAdmin(t, brokers), func(topic, group string) kafka.Config {
			return realSourceConfig(t, brokers, topic, group)
		})
	})
}

// TestFakeConformance runs consumer/sourcetest against kfake.
func TestFakeConformance(t *testing.T) {
	sourcetest.Run(t, features, func(t *testing.T) sourcetest.Topic {
		_, brokers := fake(t)
		return conformanceTopic(t, newAdmin(t, brokers), func(topic, group string) kafka.Config {
			return sourceConfig(t, brokers, topic, group)
		})
	})
}

// conformanceTopic is the suite's factory: a topic of 4 partitions, its
// dead-letter topic, and Sources of one group configured by cfg.
func conformanceTopic(t *testing.T, a *admin, cfg func(topic, group string) kafka.Config) sourcetest.Topic {
	const partitions = 4
	topic, group := name(t, "t"), name(t, "g")
	a.CreateTopic(t, topic, partitions)
	a.CreateTopic(t, topic+".dlq", partitions)
	produced := 0
	return sourcetest.Topic{
		Name: topic,
		Produce: func(t *testing.T, msgs []sourcetest.Message) {
			km := make([]kafkago.Message, len(msgs))
			for i, m := range msgs {
				km[i] = kafkago.Message{Partition: produced % partitions, Key: m.Key, Value: m.Value}
				for _, h := range m.Headers {
					km[i].Headers = append(km[i].Headers, kafkago.Header{Key: h.Key, Value: h.Value})
				}
				produced++
			}
			a.Produce(t, topic, km...)
		},
		NewSource: func(t *testing.T, sc sourcetest.SourceConfig) source.Source {
			c := cfg(topic, group)
			c.DeadLetterMaxBytes = sc.DeadLetterMaxBytes
			return newSource(t, c)
		},
		DeadLetters: func(t *testing.T, n int) []*consumer.Message {
			var letters []kafkago.Message
			testenv.WaitUntilProgress(t, time.Minute, fmt.Sprintf("%d letters in %s.dlq", n, topic), func() (bool, string) {
				letters = a.ReadAll(t, topic+".dlq")
				return len(letters) >= n, fmt.Sprintf("%d letters", len(letters))
			})
			out := make([]*consumer.Message, len(letters))
			for i, l := range letters {
				out[i] = &consumer.Message{Topic: l.Topic, Key: l.Key, Value: l.Value}
				for _, h := range l.Headers {
					out[i].Headers = append(out[i].Headers, consumer.Header{Key: h.Key, Value: h.Value})
				}
			}
			return out
		},
	}
}
