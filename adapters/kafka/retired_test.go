package kafka_test

import (
	"context"
	"errors"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/idemkit/idem/adapters/kafka"
	"github.com/idemkit/idem/consumer"
)

// TestKafkaAnotherGroupIsNotRefusedForRetryCopies: retry topics are named
// for the topic (<topic>.retry.<delay>), not the group, and belong to the
// group that writes them. Another group reading the topic — an audit
// service, or a new group of this one — with Blocking retries never read
// them and never will: Run must not refuse it with ErrRetiredRetryTopic
// for the first group's copies, even once that group has read them all.
// (The check counts a retry partition the group has no offset for from
// the log's start, so such a group is refused until the broker's retention
// deletes every copy.)
func TestKafkaAnotherGroupIsNotRefusedForRetryCopies(t *testing.T) {
	brokers, a, topic, group := retryTest(t, 1, []time.Duration{time.Second})
	retryTopic := kafka.RetryTopic(topic, time.Second)
	a.Produce(t, retryTopic, kafkago.Message{Key: []byte("a"), Value: []byte("{}")}, kafkago.Message{Key: []byte("b"), Value: []byte("{}")})
	commitOffset(t, brokers, group, retryTopic, 0, 2) // the group that wrote them read them
	deliver := func(context.Context, *consumer.Message) error { return nil }
	scfg := sourceConfig(t, brokers, topic, group+"-audit") // Blocking: no RetryDelays
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if err := newSource(t, scfg).Run(ctx, deliver); errors.Is(err, kafka.ErrRetiredRetryTopic) {
		t.Fatalf("another group of topic %s refused for group %s's retry copies: %v", topic, group, err)
	}
}
