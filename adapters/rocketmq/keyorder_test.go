package rocketmq_test

import (
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/adapters/rocketmq"
	"github.com/idemkit/idem/consumer"
)

// TestKeyOrderedRefusesConcurrentMode (seam 40.63): KeyOrdered keeps a
// record key's order only where the source delivers a queue's messages in
// order. In concurrent mode (Orderly false, the default) calls of one queue
// run at once, and a key's later message could be tried before its earlier
// one fails and parks the key, so consumer.New refuses KeyOrdered there
// with an error naming Orderly; in orderly mode it accepts it.
func TestKeyOrderedRefusesConcurrentMode(t *testing.T) {
	topic := name(t, "t")
	delays := []time.Duration{time.Second}
	d := newDB(t)
	build := func(orderly bool) error {
		src := source(t, rocketmq.Config{Group: name(t, "g"), Topics: []string{topic}, RetryDelays: delays, Orderly: orderly})
		_, err := consumer.New(consumer.Config[pgx.Tx]{
			Name: "ledger", Source: src, DeadLetter: src, Store: d.store, Key: consumer.ByJSONField("txn_id"),
			Handler: insertEffect(d, 1),
			Retries: consumer.NonBlocking{Attempts: 1, Delays: delays, Sink: src, KeyOrdered: true},
		})
		return err
	}
	err := build(false)
	if err == nil {
		t.Fatalf("consumer.New accepted NonBlocking.KeyOrdered over a RocketMQ source in concurrent mode (Orderly false), want it refused")
	}
	if !strings.Contains(err.Error(), "KeyOrdered") || !strings.Contains(err.Error(), "rocketmq.Config.Orderly") {
		t.Errorf("concurrent mode refused with %q, want an error naming KeyOrdered and rocketmq.Config.Orderly", err)
	}
	if err := build(true); err != nil {
		t.Errorf("consumer.New refused NonBlocking.KeyOrdered in orderly mode: %v", err)
	}
}
