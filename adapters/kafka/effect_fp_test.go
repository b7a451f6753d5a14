package kafka_test

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/dedup"
)

// TestKafkaEffectStepKeepsItsFingerprint (39.6): a refund request is
// refunded and then rejected by the handler (the account is frozen): the
// key stays free, the step succeeded. A second request under the same
// txn_id with another amount must not be told that its refund executed:
// the provider executed the first one's amount.
func TestKafkaEffectStepKeepsItsFingerprint(t *testing.T) {
	brokers, a, topic, group := kafkaTest(t, 1)
	b := newTestBank(t)
	p := newRefundProvider()
	v1, _ := json.Marshal(payment{TxnID: "f-00", Amount: 100})
	v2, _ := json.Marshal(payment{TxnID: "f-00", Amount: 250})
	a.Produce(t, topic, kafkago.Message{Key: []byte("f-00"), Value: v1, Headers: []kafkago.Header{{Key: "frozen", Value: []byte("1")}}},
		kafkago.Message{Key: []byte("f-00"), Value: v2})

	src := newSource(t, realSourceConfig(t, brokers, topic, group))
	dl := &consumertest.DeadLetters{}
	cfg := b.config(src, dl)
	cfg.Logger = testLogger(t)
	cfg.BatchSize = 1
	cfg.Handler = b.frozenRefundHandler(b.store, p)
	r := start(t, cfg)
	waitUntil(t, time.Minute, "both requests settled", func() bool { st := r.Stats(); return st.Applied+st.DeadLettered >= 2 })
	r.Stop(t)

	var booked int64
	_ = b.pool.QueryRow(ctxTimeout(t, 10*time.Second), `SELECT coalesce(sum(amount), 0) FROM `+b.table).Scan(&booked)
	var executed int64
	for _, amt := range p.executed {
		executed += amt
	}
	if booked != executed && booked != 0 {
		t.Fatalf("ledger booked %d as refunded, the provider executed %d: the second request was answered with the first one's step", booked, executed)
	}
	// The first request was rejected by the handler after its refund; the
	// second, under its key with another amount, by the journal: a
	// mismatch, the provider not called again.
	letters := dl.Letters()
	if len(letters) != 2 || letters[0].Cause != consumer.CauseRejected || letters[1].Cause != consumer.CauseMismatch ||
		!errors.Is(letters[1].Reason, dedup.ErrFingerprintMismatch) {
		t.Fatalf("letters %+v, want the frozen request rejected and the second one a fingerprint mismatch", letters)
	}
	calls := 0
	for _, n := range p.calls {
		calls += n
	}
	if calls != 1 || executed != 100 {
		t.Fatalf("the provider was called %d times and executed %d, want once, 100", calls, executed)
	}
}
