package kafka

import (
	"context"
	"errors"
	"testing"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/wire"
	"github.com/idemkit/idem/dedup"
)

func TestLetter(t *testing.T) {
	s, err := New(Config{Brokers: []string{"h:1"}, Topics: []string{"orders"}, Group: "g", DeadLetterMaxBytes: 8})
	if err != nil {
		t.Fatal(err)
	}
	p := testPartition(kafkago.FirstOffset)
	m := deliverN(p, 42)[0]
	m.Headers = append(m.Headers, consumer.Header{Key: wire.MetaReason, Value: []byte("stale reason of an earlier dead letter")})
	m.Value = []byte("a value longer than eight bytes")
	l := consumer.Letter{Message: m, Key: dedup.Key{Scope: "ledger", ID: "K1"}, Reason: errors.New("bad\ninput"), Attempts: 3}
	km := s.letter(l)
	if km.Topic != "orders.dlq" || km.Partition != 3 || string(km.Key) != "k" || km.Value != nil {
		t.Fatalf("letter to %s/%d, key %q, value %q", km.Topic, km.Partition, km.Key, km.Value)
	}
	headers, _ := wire.Letter(l).Record(8)
	if len(km.Headers) != len(headers) {
		t.Fatalf("%d headers, Letter.Record has %d: %v", len(km.Headers), len(headers), km.Headers)
	}
	for i, h := range headers {
		if km.Headers[i].Key != h.Key || string(km.Headers[i].Value) != string(h.Value) {
			t.Errorf("header %d: %s=%q, want %s=%q", i, km.Headers[i].Key, km.Headers[i].Value, h.Key, h.Value)
		}
	}
	if v, _ := m.Header("h"); km.Headers[0].Key != "h" || string(v) != "x" {
		t.Errorf("the original header comes first: %v", km.Headers)
	}
	reasons := 0
	for _, h := range km.Headers {
		if h.Key == wire.MetaReason {
			reasons++
			if string(h.Value) != "bad input" {
				t.Errorf("reason %q", h.Value)
			}
		}
	}
	if reasons != 1 {
		t.Errorf("%d reason headers, want the new one only", reasons)
	}

	s.cfg.DeadLetterTopic = "letters"
	if km := s.letter(l); km.Topic != "letters" {
		t.Errorf("letter to %s, want Config.DeadLetterTopic", km.Topic)
	}
}

func TestDeadLetterOutsideRun(t *testing.T) {
	s, err := New(Config{Brokers: []string{"h:1"}, Topics: []string{"orders"}, Group: "g"})
	if err != nil {
		t.Fatal(err)
	}
	m := deliverN(testPartition(kafkago.FirstOffset), 1)[0]
	if err := s.DeadLetter(context.Background(), consumer.Letter{Message: m}); !errors.Is(err, ErrNotRunning) {
		t.Fatalf("DeadLetter outside Run: %v, want ErrNotRunning", err)
	}
}
