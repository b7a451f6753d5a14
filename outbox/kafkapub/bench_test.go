package kafkapub_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/internal/testenv/relaytest"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/outbox/kafkapub"
)

// BenchmarkPublish: the same messages (256-byte values, 1,000 keys, the
// four outbox headers) to a topic of 8 partitions, acknowledged by all
// in-sync replicas — by a kafka-go Writer in batches of 500 (producer), and
// from the outbox table through a relay with batches of 500 (relay: read,
// publish with kafkapub, delete, commit). ns/op is per message.
//
//	go test -run '^$' -bench Publish -benchtime 50000x ./outbox/kafkapub/
func BenchmarkPublish(b *testing.B) {
	k := relaytest.NewKafka(b, testenv.KafkaBrokers(b))
	headers := func(i int) []kafkago.Header {
		id := outbox.MessageID(dedup.Key{Scope: "payments", ID: fmt.Sprint(i)}, 0)
		return []kafkago.Header{{Key: outbox.HeaderID, Value: []byte(id)}, {Key: outbox.HeaderScope, Value: []byte("payments")},
			{Key: outbox.HeaderKey, Value: []byte(fmt.Sprint(i))}, {Key: outbox.HeaderPosition, Value: []byte("0")}}
	}
	b.Run("producer", func(b *testing.B) {
		topic := testenv.Name(b, "bench")
		k.CreateTopic(b, topic, 8, nil)
		msgs := make([]kafkago.Message, b.N)
		for i := range msgs {
			msgs[i] = kafkago.Message{Topic: topic, Key: []byte(fmt.Sprintf("O-%06d", i%1000)), Value: relaytest.BenchValue, Headers: headers(i)}
		}
		tr := &kafkago.Transport{}
		w := &kafkago.Writer{Addr: kafkago.TCP(k.Brokers...), Balancer: &kafkago.Murmur2Balancer{}, RequiredAcks: kafkago.RequireAll,
			BatchSize: 500, BatchTimeout: time.Millisecond, Transport: tr}
		defer tr.CloseIdleConnections()
		defer w.Close()
		ctx := context.Background()
		b.ResetTimer()
		for i := 0; i < len(msgs); i += 500 {
			if err := w.WriteMessages(ctx, msgs[i:min(i+500, len(msgs))]...); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
	})
	for _, relays := range []int{1, 2} {
		b.Run(fmt.Sprintf("relays=%d", relays), func(b *testing.B) {
			topic := testenv.Name(b, "bench")
			k.CreateTopic(b, topic, 8, nil)
			ob, pool, _ := relaytest.NewOutbox(b)
			relaytest.Fill(b, pool, ob, topic, b.N)
			var pubs []outbox.Publisher
			for range relays {
				pub, err := kafkapub.New(kafkapub.Config{Brokers: k.Brokers})
				if err != nil {
					b.Fatal(err)
				}
				defer pub.Close()
				pubs = append(pubs, pub)
			}
			relaytest.RunRelays(b, ob, pubs)
		})
	}
}
