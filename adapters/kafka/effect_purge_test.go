package kafka_test

import (
	"encoding/json"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/dedup/pgstore"
)

// TestKafkaEffectPurgeSparesAnUncommittedStep (39.8): a refund executes,
// then the handler rejects the message (the account is frozen): the key
// stays free, the step succeeded. The scope's retention passes and the
// store is purged. The request is sent again once the account is
// unfrozen: the provider must not be called a second time (it may have
// forgotten the key by then).
func TestKafkaEffectPurgeSparesAnUncommittedStep(t *testing.T) {
	brokers, a, topic, group := kafkaTest(t, 1)
	b := newTestBank(t)
	store, err := pgstore.New(b.pool, pgstore.Config{Schema: b.schema, Retention: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	p := newRefundProvider()
	v, _ := json.Marshal(payment{TxnID: "u-00", Amount: 100})
	a.Produce(t, topic, kafkago.Message{Key: []byte("u-00"), Value: v, Headers: []kafkago.Header{{Key: "frozen", Value: []byte("1")}}})

	src := newSource(t, realSourceConfig(t, brokers, topic, group))
	dl := &consumertest.DeadLetters{}
	cfg := b.config(src, dl)
	cfg.Store = store
	cfg.Logger = testLogger(t)
	cfg.Handler = b.frozenRefundHandler(store, p)
	r := start(t, cfg)
	waitUntil(t, time.Minute, "the frozen refund rejected", func() bool { return r.Stats().DeadLettered >= 1 })
	// The retention passes (by the store's clock) and Purge runs after it:
	// before the fix it deleted the step here.
	var rejected time.Time
	if err := b.pool.QueryRow(ctxTimeout(t, 10*time.Second), `SELECT now()`).Scan(&rejected); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, time.Minute, "a purge past the retention", func() bool {
		var now time.Time
		if err := b.pool.QueryRow(ctxTimeout(t, 10*time.Second), `SELECT now()`).Scan(&now); err != nil {
			return false
		}
		_, err := store.Purge(ctxTimeout(t, 10*time.Second), 100)
		return err == nil && now.After(rejected.Add(time.Second))
	})
	a.Produce(t, topic, kafkago.Message{Key: []byte("u-00"), Value: v})
	waitUntil(t, time.Minute, "the re-sent refund booked", func() bool { rows, _ := b.rows(t); return rows >= 1 })
	r.Stop(t)
	p.requireOnce(t, 1)
}
