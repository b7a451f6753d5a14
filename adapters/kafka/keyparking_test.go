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
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/internal/testenv/retrytest"
)

// parkInStore: set false to watch TestKafkaKeyOrderedAcrossARestart fail
// with the parked keys in the consumer's memory (a store that keeps none).
var parkInStore = true

// noParking hides a store's dedup.Parking: KeyOrdered then parks keys in
// the consumer's memory.
type noParking struct{ dedup.Store[pgx.Tx] }

// keyedPayments are n payments "<key>-<seq>" for each of keys, seq from
// from on, a key's in one partition, in sequence.
func keyedPayments(keys []string, partitions, from, n int) []kafkago.Message {
	var msgs []kafkago.Message
	for s := from; s < from+n; s++ {
		for k, key := range keys {
			v, _ := json.Marshal(payment{TxnID: fmt.Sprintf("%s-%d", key, s), Amount: int64(s + 1)})
			msgs = append(msgs, kafkago.Message{Partition: k % partitions, Key: []byte(key), Value: v})
		}
	}
	return msgs
}

// TestKafkaKeyOrderedAcrossARestart: 10 record keys of 5 payments each
// over 2 partitions; the second payment of 2 keys fails for good in the
// first consumer, which parks the keys: the failing payments go to retry
// (1s, then 20s), their keys' 3 later ones follow. The first consumer is
// stopped once they are all on the 20s retry topic, and 2 more payments of
// every key are produced. A new consumer — a fresh process's state, the
// same store and group — reads them at once, long before the copies are
// due: the parked keys' new payments must follow the copies, and every
// key's payments are applied once each, in production order, nothing
// dead-lettered. With the keys parked in memory (parkInStore false) the
// new consumer knows of no parked key and applies the new payments first.
//
// It runs where parking meets older settings: offsets in the store
// (Config.Offsets), a tenant taken from the topic (the copies arrive on
// retry topics: their scope must be the one they carry), and key lanes;
// and with two members, the one that parked more leaving the group (a
// rebalance) instead of a restart.
func TestKafkaKeyOrderedAcrossARestart(t *testing.T) {
	for _, mode := range []string{"plain", "offsets", "tenant-from-topic", "key-lanes", "rebalance"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			keyOrderedAcrossARestart(t, mode)
		})
	}
}

func keyOrderedAcrossARestart(t *testing.T, mode string) {
	const partitions, perKey, more = 2, 5, 2
	delays := []time.Duration{time.Second, 20 * time.Second}
	brokers, a, topic, group := retryTest(t, partitions, delays)
	b := newTestBank(t)
	var keys []string
	failingKeys := map[string]bool{}
	want := map[string]bool{}
	for k := range 10 {
		key := fmt.Sprintf("k%02d", k)
		keys = append(keys, key)
		if k%5 == 3 {
			failingKeys[key] = true
		}
		for s := range perKey + more {
			want[fmt.Sprintf("%s-%d", key, s)] = true
		}
	}
	a.Produce(t, topic, keyedPayments(keys, partitions, 0, perKey)...)

	var store dedup.Store[pgx.Tx] = b.store
	if !parkInStore {
		store = noParking{b.store}
	}
	var failing atomic.Bool
	failing.Store(true)
	config := func() (consumer.Config[pgx.Tx], *kafka.Source) {
		scfg := realSourceConfig(t, brokers, topic, group)
		scfg.RetryDelays = delays
		src := newSource(t, scfg)
		cfg := b.config(src, src)
		cfg.Store = store
		cfg.Logger = testLogger(t)
		cfg.BatchSize = 4
		cfg.Retry = consumer.RetryPolicy{Initial: 20 * time.Millisecond, Max: 100 * time.Millisecond}
		cfg.Retries = consumer.NonBlocking{Attempts: 2, Delays: delays, Sink: src, KeyOrdered: true}
		switch mode {
		case "offsets":
			cfg.Offsets = b.store
		case "tenant-from-topic":
			cfg.Tenant = func(m *consumer.Message) (string, error) { return m.Topic, nil }
		case "key-lanes":
			cfg.KeyLanes = 4
		}
		inner := cfg.Handler
		cfg.Handler = consumer.HandlerFunc[pgx.Tx](func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			var p payment
			_ = json.Unmarshal(m.Value, &p)
			if k, s := retrytest.KeySeq(p.TxnID); failing.Load() && failingKeys[k] && s == 1 {
				return consumer.Retryable(fmt.Errorf("%s: the account service is down", p.TxnID))
			}
			return inner.Handle(ctx, tx, m)
		})
		return cfg, src
	}
	ledger := func() []string { return retrytest.Ledger(t, b.pool, `SELECT txn_id FROM `+b.table+` ORDER BY id`) }

	cfg1, _ := config()
	r1 := start(t, cfg1)
	members := []*running{r1}
	if mode == "rebalance" {
		cfg2, _ := config()
		members = append(members, start(t, cfg2))
	}
	retried := func() (n int64) {
		for _, r := range members {
			n += r.Stats().RetriedLater
		}
		return n
	}
	others := (len(keys)-len(failingKeys))*perKey + len(failingKeys) // and the failing keys' first payments
	// Each parked payment (the failing one and the 3 behind it) went to the
	// 1s topic, then to the 20s one.
	parked := len(failingKeys) * (perKey - 1)
	waitUntil(t, time.Minute, "the other keys applied, the parked ones on the 20s retry topic", func() bool {
		return len(ledger()) == others && retried() >= int64(2*parked)
	})
	var r2 *running
	if mode == "rebalance" {
		// The member that sent more to retry leaves; the other takes its
		// partitions over, and the new payments.
		if members[1].Stats().RetriedLater > r1.Stats().RetriedLater {
			r1, r2 = members[1], members[0]
		} else {
			r2 = members[1]
		}
		failing.Store(false)
	}
	r1.Stop(t)
	if st := r1.Stats(); st.DeadLettered != 0 {
		t.Fatalf("the first consumer dead-lettered %d payments, want none", st.DeadLettered)
	}
	ctx := ctxTimeout(t, 2*time.Minute)
	p, isParking := store.(dedup.Parking)
	if isParking {
		pk, err := p.Parked(ctx, dedup.ParkFilter{Topic: topic})
		if err != nil {
			t.Fatal(err)
		}
		scope := "payments"
		if mode == "tenant-from-topic" {
			scope += "/" + topic // the original's topic, never a retry topic's
		}
		// (With a rebalance the other member still runs, and may have
		// settled one meanwhile.)
		if mode != "rebalance" && (len(pk) != len(failingKeys) || pk[0].Depth != perKey-1 || pk[0].Scope != scope || pk[1].Scope != scope) {
			t.Fatalf("parked keys after the first consumer stopped: %+v, want %d keys of scope %q, %d payments each", pk, len(failingKeys), scope, perKey-1)
		}
	}

	// The new consumer reads the new payments before the copies are due.
	a.Produce(t, topic, keyedPayments(keys, partitions, perKey, more)...)
	if r2 == nil {
		failing.Store(false)
		cfg2, _ := config()
		r2 = start(t, cfg2)
	}
	waitUntil(t, 2*time.Minute, "every payment applied", func() bool { return len(ledger()) >= len(want) })
	a.WaitNoLag(t, group, topic)
	for _, d := range delays {
		waitSettled(t, a, group, kafka.RetryTopic(topic, d))
	}
	r2.Stop(t)
	b.requireLedger(t, want)
	if n := retrytest.CheckKeyOrder(t, ledger()); n != 0 {
		t.Errorf("%d payments applied out of their key's order (%s)", n, mode)
	}
	if st := r2.Stats(); st.DeadLettered != 0 {
		t.Errorf("the new consumer dead-lettered %d payments, want none", st.DeadLettered)
	}
	if isParking {
		if s, err := p.ParkStats(ctx); err != nil || s.Keys != 0 {
			t.Errorf("ParkStats %+v, %v after every payment applied, want no key parked", s, err)
		}
	}
}

// TestKafkaKeyOrderedParkedTooLong: MaxParkedDepth 3 over real Kafka and
// Postgres. k0-0 fails into retry, k0-1 and k0-2 follow it; k0-3 would
// make the key deeper than 3: the key has outlived its limits. k0-3 is
// dead-lettered at once, and k0-0, k0-1, k0-2, untried, as their copies
// come back, in their order, each with cause parked_too_long; the key is
// released, and k0-4, produced then, is applied. Key k1 is not touched.
func TestKafkaKeyOrderedParkedTooLong(t *testing.T) {
	delays := []time.Duration{time.Second}
	brokers, a, topic, group := retryTest(t, 1, delays)
	b := newTestBank(t)
	a.Produce(t, topic, keyedPayments([]string{"k0", "k1"}, 1, 0, 4)...)

	scfg := realSourceConfig(t, brokers, topic, group)
	scfg.RetryDelays = delays
	src := newSource(t, scfg)
	dl := &consumertest.DeadLetters{}
	cfg := b.config(src, dl)
	cfg.Logger = testLogger(t)
	cfg.BatchSize = 1
	cfg.Retry = consumer.RetryPolicy{Initial: 20 * time.Millisecond, Max: 100 * time.Millisecond}
	cfg.Retries = consumer.NonBlocking{Attempts: 1, Delays: delays, Sink: src, KeyOrdered: true, MaxParkedDepth: 3}
	inner := cfg.Handler
	cfg.Handler = consumer.HandlerFunc[pgx.Tx](func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		var p payment
		_ = json.Unmarshal(m.Value, &p)
		if p.TxnID == "k0-0" {
			return consumer.Retryable(fmt.Errorf("%s: the account service is down", p.TxnID))
		}
		return inner.Handle(ctx, tx, m)
	})
	r := start(t, cfg)
	waitUntil(t, time.Minute, "k0's 4 payments dead-lettered", func() bool { return len(dl.Letters()) >= 4 })
	a.Produce(t, topic, keyedPayments([]string{"k0"}, 1, 4, 1)...)
	waitUntil(t, time.Minute, "k0-4 applied", func() bool {
		return len(retrytest.Ledger(t, b.pool, `SELECT txn_id FROM `+b.table+` WHERE txn_id = 'k0-4'`)) == 1
	})
	a.WaitNoLag(t, group, topic)
	waitSettled(t, a, group, kafka.RetryTopic(topic, delays[0]))
	r.Stop(t)

	var ids []string
	for _, l := range dl.Letters() {
		ids = append(ids, l.Key.ID)
		if l.Cause != consumer.CauseParkedTooLong {
			t.Errorf("%s dead-lettered with cause %v (%v), want parked_too_long", l.Key.ID, l.Cause, l.Reason)
		}
	}
	if want := []string{"k0-3", "k0-0", "k0-1", "k0-2"}; fmt.Sprint(ids) != fmt.Sprint(want) {
		t.Errorf("dead letters %v, want %v: the one that overflowed the key at once, then the parked ones in order", ids, want)
	}
	b.requireLedger(t, map[string]bool{"k1-0": true, "k1-1": true, "k1-2": true, "k1-3": true, "k0-4": true})
	if s, err := b.store.ParkStats(ctxTimeout(t, 10*time.Second)); err != nil || s.Keys != 0 {
		t.Errorf("ParkStats %+v, %v, want the key released", s, err)
	}
}
