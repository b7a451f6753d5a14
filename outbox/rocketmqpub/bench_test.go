package rocketmqpub_test

import (
	"context"
	"fmt"
	"hash/fnv"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/internal/testenv/relaytest"
	"github.com/idemkit/idem/internal/testenv/rmqtest"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/outbox/rocketmqpub"
)

// benchValue is a 256-byte order.paid event.
var benchValue = []byte(fmt.Sprintf(`{"type":"order.paid","order_id":"O-000000","txn_id":"4200000000000000","sku":"sku-000","amount":12999,"pad":"%0159d"}`, 0))

// BenchmarkPublish: the same messages (256-byte values, 1,000 keys, the
// four outbox headers) to a topic of 8 queues, one SendSync each — by the
// client's producer from 32 goroutines, a key always on the same one
// (producer), and from the outbox table through a relay with batches of
// 500 and rocketmqpub's default parallelism of 32 keys (relay). ns/op is
// per message.
//
//	go test -run '^$' -bench Publish -benchtime 20000x ./outbox/rocketmqpub/
func BenchmarkPublish(b *testing.B) {
	r := rmqtest.Open(b, testenv.RocketMQNamesrv(b))
	b.Run("producer", func(b *testing.B) {
		topic := testenv.Name(b, "bench")
		r.CreateTopic(b, topic, 8)
		p, err := producer.NewDefaultProducer(producer.WithNsResolver(primitive.NewPassthroughResolver(r.NameServers)),
			producer.WithGroupName("idem_bench"), producer.WithInstanceName(fmt.Sprintf("idem_bench_%d", os.Getpid())),
			producer.WithQueueSelector(producer.NewHashQueueSelector()), producer.WithRetry(1), producer.WithSendMsgTimeout(10*time.Second))
		if err == nil {
			err = p.Start()
		}
		if err != nil {
			b.Fatal(err)
		}
		defer p.Shutdown()
		lanes := make([][]*primitive.Message, 32)
		for i := 0; i < b.N; i++ {
			key := fmt.Sprintf("O-%06d", i%1000)
			m := primitive.NewMessage(topic, benchValue)
			m.WithKeys([]string{key})
			m.WithShardingKey(key)
			m.WithProperty(outbox.HeaderID, outbox.MessageID(dedup.Key{Scope: "payments", ID: fmt.Sprint(i)}, 0))
			m.WithProperty(outbox.HeaderScope, "payments")
			m.WithProperty(outbox.HeaderKey, fmt.Sprint(i))
			m.WithProperty(outbox.HeaderPosition, "0")
			h := fnv.New32a()
			h.Write([]byte(key))
			lanes[h.Sum32()%32] = append(lanes[h.Sum32()%32], m)
		}
		ctx := context.Background()
		b.ResetTimer()
		var wg sync.WaitGroup
		for _, lane := range lanes {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for _, m := range lane {
					if res, err := p.SendSync(ctx, m); err != nil || res.Status != primitive.SendOK {
						b.Errorf("send: %v %v", err, res)
						return
					}
				}
			}()
		}
		wg.Wait()
		b.StopTimer()
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
	})
	b.Run("relay", func(b *testing.B) {
		topic := testenv.Name(b, "bench")
		r.CreateTopic(b, topic, 8)
		ob, pool, _ := relaytest.NewOutbox(b)
		ctx := context.Background()
		for i := 0; i < b.N; i += 500 {
			var msgs []outbox.Message
			for j := i; j < min(i+500, b.N); j++ {
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
		pub, err := rocketmqpub.New(rocketmqpub.Config{NameServers: r.NameServers})
		if err != nil {
			b.Fatal(err)
		}
		defer pub.Close()
		relay, err := outbox.NewRelay(outbox.RelayConfig{Outbox: ob, Publisher: pub, BatchSize: 500, PollInterval: time.Millisecond, Logger: testenv.Logger(b)})
		if err != nil {
			b.Fatal(err)
		}
		done := make(chan error, 1)
		b.ResetTimer()
		go func() { done <- relay.Run(ctx) }()
		stop := func() {
			if err := relay.Stop(ctx); err != nil {
				b.Error(err)
			}
			if err := <-done; err != nil {
				b.Error(err)
			}
		}
		for relay.Stats().Published < int64(b.N) {
			if b.Elapsed() > 5*time.Minute {
				stop()
				b.Fatalf("stats %+v after 5 minutes", relay.Stats())
			}
			time.Sleep(time.Millisecond)
		}
		b.StopTimer()
		stop()
		// A failed publish is retried by the relay, and counted.
		st := relay.Stats()
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
		b.ReportMetric(float64(st.Published)/float64(st.Rounds), "msgs/round")
		b.ReportMetric(float64(st.Failed), "failed")
	})
}
