package kafka

import (
	"context"
	"testing"
	"time"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/wire"
)

func retryCopy(due time.Time) *consumer.Message {
	return &consumer.Message{Headers: []consumer.Header{{Key: wire.MetaRetryDue, Value: []byte(due.UTC().Format(time.RFC3339Nano))}}}
}

// The fetcher of a retry partition waits for the head record to be due,
// and gives up the wait when its context ends (the generation, Run).
func TestWaitDue(t *testing.T) {
	s, p := &Source{}, &partition{}
	due := time.Now().Add(50 * time.Millisecond)
	if !s.waitDue(context.Background(), p, retryCopy(due)) || time.Now().Before(due) {
		t.Error("waitDue returned before the copy was due")
	}
	if !s.waitDue(context.Background(), p, retryCopy(time.Now().Add(-time.Hour))) {
		t.Error("a copy past due waited")
	}
	if !s.waitDue(context.Background(), p, &consumer.Message{}) {
		t.Error("a record without a due time waited")
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan bool)
	go func() { done <- s.waitDue(ctx, p, retryCopy(time.Now().Add(time.Hour))) }()
	cancel()
	if <-done {
		t.Error("waitDue reported due after its context ended")
	}
}

// The letter of a message read from a retry topic goes to its original
// topic's dead-letter topic: "<topic>.dlq", never "<topic>.retry.10s.dlq",
// which nobody creates.
func TestRetryCopyLetterGoesToItsTopicsDLQ(t *testing.T) {
	s, err := New(Config{Brokers: []string{"h:1"}, Topics: []string{"pay"}, Group: "g",
		RetryDelays: []time.Duration{10 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []*consumer.Message{
		{Topic: "pay", Partition: 1, Offset: 7},
		{Topic: RetryTopic("pay", 10*time.Second), Partition: 1, Offset: 3},
	} {
		if got := s.letter(consumer.Letter{Message: m, Cause: consumer.CauseExhausted}).Topic; got != "pay.dlq" {
			t.Errorf("the letter of %s/%d/%d goes to %q, want pay.dlq", m.Topic, m.Partition, m.Offset, got)
		}
	}
}
