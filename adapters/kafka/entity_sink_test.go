package kafka_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	kafkago "github.com/segmentio/kafka-go"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/wire"
)

// TestKafkaEntityStaleLetterWaitsForTheSink: StaleDeadLetter while the
// dead-letter topic cannot be written. n2 (seq 1) is stale behind n1
// (seq 2): its transaction commits, and its letter fails again and
// again. The offset is not committed past n2 (with offsets in Kafka)
// until the sink comes back: then one letter, cause stale, and no lag.
// With offsets in the store, the stored offset moved with n2's commit
// (40.2) and the letter is still written once.
func TestKafkaEntityStaleLetterWaitsForTheSink(t *testing.T) {
	for _, offsets := range []bool{false, true} {
		name := "kafka-offsets"
		if offsets {
			name = "store-offsets"
		}
		t.Run(name, func(t *testing.T) {
			brokers, a, topic, group := kafkaTest(t, 1)
			dlq := topic + ".dlq"
			a.CreateTopic(t, dlq, 1)
			b := newTestBank(t)
			ctx := ctxTimeout(t, 2*time.Minute)
			tradesT := pgx.Identifier{b.schema, "trades"}.Sanitize()
			if _, err := b.pool.Exec(ctx, `CREATE TABLE `+tradesT+` (trade_no text PRIMARY KEY, seq bigint NOT NULL)`); err != nil {
				t.Fatal(err)
			}
			var msgs []kafkago.Message
			for _, n := range []tradeNotify{
				{NotifyID: "n1", TradeNo: "T1", Status: "TRADE_SUCCESS", Seq: 2},
				{NotifyID: "n2", TradeNo: "T1", Status: "WAIT_BUYER_PAY", Seq: 1},
				{NotifyID: "n3", TradeNo: "T1", Status: "TRADE_FINISHED", Seq: 3},
			} {
				v, _ := json.Marshal(n)
				msgs = append(msgs, kafkago.Message{Key: []byte("T1"), Value: v})
			}
			a.Produce(t, topic, msgs...)

			scfg := realSourceConfig(t, brokers, topic, group)
			scfg.DeadLetterTopic = dlq
			src := newSource(t, scfg)
			var down atomic.Bool
			var refused atomic.Int64
			down.Store(true)
			sink := consumer.DeadLetterFunc(func(ctx context.Context, l consumer.Letter) error {
				if down.Load() {
					refused.Add(1)
					return errors.New("dead-letter topic unavailable")
				}
				return src.DeadLetter(ctx, l)
			})
			cfg := consumer.Config[pgx.Tx]{
				Name: "alipay", Source: src, Store: b.store, DeadLetter: sink, Logger: testLogger(t),
				Key: consumer.ByJSONField("notify_id"), Entity: byTrade, Stale: consumer.StaleDeadLetter,
				Handler: consumer.HandlerFunc[pgx.Tx](func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
					var n tradeNotify
					if err := json.Unmarshal(m.Value, &n); err != nil {
						return consumer.Permanent(err)
					}
					_, err := tx.Exec(ctx, `INSERT INTO `+tradesT+` (trade_no, seq) VALUES ($1, $2)
						ON CONFLICT (trade_no) DO UPDATE SET seq = excluded.seq`, n.TradeNo, n.Seq)
					return err
				}),
			}
			if offsets {
				cfg.Offsets = b.store
			}
			r := start(t, cfg)
			waitUntil(t, time.Minute, "n2's letter refused three times", func() bool { return refused.Load() >= 3 })
			seq := func() int64 {
				var s int64
				if err := b.pool.QueryRow(ctx, `SELECT seq FROM `+tradesT+` WHERE trade_no = 'T1'`).Scan(&s); err != nil {
					t.Fatal(err)
				}
				return s
			}
			if !offsets {
				if got := a.committed(t, group, topic); got[0] > 1 {
					t.Errorf("while n2's letter waits, the committed offset is %d: past n2 (offset 1), whose letter is not written", got[0])
				}
			}
			down.Store(false)
			if !offsets {
				waitSettled(t, a, group, topic)
			} else {
				waitUntil(t, time.Minute, "n3 applied", func() bool { return seq() == 3 })
			}
			r.Stop(t)

			letters := a.ReadAll(t, dlq)
			if len(letters) != 1 {
				t.Fatalf("%d letters, want n2's alone", len(letters))
			}
			var cause, key string
			for _, h := range letters[0].Headers {
				switch h.Key {
				case wire.MetaCause:
					cause = string(h.Value)
				case wire.MetaKey:
					key = string(h.Value)
				}
			}
			if cause != "stale" || key != "n2" || seq() != 3 {
				t.Errorf("letter of %q with cause %q, trade at seq %d; want n2's, stale, and seq 3", key, cause, seq())
			}
			if st := r.Stats(); st.DeadLettered != 1 || st.Applied != 2 {
				t.Errorf("stats %+v: want n1 and n3 applied, n2 dead-lettered", st)
			}
		})
	}
}
