package main

import (
	"context"
	"strings"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/idemkit/idem/consumer"
)

// TestRedriveRefusesAnEmptyLetterRedrivenTooOften: a letter without a
// value (a tombstone) redriven --max-redrives times already is refused,
// like any other letter, and nothing is sent.
func TestRedriveRefusesAnEmptyLetterRedrivenTooOften(t *testing.T) {
	p := newPayments(t)
	if code, _, _ := idem(t, "", p.envs, "migrate"); code != exitOK {
		t.Fatalf("migrate: exit %d", code)
	}
	w := &kafkago.Writer{Addr: kafkago.TCP(p.brokers...), Topic: p.dlq, RequiredAcks: kafkago.RequireAll, BatchTimeout: time.Millisecond, Transport: p.tr}
	defer w.Close()
	h := func(k, v string) kafkago.Header { return kafkago.Header{Key: k, Value: []byte(v)} }
	if err := w.WriteMessages(context.Background(), kafkago.Message{Key: []byte("T09"), Headers: []kafkago.Header{
		h(consumer.MetaTopic, p.topic), h(consumer.MetaPartition, "0"), h(consumer.MetaOffset, "7"),
		h(consumer.MetaMessageID, p.topic+"/0/7"), h(consumer.MetaKeyScope, "pay"), h(consumer.MetaKey, "T09"),
		h(consumer.MetaRedriveCount, "3")}}); err != nil {
		t.Fatal(err)
	}
	topicEnd := p.end(p.topic)
	code, out, _ := idem(t, "", p.envs, "redrive", "--topic", p.dlq, "--max-redrives", "3", "--json")
	rd := decode[redriveJSON](t, out)
	if code != exitPartial || len(rd.Letters) != 1 || rd.Letters[0].Action != "refused" || !strings.Contains(rd.Letters[0].Reason, "--max-redrives") {
		t.Errorf("redrive of an empty letter redriven 3 times, --max-redrives 3: exit %d, %+v", code, rd)
	}
	if end := p.end(p.topic); end != topicEnd {
		t.Errorf("the refused letter was sent (%d messages)", end-topicEnd)
	}
}
