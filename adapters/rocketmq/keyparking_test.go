package rocketmq_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"
	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/adapters/rocketmq"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/internal/testenv/retrytest"
	"github.com/idemkit/idem/internal/testenv/rmqtest"
)

// parkInStore: set false to watch TestNonBlockingKeyOrderedAcrossARestart
// fail with the parked keys in the consumer's memory (a store that keeps
// none).
var parkInStore = true

// noParking hides a store's dedup.Parking: KeyOrdered then parks keys in
// the consumer's memory.
type noParking struct{ dedup.Store[pgx.Tx] }

// TestNonBlockingKeyOrderedAcrossARestart: orderly mode, 10 record keys of
// 5 payments each over 2 queues; the second payment of 2 keys fails for
// good in the first consumer, which parks the keys: the failing payments
// go to retry (1s, then 20s), their keys' 3 later ones follow. The first
// consumer is stopped once they all went to the 20s trip, and 2 more
// payments of every key are sent. A new consumer — a fresh process's
// state, the same store and group — gets them long before the copies are
// due: the parked keys' new payments must follow the copies, and every
// key's payments are applied once each, in production order. With the keys
// parked in memory (parkInStore false) the new consumer applies the new
// payments first.
func TestNonBlockingKeyOrderedAcrossARestart(t *testing.T) {
	t.Parallel()
	const queues, perKey, more = 2, 5, 2
	delays := []time.Duration{time.Second, 20 * time.Second}
	topic := name(t, "t")
	mqs := rmqtest.Shared(t).CreateTopic(t, topic, queues)
	rmqtest.Shared(t).CreateTopic(t, rocketmq.RetryTopic(topic), queues)
	rmqtest.Shared(t).CreateTopic(t, topic+"_DLQ", queues)
	p := rmqtest.Shared(t).NewProducer(t, producer.WithQueueSelector(producer.NewManualQueueSelector()))
	var keys []string
	failingKeys := map[string]bool{}
	for k := range 10 {
		keys = append(keys, fmt.Sprintf("k%02d", k))
		if k%5 == 3 {
			failingKeys[keys[k]] = true
		}
	}
	send := func(from, n int) {
		var msgs []*primitive.Message
		for s := from; s < from+n; s++ {
			for k, key := range keys {
				m := primitive.NewMessage(topic, fmt.Appendf(nil, `{"txn_id":"%s-%d","amount":%d}`, key, s, s+1))
				m.WithKeys([]string{key})
				m.Queue = mqs[k%queues]
				msgs = append(msgs, m)
			}
		}
		rmqtest.Send(t, p, msgs...)
	}
	send(0, perKey)

	d := newDB(t)
	var store dedup.Store[pgx.Tx] = d.store
	if !parkInStore {
		store = noParking{d.store}
	}
	group := name(t, "g")
	effect := insertEffect(d, 1)
	config := func(failing bool) consumer.Config[pgx.Tx] {
		src := source(t, rocketmq.Config{Group: group, Topics: []string{topic}, RetryDelays: delays, Orderly: true, BatchMaxSize: 4})
		return consumer.Config[pgx.Tx]{
			Name: "ledger", Source: src, DeadLetter: src, Store: store, Key: consumer.ByJSONField("txn_id"),
			Retry:   consumer.RetryPolicy{Initial: 20 * time.Millisecond, Max: 100 * time.Millisecond},
			Retries: consumer.NonBlocking{Attempts: 2, Delays: delays, Sink: src, KeyOrdered: true},
			Logger:  testLogger(t),
			Handler: consumer.HandlerFunc[pgx.Tx](func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
				id, _ := consumer.ByJSONField("txn_id")(m)
				if k, s := retrytest.KeySeq(id); failing && failingKeys[k] && s == 1 {
					return consumer.Retryable(fmt.Errorf("%s: the account service is down", id))
				}
				return effect(ctx, tx, m)
			}),
		}
	}
	ledger := func() []string { return retrytest.Ledger(t, d.pool, `SELECT key FROM `+d.effects+` ORDER BY id`) }

	r1 := start(t, config(true))
	others := (len(keys)-len(failingKeys))*perKey + len(failingKeys) // and the failing keys' first payments
	parked := len(failingKeys) * (perKey - 1)
	testenv.WaitUntil(t, time.Minute, "the other keys applied, the parked ones sent to the 20s trip", func() bool {
		return len(ledger()) == others && r1.Stats().RetriedLater >= int64(2*parked)
	})
	r1.Stop(t)
	if st := r1.Stats(); st.DeadLettered != 0 {
		t.Fatalf("the first consumer dead-lettered %d payments, want none", st.DeadLettered)
	}

	send(perKey, more)
	r2 := start(t, config(false))
	total := len(keys) * (perKey + more)
	testenv.WaitUntil(t, 2*time.Minute, "every payment applied", func() bool { return len(ledger()) >= total })
	r2.Stop(t)
	got := ledger()
	if len(got) != total {
		t.Errorf("%d effects, want %d", len(got), total)
	}
	if n := retrytest.CheckKeyOrder(t, got); n != 0 {
		t.Errorf("%d payments applied out of their key's order after the restart", n)
	}
	if st := r2.Stats(); st.DeadLettered != 0 {
		t.Errorf("the new consumer dead-lettered %d payments, want none", st.DeadLettered)
	}
	if pk, ok := store.(dedup.Parking); ok {
		if s, err := pk.ParkStats(context.Background()); err != nil || s.Keys != 0 {
			t.Errorf("ParkStats %+v, %v after every payment applied, want no key parked", s, err)
		}
	}
}
