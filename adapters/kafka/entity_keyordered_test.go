package kafka_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	kafkago "github.com/segmentio/kafka-go"

	"github.com/idemkit/idem/adapters/kafka"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/dedup"
)

// TestKafkaEntityKeyOrderedHeadEndsStale: NonBlocking with KeyOrdered and
// Entity. Notifications n1 (seq 1) and n2 (seq 2) of trade T1 share the
// record key T1: n1 fails and goes to retry, n2 follows it there untried.
// n3 (seq 3) of T1, under another record key, commits meanwhile. n1's
// copy comes back stale; the hold must let n2 go, and n2, tried, is stale
// too: the trade stays at seq 3, both recorded, nothing left held.
func TestKafkaEntityKeyOrderedHeadEndsStale(t *testing.T) {
	delays := []time.Duration{time.Second}
	brokers, a, topic, group := retryTest(t, 1, delays)
	b := newTestBank(t)
	ctx := ctxTimeout(t, 2*time.Minute)
	tradesT := pgx.Identifier{b.schema, "trades"}.Sanitize()
	if _, err := b.pool.Exec(ctx, `CREATE TABLE `+tradesT+` (trade_no text PRIMARY KEY, status text NOT NULL, seq bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	var msgs []kafkago.Message
	for _, n := range []struct {
		key string
		n   tradeNotify
	}{
		{"T1", tradeNotify{NotifyID: "n1", TradeNo: "T1", Status: "WAIT_BUYER_PAY", Seq: 1}},
		{"T1", tradeNotify{NotifyID: "n2", TradeNo: "T1", Status: "TRADE_SUCCESS", Seq: 2}},
		{"T1-refund", tradeNotify{NotifyID: "n3", TradeNo: "T1", Status: "TRADE_CLOSED", Seq: 3}},
	} {
		v, _ := json.Marshal(n.n)
		msgs = append(msgs, kafkago.Message{Key: []byte(n.key), Value: v})
	}
	a.Produce(t, topic, msgs...)

	scfg := realSourceConfig(t, brokers, topic, group)
	scfg.RetryDelays = delays
	src := newSource(t, scfg)
	dl := &consumertest.DeadLetters{}
	tried := map[string]int{}
	triedCh := make(chan string, 16)
	r := start(t, consumer.Config[pgx.Tx]{
		Name: "alipay", Source: src, Store: b.store, DeadLetter: dl, Logger: testLogger(t),
		Key: consumer.ByJSONField("notify_id"), Entity: byTrade,
		Retry:   consumer.RetryPolicy{MaxAttempts: 1},
		Retries: consumer.NonBlocking{Attempts: 3, Delays: delays, Sink: src, KeyOrdered: true},
		Handler: consumer.HandlerFunc[pgx.Tx](func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			var n tradeNotify
			if err := json.Unmarshal(m.Value, &n); err != nil {
				return consumer.Permanent(err)
			}
			if m.Topic != topic {
				triedCh <- n.NotifyID + " copy"
			} else {
				triedCh <- n.NotifyID
			}
			if n.NotifyID == "n1" && m.Topic == topic {
				return errors.New("order service unavailable")
			}
			_, err := tx.Exec(ctx, `INSERT INTO `+tradesT+` (trade_no, status, seq) VALUES ($1, $2, $3)
				ON CONFLICT (trade_no) DO UPDATE SET status = excluded.status, seq = excluded.seq`, n.TradeNo, n.Status, n.Seq)
			return err
		}),
	})
	waitUntil(t, time.Minute, "n1 and n2 settled stale", func() bool {
		st, err := b.store.StaleEvents(ctx, dedup.StaleFilter{Entity: "T1"})
		return err == nil && len(st) >= 2
	})
	waitSettled(t, a, group, kafka.RetryTopic(topic, delays[0]))
	r.Stop(t)
	close(triedCh)
	for id := range triedCh {
		tried[id]++
	}

	var status string
	var seq int64
	if err := b.pool.QueryRow(ctx, `SELECT status, seq FROM `+tradesT+` WHERE trade_no = 'T1'`).Scan(&status, &seq); err != nil {
		t.Fatal(err)
	}
	if status != "TRADE_CLOSED" || seq != 3 {
		t.Errorf("trade T1 is %s at seq %d, want TRADE_CLOSED at 3", status, seq)
	}
	stale, err := b.store.StaleEvents(ctx, dedup.StaleFilter{Entity: "T1"})
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]bool{}
	for _, s := range stale {
		ids[s.Key.ID] = s.Watermark.Major == 3
	}
	if len(stale) != 2 || !ids["n1"] || !ids["n2"] {
		t.Errorf("stale records %+v, want n1 and n2 at watermark 3", stale)
	}
	if tried["n2"] != 0 || tried["n1 copy"] != 0 || tried["n2 copy"] != 0 || tried["n1"] == 0 || tried["n3"] == 0 {
		t.Errorf("handler tried %v: want n1 (failing) and n3 on the topic, n2 never (held, then stale), no copy", tried)
	}
	if st := r.Stats(); st.Stale != 2 || st.Applied != 1 || st.RetriedLater != 2 || len(dl.Letters()) != 0 {
		t.Errorf("stats %+v, %d letters: want n3 applied, n1 and n2 sent to retry and stale, no letter", st, len(dl.Letters()))
	}
}
