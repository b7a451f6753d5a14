package consumer_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/memstore"
)

// BenchmarkKeyAndFingerprint is the client-side work per message before the
// claim: the business key from a JSON field, its validation and the payload
// fingerprint over canonical JSON.
func BenchmarkKeyAndFingerprint(b *testing.B) {
	m := consumertest.Message("payments", 0, 1, "",
		`{"txn_id":"4200000123202611301234567890","order_id":"O-778812","channel":"wechat","amount":12999,"currency":"CNY","status":"SUCCESS","paid_at":"2026-11-30T12:00:00Z"}`)
	key := consumer.ByJSONField("txn_id")
	b.ReportAllocs()
	for b.Loop() {
		id, err := key(m)
		if err != nil {
			b.Fatal(err)
		}
		if err := (dedup.Key{Scope: "payments", ID: id}).Validate(); err != nil {
			b.Fatal(err)
		}
		_ = dedup.FingerprintOf(m.Value)
	}
}

// BenchmarkEngine runs messages through the whole engine on the in-memory
// store: lanes, batching, claim, handler, ack. No database: this is the
// framework's own cost per message.
func BenchmarkEngine(b *testing.B) {
	for _, batch := range []int{1, 100} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			msgs := make([]*consumer.Message, b.N)
			for i := range msgs {
				msgs[i] = consumertest.Message("payments", int32(i%4), int64(i), "", fmt.Sprintf(`{"txn_id":"T%09d","amount":%d}`, i, i))
			}
			cfg := consumer.Config[*memstore.Tx]{
				Name:      "payments",
				Store:     memstore.New(memstore.Config{}),
				Handler:   consumer.HandlerFunc[*memstore.Tx](func(context.Context, *memstore.Tx, *consumer.Message) error { return nil }),
				Key:       consumer.ByJSONField("txn_id"),
				BatchSize: batch,
				Logger:    quiet,
			}
			b.ReportAllocs()
			b.ResetTimer()
			res := consumertest.Run(b, cfg, consumertest.Script{}, msgs...)
			if res.Stats.Applied != int64(b.N) {
				b.Fatalf("applied %d of %d", res.Stats.Applied, b.N)
			}
		})
	}
}
