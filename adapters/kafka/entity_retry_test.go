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

// TestKafkaEntityRetryCopyKeepsTopicTenant: the tenant is taken from the
// topic and the entity is the trade. Trade T1's WAIT_BUYER_PAY (seq 1)
// fails and goes to the retry topic; its TRADE_CLOSED (seq 2), behind it
// on the partition, applies meanwhile. When the copy of seq 1 arrives on
// pay.retry.<delay>, it is of the same entity in the same scope (the
// tenant its original's topic gave): stale, recorded in that scope, and
// the trade stays closed. Keyed from the copy's own topic, it would meet
// an empty watermark in another scope and reopen the trade.
func TestKafkaEntityRetryCopyKeepsTopicTenant(t *testing.T) {
	delays := []time.Duration{2 * time.Second}
	brokers, a, topic, group := retryTest(t, 1, delays)
	b := newTestBank(t)
	ctx := ctxTimeout(t, 2*time.Minute)
	tradesT := pgx.Identifier{b.schema, "trades"}.Sanitize()
	events := pgx.Identifier{b.schema, "trade_events"}.Sanitize()
	if _, err := b.pool.Exec(ctx, `CREATE TABLE `+tradesT+` (trade_no text PRIMARY KEY, status text NOT NULL, seq bigint NOT NULL);
		CREATE TABLE `+events+` (id bigserial PRIMARY KEY, notify_id text NOT NULL, trade_no text NOT NULL, seq bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	var msgs []kafkago.Message
	for _, n := range []tradeNotify{
		{NotifyID: "n1", TradeNo: "T1", Status: "WAIT_BUYER_PAY", Seq: 1},
		{NotifyID: "n2", TradeNo: "T1", Status: "TRADE_CLOSED", Seq: 2},
	} {
		v, _ := json.Marshal(n)
		msgs = append(msgs, kafkago.Message{Key: []byte(n.NotifyID), Value: v})
	}
	a.Produce(t, topic, msgs...)

	scfg := realSourceConfig(t, brokers, topic, group)
	scfg.RetryDelays = delays
	src := newSource(t, scfg)
	dl := &consumertest.DeadLetters{}
	r := start(t, consumer.Config[pgx.Tx]{
		Name: "alipay", Source: src, Store: b.store, DeadLetter: dl, Logger: testLogger(t),
		Key: consumer.ByJSONField("notify_id"), Entity: byTrade,
		Tenant:  func(m *consumer.Message) (string, error) { return m.Topic, nil },
		Retry:   consumer.RetryPolicy{MaxAttempts: 1},
		Retries: consumer.NonBlocking{Attempts: 2, Delays: delays, Sink: src},
		Handler: consumer.HandlerFunc[pgx.Tx](func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			var n tradeNotify
			if err := json.Unmarshal(m.Value, &n); err != nil {
				return consumer.Permanent(err)
			}
			if n.NotifyID == "n1" && m.Topic == topic {
				return errors.New("order service unavailable")
			}
			if _, err := tx.Exec(ctx, `INSERT INTO `+tradesT+` (trade_no, status, seq) VALUES ($1, $2, $3)
				ON CONFLICT (trade_no) DO UPDATE SET status = excluded.status, seq = excluded.seq`, n.TradeNo, n.Status, n.Seq); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO `+events+` (notify_id, trade_no, seq) VALUES ($1, $2, $3)`, n.NotifyID, n.TradeNo, n.Seq)
			return err
		}),
	})
	scope := "alipay/" + topic
	waitUntil(t, time.Minute, "the copy of seq 1 settled", func() bool {
		st, err := b.store.StaleEvents(ctx, dedup.StaleFilter{Entity: "T1"})
		var n int
		if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM `+events+` WHERE notify_id = 'n1'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return err == nil && len(st)+n >= 1
	})
	waitSettled(t, a, group, kafka.RetryTopic(topic, delays[0]))
	r.Stop(t)

	var status string
	var applied int
	if err := b.pool.QueryRow(ctx, `SELECT status, (SELECT count(*) FROM `+events+`) FROM `+tradesT+` WHERE trade_no = 'T1'`).Scan(&status, &applied); err != nil {
		t.Fatal(err)
	}
	stale, err := b.store.StaleEvents(ctx, dedup.StaleFilter{Entity: "T1"})
	if err != nil {
		t.Fatal(err)
	}
	if status != "TRADE_CLOSED" || applied != 1 {
		t.Errorf("trade T1 is %s with %d notifications applied, want TRADE_CLOSED by seq 2 alone", status, applied)
	}
	if len(stale) != 1 || stale[0].Key.Scope != scope || stale[0].Key.ID != "n1" || stale[0].Watermark.Major != 2 {
		t.Errorf("stale records %+v, want n1 in scope %s at watermark 2", stale, scope)
	}
	if st := r.Stats(); st.RetriedLater != 1 || st.Stale != 1 || len(dl.Letters()) != 0 {
		t.Errorf("stats %+v, %d letters: want one retry, one stale, no letter", st, len(dl.Letters()))
	}
}
