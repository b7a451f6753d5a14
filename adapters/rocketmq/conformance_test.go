package rocketmq_test

import (
	"cmp"
	"slices"
	"testing"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"

	"github.com/idemkit/idem/adapters/rocketmq"
	"github.com/idemkit/idem/consumer"
	idemsource "github.com/idemkit/idem/consumer/source"
	"github.com/idemkit/idem/consumer/sourcetest"
	"github.com/idemkit/idem/internal/testenv/rmqtest"
)

// TestConformance runs consumer/sourcetest against the real broker, in
// concurrent mode: a released message comes back through the group's retry
// topic while the Source runs. Not declared: OrderedLanes (calls of one
// queue run at once), FencedAcks (RocketMQ does not fence offset commits:
// a member that lost a queue in a rebalance may still commit it, see the
// package doc).
func TestConformance(t *testing.T) {
	t.Parallel()
	// Not DrainCommits: the client updates a queue's offset after the consume
	// call returned and persists it asynchronously; its shutdown can miss the
	// last ones (seen once under load), and those messages come again.
	sourcetest.Run(t, sourcetest.Features{RedeliversReleased: true, DeadLetters: true}, conformanceTopic(false))
}

// TestOrderlyConformance runs it in orderly mode: a queue's messages in
// order, one call at a time; a released call is handed over again.
func TestOrderlyConformance(t *testing.T) {
	t.Parallel()
	sourcetest.Run(t, sourcetest.Features{OrderedLanes: true, RedeliversReleased: true, DeadLetters: true}, conformanceTopic(true))
}

// conformanceTopic is the suite's factory: a topic of 4 queues, its
// dead-letter topic and the group's retry topic, and Sources of one group.
func conformanceTopic(orderly bool) sourcetest.Factory {
	return func(t *testing.T) sourcetest.Topic {
		const queues = 4
		b := rmqtest.Shared(t)
		topic, group := name(t, "t"), name(t, "g")
		b.CreateTopic(t, topic, queues)
		b.CreateTopic(t, topic+"_DLQ", 1)
		// The broker creates the retry topic when the group shows up, and a
		// client that started before finds its route only at its next route
		// refresh: create it first.
		b.CreateTopic(t, "%RETRY%"+group, 1)
		p := b.NewProducer(t, producer.WithQueueSelector(producer.NewManualQueueSelector()))
		produced := 0
		return sourcetest.Topic{
			Name: topic,
			Produce: func(t *testing.T, msgs []sourcetest.Message) {
				out := make([]*primitive.Message, len(msgs))
				for i, m := range msgs {
					pm := primitive.NewMessage(topic, m.Value)
					pm.WithKeys([]string{string(m.Key)})
					for _, h := range m.Headers {
						pm.WithProperty(h.Key, string(h.Value))
					}
					pm.Queue = &primitive.MessageQueue{Topic: topic, BrokerName: b.Name, QueueId: produced % queues}
					out[i] = pm
					produced++
				}
				// One send per queue; each queue's messages in order.
				slices.SortStableFunc(out, func(x, y *primitive.Message) int { return cmp.Compare(x.Queue.QueueId, y.Queue.QueueId) })
				rmqtest.Send(t, p, out...)
			},
			NewSource: func(t *testing.T, sc sourcetest.SourceConfig) idemsource.Source {
				return source(t, rocketmq.Config{Group: group, Topics: []string{topic}, Orderly: orderly,
					RetryDelayLevel: 1, DeadLetterMaxBytes: sc.DeadLetterMaxBytes})
			},
			DeadLetters: func(t *testing.T, n int) []*consumer.Message {
				return rmqtest.ReadTopic(t, b, topic+"_DLQ", n)
			},
		}
	}
}
