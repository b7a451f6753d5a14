package otelconsumer_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/consumer/otelconsumer"
	"github.com/idemkit/idem/internal/testenv/enginebench"
)

// BenchmarkTelemetry is consumer's BenchmarkEngine (lanes, batches, claim on
// the in-memory store, handler, ack) four ways in one run: without an
// Observer; with a Telemetry on otel's global providers and no SDK
// installed (the no-op case); with the SDK's metrics and no tracer; and
// with the SDK recording every metric and sampling every span (exported
// nowhere, so the cost is the recording).
func BenchmarkTelemetry(b *testing.B) {
	for _, batch := range []int{1, 100} {
		for _, mode := range []string{"none", "noop", "metrics", "sdk"} {
			b.Run(fmt.Sprintf("batch=%d/telemetry=%s", batch, mode), func(b *testing.B) {
				enginebench.Run(b, batch, benchObserver(b, mode))
			})
		}
	}
}

// BenchmarkObserverCalls is what one batch costs the Observer alone — the
// calls the engine makes for a batch of n new messages in one transaction —
// without the engine around it, whose own cost and noise hide it in
// BenchmarkTelemetry: consumer.NopObserver (what an unset Config.Observer
// is), a Telemetry with no SDK installed, with the SDK's metrics only, and
// with metrics and every span.
func BenchmarkObserverCalls(b *testing.B) {
	for _, n := range []int{1, 100} {
		msgs := make([]*consumer.Message, n)
		for i := range msgs {
			msgs[i] = consumertest.Message("payments", 0, int64(i), "", "{}")
			msgs[i].DeliveredAt = time.Now()
		}
		for _, mode := range []string{"none", "noop", "metrics", "sdk"} {
			b.Run(fmt.Sprintf("batch=%d/telemetry=%s", n, mode), func(b *testing.B) {
				obs := benchObserver(b, mode)
				ctx := context.Background()
				batch := consumer.Batch{Consumer: "payments", Lane: "payments/0", Messages: msgs}
				now := time.Now()
				tx := consumer.TxEvent{Messages: n, Start: now, ClaimStart: now, ClaimEnd: now, CommitStart: now, End: now}
				b.ReportAllocs()
				for b.Loop() {
					bctx := obs.BatchStart(ctx, batch)
					tctx := obs.TxStart(bctx, n)
					obs.TxEnd(tctx, tx)
					for _, m := range msgs {
						obs.Settled(bctx, consumer.Settlement{Message: m, Outcome: consumer.OutcomeApplied})
					}
					end := batch
					end.Acked = msgs
					obs.BatchEnd(bctx, end)
				}
			})
		}
	}
}

// benchObserver is the Observer of a benchmark mode: none (what an unset
// Config.Observer is), noop (a Telemetry with no SDK installed), metrics
// (the SDK's metrics only) or sdk (metrics and every span sampled).
func benchObserver(b *testing.B, mode string) consumer.Observer {
	b.Helper()
	var cfg otelconsumer.Config
	switch mode {
	case "none":
		return consumer.NopObserver{}
	case "noop":
		cfg = otelconsumer.Config{System: "kafka"}
	case "metrics", "sdk":
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
		b.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
		cfg = otelconsumer.Config{System: "kafka", MeterProvider: mp}
		if mode == "sdk" {
			tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()))
			b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
			cfg.TracerProvider = tp
		}
	default:
		b.Fatalf("unknown telemetry mode %q", mode)
	}
	tel, err := otelconsumer.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	return tel
}
