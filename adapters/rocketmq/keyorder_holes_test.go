package rocketmq_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/adapters/rocketmq"
	"github.com/idemkit/idem/consumer"
)

// TestBreakKeyOrderedRefusesConcurrentMode (seam 40.63): KeyOrdered keeps
// a record key's order only where the source delivers a queue's messages
// in order; rocketmq.Config.Orderly says concurrent mode (the default)
// does not ("order within a queue is not kept"), and the package doc
// calls orderly mode "the mode that keeps order for KeyOrdered". A
// KeyOrdered consumer over a concurrent-mode source is accepted, and its
// keys are silently unordered: a key's later message, consumed in a call
// running beside its earlier one's, is tried before that one fails and
// parks the key. consumer.New should refuse it, naming Orderly.
func TestBreakKeyOrderedRefusesConcurrentMode(t *testing.T) {
	topic := name(t, "t")
	delays := []time.Duration{time.Second}
	src := source(t, rocketmq.Config{Group: name(t, "g"), Topics: []string{topic}, RetryDelays: delays})
	d := newDB(t)
	_, err := consumer.New(consumer.Config[pgx.Tx]{
		Name: "ledger", Source: src, DeadLetter: src, Store: d.store, Key: consumer.ByJSONField("txn_id"),
		Handler: insertEffect(d, 1),
		Retries: consumer.NonBlocking{Attempts: 1, Delays: delays, Sink: src, KeyOrdered: true},
	})
	if err == nil {
		t.Errorf("consumer.New accepted NonBlocking.KeyOrdered over a RocketMQ source in concurrent mode (Orderly false), want it refused")
	}
}
