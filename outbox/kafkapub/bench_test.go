package kafkapub_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	kafkago "github.com/segmentio/kafka-go"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/internal/testenv/relaytest"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/outbox/kafkapub"
)

// benchValue is a 256-byte order.paid event.
var benchValue = []byte(fmt.Sprintf(`{"type":"order.paid","order_id":"O-000000","txn_id":"4200000000000000","sku":"sku-000","amount":12999,"pad":"%0159d"}`, 0))

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
			msgs[i] = kafkago.Message{Topic: topic, Key: []byte(fmt.Sprintf("O-%06d", i%1000)), Value: benchValue, Headers: headers(i)}
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
			fill(b, pool, ob, topic, b.N)
			var pubs []outbox.Publisher
			for range relays {
				pub, err := kafkapub.New(kafkapub.Config{Brokers: k.Brokers})
				if err != nil {
					b.Fatal(err)
				}
				defer pub.Close()
				pubs = append(pubs, pub)
			}
			runRelays(b, ob, pubs)
		})
	}
}

// fill enqueues n messages in transactions of 500, outside the timer.
func fill(b *testing.B, pool interface {
	Begin(context.Context) (pgx.Tx, error)
}, ob *outbox.Outbox, topic string, n int) {
	b.Helper()
	ctx := context.Background()
	for i := 0; i < n; i += 500 {
		var msgs []outbox.Message
		for j := i; j < min(i+500, n); j++ {
			msgs = append(msgs, outbox.Message{Topic: topic, Key: []byte(fmt.Sprintf("O-%06d", j%1000)), Value: benchValue})
		}
		tx, err := pool.Begin(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if err := ob.EnqueueFor(ctx, tx, dedup.Key{Scope: "payments", ID: fmt.Sprint(i)}, msgs...); err != nil {
			b.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// runRelays times relays, one per publisher, draining the outbox together.
func runRelays(b *testing.B, ob *outbox.Outbox, pubs []outbox.Publisher) {
	b.Helper()
	var relays []*outbox.Relay
	for _, pub := range pubs {
		relay, err := outbox.NewRelay(outbox.RelayConfig{Outbox: ob, Publisher: pub, BatchSize: 500, PollInterval: time.Millisecond, Logger: testenv.Logger(b)})
		if err != nil {
			b.Fatal(err)
		}
		relays = append(relays, relay)
	}
	// A failed publish (a leader not elected yet on a new topic) is retried
	// by the relay, and counted.
	published := func() (n, rounds, failed int64) {
		for _, r := range relays {
			st := r.Stats()
			n, rounds, failed = n+st.Published, rounds+st.Rounds, failed+st.Failed
		}
		return n, rounds, failed
	}
	done := make(chan error, len(relays))
	stop := func() {
		for _, r := range relays {
			if err := r.Stop(context.Background()); err != nil {
				b.Error(err)
			}
			if err := <-done; err != nil {
				b.Error(err)
			}
		}
	}
	b.ResetTimer()
	for _, r := range relays {
		go func() { done <- r.Run(context.Background()) }()
	}
	for n, _, _ := published(); n < int64(b.N); n, _, _ = published() {
		if b.Elapsed() > 5*time.Minute {
			stop()
			b.Fatalf("%d of %d published after 5 minutes", n, b.N)
		}
		time.Sleep(time.Millisecond)
	}
	b.StopTimer()
	stop()
	n, rounds, failed := published()
	if n != int64(b.N) {
		b.Fatalf("published %d of %d", n, b.N)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
	b.ReportMetric(float64(n)/float64(rounds), "msgs/round")
	b.ReportMetric(float64(failed), "failed")
}
