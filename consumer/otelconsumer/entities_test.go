package otelconsumer_test

import (
	"context"
	"fmt"
	"testing"

	"go.opentelemetry.io/otel/attribute"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/consumer/otelconsumer"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/memstore"
)

// TestStaleEventsCounted: events of one entity arrive newest first; the
// stale ones skipped count in idem.consumer.stale as in Stats.Stale, and
// with StaleDeadLetter in idem.consumer.dead_letters of cause stale.
func TestStaleEventsCounted(t *testing.T) {
	for name, policy := range map[string]consumer.StalePolicy{"skip": consumer.StaleSkip, "deadletter": consumer.StaleDeadLetter} {
		t.Run(name, func(t *testing.T) {
			s := newSDK(t)
			tel, err := otelconsumer.New(otelconsumer.Config{System: "kafka", Group: "ledger", MeterProvider: s.mp, TracerProvider: s.tp})
			if err != nil {
				t.Fatal(err)
			}
			var msgs []*consumer.Message
			for i := range 10 {
				msgs = append(msgs, consumertest.Message("pay", 0, int64(i), "", payment(10-i))) // amounts 110 down to 101
			}
			res := consumertest.Run(t, consumer.Config[*memstore.Tx]{
				Name: "payments", Store: memstore.New(memstore.Config{}), Logger: quiet,
				Handler: consumer.HandlerFunc[*memstore.Tx](func(context.Context, *memstore.Tx, *consumer.Message) error { return nil }),
				Key:     consumer.ByJSONField("txn_id"),
				Entity: func(m *consumer.Message) (consumer.Entity, error) {
					var v int64
					a, err := consumer.ByJSONField("amount")(m)
					if err == nil {
						_, err = fmt.Sscan(a, &v)
					}
					return consumer.Entity{Name: "account", Version: dedup.Version{Major: v}}, err
				},
				Stale:    policy,
				Observer: tel, DeadLetter: tel.DeadLetter(&consumertest.DeadLetters{}),
			}, consumertest.Script{}, msgs...)
			st := res.Stats
			ms := s.metrics(t)
			if got := total(t, ms, "idem.consumer.applied"); got != st.Applied {
				t.Errorf("idem.consumer.applied = %d, Stats say %d", got, st.Applied)
			}
			var stale int64
			if policy == consumer.StaleDeadLetter {
				stale = total(t, ms, "idem.consumer.dead_letters", attribute.String("idem.dead_letter.cause", "stale"))
			}
			if policy == consumer.StaleSkip {
				stale = total(t, ms, "idem.consumer.stale")
				if stale != st.Stale {
					t.Errorf("idem.consumer.stale = %d, Stats say %d", stale, st.Stale)
				}
			}
			if st.Applied != 1 || stale != 9 {
				t.Errorf("applied %d, stale counted %d; want 1 and 9 (%+v)", st.Applied, stale, st)
			}
		})
	}
}
