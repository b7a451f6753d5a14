package kafka

import (
	"context"
	"testing"
	"time"

	"github.com/idemkit/idem/consumer"
)

func retryCopy(due time.Time) *consumer.Message {
	return &consumer.Message{Headers: []consumer.Header{{Key: consumer.MetaRetryDue, Value: []byte(due.UTC().Format(time.RFC3339Nano))}}}
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
