// Package enginebench is the engine's benchmark on the in-memory store,
// which consumer's BenchmarkEngine and otelconsumer's BenchmarkTelemetry
// (the same run with an Observer) share.
package enginebench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/dedup/memstore"
)

// Run runs b.N messages through the whole engine on the in-memory store:
// lanes, batches of batch, claim, a handler that does nothing, ack. No
// database: this is the framework's own cost per message. obs observes the
// run; nil is none (consumer.Config's default).
func Run(b *testing.B, batch int, obs consumer.Observer) {
	b.Helper()
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
		Observer:  obs,
		Logger:    slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	b.ReportAllocs()
	b.ResetTimer()
	res := consumertest.Run(b, cfg, consumertest.Script{}, msgs...)
	if res.Stats.Applied != int64(b.N) {
		b.Fatalf("applied %d of %d", res.Stats.Applied, b.N)
	}
}
