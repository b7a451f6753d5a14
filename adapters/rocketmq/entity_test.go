package rocketmq_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/adapters/rocketmq"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/consumer/wire"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/internal/testenv/rmqtest"
)

// tradeNotify is a payment channel's notification of a trade's status: a
// notification ID of its own, the trade, the status and its sequence
// within the trade.
type tradeNotify struct {
	NotifyID string `json:"notify_id"`
	TradeNo  string `json:"out_trade_no"`
	Status   string `json:"trade_status"`
	Seq      int64  `json:"seq"`
}

// tradeNotifies makes the notifications of trades (WAIT_BUYER_PAY, then
// TRADE_SUCCESS and TRADE_FINISHED, or TRADE_CLOSED followed by a late
// TRADE_SUCCESS re-sent as a new notification), shuffled, every tenth
// re-sent unchanged. It returns the messages, each trade's newest status
// and the number of distinct notifications.
func tradeNotifies(topic string, seed uint64, trades int) ([]*primitive.Message, map[string]string, int) {
	rng := rand.New(rand.NewPCG(seed, seed))
	var ns []tradeNotify
	newest := map[string]string{}
	for i := range trades {
		trade := fmt.Sprintf("T%05d", i)
		add := func(status string, seq int64) {
			ns = append(ns, tradeNotify{NotifyID: fmt.Sprintf("%s-%d-%s", trade, seq, status), TradeNo: trade, Status: status, Seq: seq})
			newest[trade] = status
		}
		add("WAIT_BUYER_PAY", 1)
		if i%3 == 0 {
			add("TRADE_CLOSED", 2)
			ns = append(ns, tradeNotify{NotifyID: trade + "-again-TRADE_SUCCESS", TradeNo: trade, Status: "TRADE_SUCCESS", Seq: 1})
			continue
		}
		add("TRADE_SUCCESS", 2)
		add("TRADE_FINISHED", 3)
	}
	distinct := len(ns)
	rng.Shuffle(len(ns), func(i, j int) { ns[i], ns[j] = ns[j], ns[i] })
	for i := range distinct / 10 {
		ns = append(ns, ns[rng.IntN(distinct-i)])
	}
	msgs := make([]*primitive.Message, len(ns))
	for i, n := range ns {
		v, _ := json.Marshal(n)
		msgs[i] = primitive.NewMessage(topic, v)
		msgs[i].WithKeys([]string{n.NotifyID})
	}
	return msgs, newest, distinct
}

// fails says whether the handler fails m, notification n: the second
// notification of every fifth trade, on its first broker delivery and
// its first run.
func fails(m *consumer.Message, n tradeNotify, failed *sync.Map) bool {
	if m.Attempt != 1 || n.Seq != 2 || n.TradeNo[len(n.TradeNo)-1]%5 != 0 {
		return false
	}
	_, again := failed.LoadOrStore(n.NotifyID, true)
	return !again
}

// byTrade is Config.Entity: the trade, at its notification's sequence.
func byTrade(m *consumer.Message) (consumer.Entity, error) {
	var n tradeNotify
	if err := json.Unmarshal(m.Value, &n); err != nil {
		return consumer.Entity{}, err
	}
	return consumer.Entity{Name: n.TradeNo, Version: dedup.Version{Major: n.Seq}}, nil
}

// TestRocketMQEntityTradeStatus: the notifications of 150 trades,
// shuffled over 4 queues and re-sent, through the real broker and
// Postgres, the second notification of every fifth trade failing its
// first run: in concurrent mode that stops the lane, which gives the
// call's messages back, and they come back late through %RETRY%<group> as
// the broker's copies; in orderly mode it is retried in place. Stale
// events skipped (concurrent) or dead-lettered to idem's topic (orderly): every trade ends in its
// newest status, each notification is applied once or is stale
// (recorded; with StaleDeadLetter one letter each, cause stale), and each
// trade's applied sequences rise.
func TestRocketMQEntityTradeStatus(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		orderly bool
		stale   consumer.StalePolicy
	}{
		{name: "concurrent/retry-topic"},
		{name: "orderly/deadletter", orderly: true, stale: consumer.StaleDeadLetter},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			const trades = 150
			topic, group := name(t, "t"), name(t, "g")
			rmqtest.Shared(t).CreateTopic(t, topic, 4)
			rmqtest.Shared(t).CreateTopic(t, topic+"_DLQ", 1)
			rmqtest.Shared(t).CreateTopic(t, "%RETRY%"+group, 1)
			msgs, newest, distinct := tradeNotifies(topic, 40, trades)
			rmqtest.Send(t, rmqtest.Shared(t).NewProducer(t), msgs...)

			d := newDB(t)
			ctx := testenv.Context(t, 4*time.Minute)
			tradesT := pgx.Identifier{d.schema, "trades"}.Sanitize()
			events := pgx.Identifier{d.schema, "trade_events"}.Sanitize()
			if _, err := d.pool.Exec(ctx, `CREATE TABLE `+tradesT+` (trade_no text PRIMARY KEY, status text NOT NULL, seq bigint NOT NULL);
				CREATE TABLE `+events+` (id bigserial PRIMARY KEY, notify_id text NOT NULL, trade_no text NOT NULL, seq bigint NOT NULL)`); err != nil {
				t.Fatal(err)
			}
			src := source(t, rocketmq.Config{Group: group, Topics: []string{topic}, Orderly: tc.orderly, RetryDelayLevel: 1})
			// Concurrent: a failure exhausts its one attempt and stops the
			// lane, which gives the message and every later one of its
			// queue back to the broker; they come back on the retry topic
			// (attempt 2), where nothing fails. Orderly: a failure is
			// retried in place.
			retry, onExhausted := consumer.RetryPolicy{MaxAttempts: 1}, consumer.StopLaneOnExhausted
			if tc.orderly {
				retry, onExhausted = consumer.RetryPolicy{MaxAttempts: 3}, consumer.DeadLetterOnExhausted
			}
			var failed sync.Map
			r := start(t, consumer.Config[pgx.Tx]{
				Name: "alipay", Source: src, DeadLetter: src, Store: d.store, Logger: testLogger(t),
				Key: consumer.ByJSONField("notify_id"), Entity: byTrade, Stale: tc.stale, BatchSize: 16,
				Retry: retry, OnExhausted: onExhausted,
				Clock: consumertest.NewClock(),
				Handler: consumer.HandlerFunc[pgx.Tx](func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
					var n tradeNotify
					if err := json.Unmarshal(m.Value, &n); err != nil {
						return consumer.Permanent(err)
					}
					if fails(m, n, &failed) {
						return errors.New("channel API not ready")
					}
					if _, err := tx.Exec(ctx, `INSERT INTO `+tradesT+` (trade_no, status, seq) VALUES ($1, $2, $3)
						ON CONFLICT (trade_no) DO UPDATE SET status = excluded.status, seq = excluded.seq`, n.TradeNo, n.Status, n.Seq); err != nil {
						return err
					}
					_, err := tx.Exec(ctx, `INSERT INTO `+events+` (notify_id, trade_no, seq) VALUES ($1, $2, $3)`, n.NotifyID, n.TradeNo, n.Seq)
					return err
				}),
			})
			count := func(q string) int {
				var n int
				if err := d.pool.QueryRow(ctx, q).Scan(&n); err != nil {
					t.Fatal(err)
				}
				return n
			}
			testenv.WaitUntil(t, 3*time.Minute, "every notification applied or stale", func() bool {
				recorded, err := d.store.StaleEvents(ctx, dedup.StaleFilter{Scope: "alipay", Limit: 10000})
				return err == nil && count(`SELECT count(*) FROM `+events)+len(recorded) >= distinct
			})
			if tc.stale == consumer.StaleDeadLetter {
				testenv.WaitUntil(t, time.Minute, "the stale letters", func() bool { return r.Stats().DeadLettered >= int64(trades/3) })
			}
			r.Stop(t)

			applied := count(`SELECT count(*) FROM ` + events)
			if n := count(`SELECT count(DISTINCT notify_id) FROM ` + events); n != applied {
				t.Errorf("%d event rows of %d notifications: one applied twice", applied, n)
			}
			if n := count(`SELECT count(*) FROM (SELECT seq, lag(seq) OVER (PARTITION BY trade_no ORDER BY id) AS prev FROM ` + events + `) s WHERE seq <= prev`); n != 0 {
				t.Errorf("%d notifications applied at or below their trade's sequence", n)
			}
			rows, err := d.pool.Query(ctx, `SELECT trade_no, status FROM `+tradesT)
			if err != nil {
				t.Fatal(err)
			}
			got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[struct{ Trade, Status string }])
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != trades {
				t.Errorf("%d trades, want %d", len(got), trades)
			}
			wrong := 0
			for _, g := range got {
				if g.Status != newest[g.Trade] {
					if wrong++; wrong <= 5 {
						t.Errorf("trade %s is %s, its newest notification says %s", g.Trade, g.Status, newest[g.Trade])
					}
				}
			}
			recorded, err := d.store.StaleEvents(ctx, dedup.StaleFilter{Scope: "alipay", Limit: 10000})
			if err != nil {
				t.Fatal(err)
			}
			if applied+len(recorded) != distinct {
				t.Errorf("%d applied + %d stale recorded, want the %d notifications", applied, len(recorded), distinct)
			}
			if len(recorded) < trades/3 {
				t.Errorf("%d stale recorded, want at least the %d TRADE_SUCCESS re-sent after TRADE_CLOSED", len(recorded), trades/3)
			}
			st := r.Stats()
			switch tc.stale {
			case consumer.StaleSkip:
				if st.Stale != int64(len(recorded)) || st.DeadLettered != 0 {
					t.Errorf("Stats.Stale %d, DeadLettered %d, want %d and 0", st.Stale, st.DeadLettered, len(recorded))
				}
			case consumer.StaleDeadLetter:
				if st.DeadLettered != int64(len(recorded)) {
					t.Errorf("Stats.DeadLettered %d, want one per stale notification (%d)", st.DeadLettered, len(recorded))
				}
				letters := rmqtest.ReadTopic(t, rmqtest.Shared(t), topic+"_DLQ", len(recorded))
				for _, l := range letters {
					if c, _ := l.Header(wire.MetaCause); string(c) != consumer.CauseStale.String() {
						t.Errorf("letter %s: cause %q, want stale", l.Value, c)
					}
				}
			}
			if st.Released == 0 && !tc.orderly {
				t.Errorf("no message was given back: the retry topic was not exercised")
			}
		})
	}
}
