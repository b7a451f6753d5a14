package kafka_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	kafkago "github.com/segmentio/kafka-go"

	"github.com/idemkit/idem/adapters/kafka"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/internal/testenv/retrytest"
)

// keyOrdered: set false to watch TestKafkaKeyOrderedRetries fail — a
// failing key's later messages then overtake the one in retry.
var keyOrdered = true

// TestKafkaKeyOrderedRetries: 20 record keys of 10 messages each over 2
// partitions (a key's messages in one partition, in sequence); the third
// message of 4 keys fails with a retryable error until the test has seen
// the other 16 keys applied and the failing keys' later messages gone to
// retry behind it. With NonBlocking{KeyOrdered: true} every key's messages
// are applied once each, in production order (the ledger's insertion
// order), the failing keys' 7 later messages having followed the one in
// retry; the other keys were applied meanwhile.
func TestKafkaKeyOrderedRetries(t *testing.T) {
	const partitions, keys, perKey = 2, 20, 10
	delays := retryDelays
	brokers, a, topic, group := retryTest(t, partitions, delays)
	b := newTestBank(t)

	failing := map[string]bool{} // txn_ids that fail until released
	failingKeys := map[string]bool{}
	want := map[string]bool{}
	var msgs []kafkago.Message
	for s := range perKey {
		for k := range keys {
			key := fmt.Sprintf("k%02d", k)
			id := fmt.Sprintf("%s-%d", key, s)
			want[id] = true
			if k%5 == 3 && s == 2 {
				failing[id], failingKeys[key] = true, true
			}
			v, _ := json.Marshal(payment{TxnID: id, Amount: int64(s + 1)})
			msgs = append(msgs, kafkago.Message{Partition: k % partitions, Key: []byte(key), Value: v})
		}
	}
	a.Produce(t, topic, msgs...)

	scfg := realSourceConfig(t, brokers, topic, group)
	scfg.RetryDelays = delays
	src := newSource(t, scfg)
	cfg := b.config(src, src)
	cfg.Logger = testLogger(t)
	cfg.BatchSize = 7 // a failing message mid-batch, its key's next ones behind it in the batch
	cfg.Retry = consumer.RetryPolicy{Initial: 20 * time.Millisecond, Max: 200 * time.Millisecond}
	cfg.Retries = consumer.NonBlocking{Attempts: 2, Delays: delays, Sink: src, KeyOrdered: keyOrdered}
	var release atomic.Bool
	inner := cfg.Handler
	cfg.Handler = consumer.HandlerFunc[pgx.Tx](func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		var p payment
		_ = json.Unmarshal(m.Value, &p)
		if failing[p.TxnID] && !release.Load() {
			return consumer.Retryable(fmt.Errorf("%s: the account service is down", p.TxnID))
		}
		return inner.Handle(ctx, tx, m)
	})
	r := start(t, cfg)

	ledger := func() []string { return retrytest.Ledger(t, b.pool, `SELECT txn_id FROM `+b.table+` ORDER BY id`) }
	otherKeys := (keys - len(failingKeys)) * perKey
	waitUntil(t, time.Minute, "the other keys applied", func() bool {
		n := 0
		for _, id := range ledger() {
			if k, _ := retrytest.KeySeq(id); !failingKeys[k] {
				n++
			}
		}
		return n == otherKeys
	})
	// Hold the outage a little longer: the followers make trips too.
	time.Sleep(2 * time.Second)
	applied := ledger()
	release.Store(true)
	waitUntil(t, time.Minute, "every message applied", func() bool { return len(ledger()) >= len(want) })
	a.WaitNoLag(t, group, topic)
	for _, d := range delays {
		waitSettled(t, a, group, kafka.RetryTopic(topic, d))
	}
	r.Stop(t)
	b.requireLedger(t, want)

	// Before the release: the failing keys' first two messages only.
	retrytest.CheckHeldBack(t, applied, failingKeys, 2)
	// Each key's messages in production order.
	outOfOrder := retrytest.CheckKeyOrder(t, ledger())
	st := r.Stats()
	t.Logf("applied %d, trips to retry %d (followers included), dead letters %d, out of order %d", st.Applied, st.RetriedLater, st.DeadLettered, outOfOrder)
	if st.DeadLettered != 0 {
		t.Errorf("%d dead letters, want none", st.DeadLettered)
	}
	if st.RetriedLater < int64(len(failing)*perKey/2) {
		t.Errorf("%d trips to retry: the failing keys' later messages did not follow", st.RetriedLater)
	}
}
