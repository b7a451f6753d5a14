package otelconsumer_test

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/consumer/otelconsumer"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/memstore"
)

type nopSink struct{}

func (nopSink) Retry(context.Context, consumer.RetryLetter) error { return nil }

// TestObserveParkedKeys: a KeyOrdered consumer over a store that parks
// keys exports idem.consumer.parked.keys and .oldest_age from the store's
// ParkStats; one without KeyOrdered exports neither.
func TestObserveParkedKeys(t *testing.T) {
	for _, keyOrdered := range []bool{true, false} {
		s := newSDK(t)
		tel, err := otelconsumer.New(otelconsumer.Config{MeterProvider: s.mp})
		if err != nil {
			t.Fatal(err)
		}
		store := memstore.New(memstore.Config{})
		ctx := context.Background()
		parkedAt := time.Now().Add(-time.Minute)
		for _, key := range []string{"acct-a", "acct-b"} {
			ref := dedup.ParkRef{ParkKey: dedup.ParkKey{Scope: "payments", Topic: "pay", Key: key}, ID: "pay/0/1"}
			if err := store.Park(ctx, ref, time.Second, parkedAt); err != nil {
				t.Fatal(err)
			}
		}
		c, err := consumer.New(consumer.Config[*memstore.Tx]{
			Name: "payments", Source: consumertest.NewSource(consumertest.Script{}), Store: store,
			DeadLetter: &consumertest.DeadLetters{}, Key: consumer.ByJSONField("txn_id"), Logger: quiet,
			Handler: consumer.HandlerFunc[*memstore.Tx](func(context.Context, *memstore.Tx, *consumer.Message) error { return nil }),
			Retries: consumer.NonBlocking{Delays: []time.Duration{time.Second}, Sink: nopSink{}, KeyOrdered: keyOrdered},
		})
		if err != nil {
			t.Fatal(err)
		}
		reg, err := tel.Observe(c, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		ms := s.metrics(t)
		_ = reg.Unregister()
		keys, kok := ms["idem.consumer.parked.keys"].Data.(metricdata.Gauge[int64])
		age, aok := ms["idem.consumer.parked.oldest_age"].Data.(metricdata.Gauge[float64])
		if !keyOrdered {
			if (kok && len(keys.DataPoints) > 0) || (aok && len(age.DataPoints) > 0) {
				t.Errorf("without KeyOrdered: parked gauges %+v, %+v; want none", keys, age)
			}
			continue
		}
		if !kok || len(keys.DataPoints) != 1 || keys.DataPoints[0].Value != 2 {
			t.Errorf("idem.consumer.parked.keys: %+v, want one point of 2", ms["idem.consumer.parked.keys"].Data)
		}
		if !aok || len(age.DataPoints) != 1 || age.DataPoints[0].Value < 59 || age.DataPoints[0].Value > 120 {
			t.Errorf("idem.consumer.parked.oldest_age: %+v, want one point of about 60 s", ms["idem.consumer.parked.oldest_age"].Data)
		}
	}
}
