package consumer_test

import (
	"fmt"
	"testing"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/internal/testenv/enginebench"
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
// store: lanes, batching, claim, handler, ack (enginebench.Run). No
// database: this is the framework's own cost per message.
func BenchmarkEngine(b *testing.B) {
	for _, batch := range []int{1, 100} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) { enginebench.Run(b, batch, nil) })
	}
}
