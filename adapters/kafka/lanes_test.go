package kafka_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/dedup/memstore"
	"github.com/idemkit/idem/internal/testenv"
)

// TestLanesReportAStalledPartition: a partition whose messages wait with
// none settled shows in Health (StalledLanes) while the other partition,
// idle and fetched from, does not; once it moves again neither does.
func TestLanesReportAStalledPartition(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	a := newAdmin(t, brokers)
	topic, group := name(t, "t"), name(t, "g")
	a.CreateTopic(t, topic, 2)
	a.Produce(t, topic,
		kafkago.Message{Partition: 0, Value: []byte("stuck")},
		kafkago.Message{Partition: 0, Value: []byte("after")},
		kafkago.Message{Partition: 1, Value: []byte("other")})
	src := newSource(t, sourceConfig(t, brokers, topic, group))
	unblock := make(chan struct{})
	applied := newEffects()
	c, err := consumer.New(consumer.Config[*memstore.Tx]{
		Name: "lanes", Source: src, DeadLetter: src, Store: memstore.New(memstore.Config{}),
		Key: consumer.ByMessageID(), Logger: testLogger(t), BatchSize: 1,
		Handler: consumer.HandlerFunc[*memstore.Tx](func(ctx context.Context, _ *memstore.Tx, m *consumer.Message) error {
			if string(m.Value) == "stuck" {
				select {
				case <-unblock:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			applied.add(string(m.Value))
			return nil
		}),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()

	const stall = 2 * time.Second
	stalled := func() []string {
		return c.Health(testenv.Context(t, 10*time.Second)).StalledLanes(time.Now(), stall)
	}
	testenv.WaitUntilProgress(t, time.Minute, "partition 0 reported stalled, and only it", func() (bool, string) {
		s := stalled()
		_, total := applied.counts()
		return len(s) == 1 && strings.HasPrefix(s[0], topic+"/0: ") && strings.Contains(s[0], "waiting") && total == 1,
			fmt.Sprintf("stalled %q, %d applied", s, total)
	})
	close(unblock)
	testenv.WaitUntilProgress(t, time.Minute, "all applied and nothing stalled", func() (bool, string) {
		s := stalled()
		_, total := applied.counts()
		return len(s) == 0 && total == 3, fmt.Sprintf("stalled %q, %d applied", s, total)
	})
	h := c.Health(testenv.Context(t, 10*time.Second))
	if len(h.Lanes) != 2 {
		t.Errorf("lanes %+v, want the topic's two partitions", h.Lanes)
	}
	sctx, scancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer scancel()
	if err := c.Stop(sctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
