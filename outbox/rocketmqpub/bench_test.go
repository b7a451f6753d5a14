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
			m := primitive.NewMessage(topic, relaytest.BenchValue)
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
		relaytest.Fill(b, pool, ob, topic, b.N)
		pub, err := rocketmqpub.New(rocketmqpub.Config{NameServers: r.NameServers})
		if err != nil {
			b.Fatal(err)
		}
		defer pub.Close()
		relaytest.RunRelays(b, ob, []outbox.Publisher{pub})
	})
}
