package consumer_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/dedup/memstore"
)

func TestDuplicatesReordersAndCrashesApplyOnce(t *testing.T) {
	eff := newEffects()
	cfg := baseConfig(eff.apply)
	cfg.BatchSize = 16
	var msgs []*consumer.Message
	var keys []string
	for i := range 1000 {
		msgs = append(msgs, consumertest.Message("pay", int32(i%4), int64(i), "", payment(i)))
		keys = append(keys, fmt.Sprintf("T%05d", i))
	}
	res := consumertest.Run(t, cfg, consumertest.Script{
		MinDeliveries: 3, MaxDeliveries: 5, ReorderWindow: 20, CrashAfterCommitEvery: 7,
	}, msgs...)
	t.Log(res)
	eff.check(t, keys)
	if res.Stats.Applied != 1000 {
		t.Errorf("applied %d, want 1000", res.Stats.Applied)
	}
	if res.Stats.Duplicates != int64(res.Source.Deliveries)-1000 {
		t.Errorf("duplicates %d, want deliveries-1000 = %d", res.Stats.Duplicates, res.Source.Deliveries-1000)
	}
	if res.Source.Crashes == 0 || res.Source.Deliveries < 3000 {
		t.Errorf("the script did not misbehave enough: %+v", res.Source)
	}
	if len(res.DeadLetters) != 0 {
		t.Errorf("%d dead letters, want 0", len(res.DeadLetters))
	}
}

func TestTenantsAreSeparateScopes(t *testing.T) {
	eff := newEffects()
	cfg := baseConfig(func(ctx context.Context, tx *memstore.Tx, m *consumer.Message) error {
		id, _ := consumer.ByJSONField("txn_id")(m)
		eff.add(tx, m.Topic+":"+id)
		return nil
	})
	cfg.Tenant = func(m *consumer.Message) (string, error) { return m.Topic, nil }
	res := consumertest.Run(t, cfg, consumertest.Script{MinDeliveries: 2, MaxDeliveries: 2},
		consumertest.Message("tenant-a", 0, 0, "", payment(1)),
		consumertest.Message("tenant-b", 0, 0, "", payment(1)))
	eff.check(t, []string{"tenant-a:T00001", "tenant-b:T00001"})
	if res.Stats.Duplicates != 2 {
		t.Errorf("duplicates %d, want 2", res.Stats.Duplicates)
	}
}

func TestConfigErrorsNameTheField(t *testing.T) {
	_, err := consumer.New(consumer.Config[*memstore.Tx]{Name: "a/b", BatchSize: -1, Retry: consumer.RetryPolicy{Jitter: 2}})
	if err == nil {
		t.Fatal("New accepted an invalid config")
	}
	for _, want := range []string{"Config.Name", "Config.Source is nil", "Config.Store is nil", "Config.Handler is nil", "Config.DeadLetter is nil", "Config.Key is nil: choose", "Config.BatchSize", "Config.Retry.Jitter"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not mention %q:\n%v", want, err)
		}
	}
	_, err = consumer.New(consumer.Config[*memstore.Tx]{Name: strings.Repeat("n", 65)})
	if err == nil || !strings.Contains(err.Error(), "Config.Name is 65 bytes") {
		t.Errorf("long name: %v", err)
	}
}
