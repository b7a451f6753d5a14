package kafka_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	kafkago "github.com/segmentio/kafka-go"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/dedup"
)

// tradeNotify is a payment channel's asynchronous notification of a
// trade's status, as Alipay's: a notification ID of its own (re-sent
// unchanged until acknowledged), the trade, the status, and the
// notification's sequence within the trade.
type tradeNotify struct {
	NotifyID string `json:"notify_id"`
	TradeNo  string `json:"out_trade_no"`
	Status   string `json:"trade_status"`
	Seq      int64  `json:"seq"`
}

// tradeNotifies makes the notifications of trades: WAIT_BUYER_PAY, then
// TRADE_SUCCESS and TRADE_FINISHED, or TRADE_CLOSED; a TRADE_SUCCESS sent
// again after the close, as a new notification (the bug entity order
// exists for); every tenth notification re-sent unchanged. Shuffled over
// the partitions, as a channel whose callbacks land on any partition. It
// returns the records, each trade's newest status, and the distinct
// notifications.
func tradeNotifies(seed uint64, trades, partitions int) ([]kafkago.Message, map[string]string, int) {
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
	msgs := make([]kafkago.Message, len(ns))
	for i, n := range ns {
		v, _ := json.Marshal(n)
		msgs[i] = kafkago.Message{Partition: rng.IntN(partitions), Key: []byte(n.TradeNo), Value: v}
	}
	return msgs, newest, distinct
}

// byTrade is Config.Entity: the trade, at its notification's sequence.
func byTrade(m *consumer.Message) (consumer.Entity, error) {
	var n tradeNotify
	if err := json.Unmarshal(m.Value, &n); err != nil {
		return consumer.Entity{}, err
	}
	return consumer.Entity{Name: n.TradeNo, Version: dedup.Version{Major: n.Seq}}, nil
}

// TestKafkaEntityTradeStatus: the notifications of 300 trades, shuffled
// over 4 partitions and re-sent, through the real broker and Postgres,
// with key rows over key lanes, with offsets in the store, and dead-
// lettering the stale ones: every trade ends in its newest status, each
// notification is applied once or is stale (recorded, and with
// StaleDeadLetter dead-lettered), and each trade's applied sequences rise.
func TestKafkaEntityTradeStatus(t *testing.T) {
	for _, tc := range []struct {
		name     string
		keyLanes int
		batch    int
		offsets  bool
		stale    consumer.StalePolicy
	}{
		{name: "keylanes", keyLanes: 4, batch: 100},
		{name: "offsets", batch: 100, offsets: true},
		{name: "batch=1/deadletter", batch: 1, stale: consumer.StaleDeadLetter},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const partitions, trades = 4, 300
			brokers, a, topic, group := kafkaTest(t, partitions)
			b := newTestBank(t)
			ctx := ctxTimeout(t, 3*time.Minute)
			tradesT := pgx.Identifier{b.schema, "trades"}.Sanitize()
			events := pgx.Identifier{b.schema, "trade_events"}.Sanitize()
			if _, err := b.pool.Exec(ctx, `CREATE TABLE `+tradesT+` (trade_no text PRIMARY KEY, status text NOT NULL, seq bigint NOT NULL);
				CREATE TABLE `+events+` (id bigserial PRIMARY KEY, notify_id text NOT NULL, trade_no text NOT NULL, seq bigint NOT NULL)`); err != nil {
				t.Fatal(err)
			}
			msgs, newest, distinct := tradeNotifies(40, trades, partitions)
			a.Produce(t, topic, msgs...)
			dl := &consumertest.DeadLetters{}
			src := newSource(t, realSourceConfig(t, brokers, topic, group))
			cfg := consumer.Config[pgx.Tx]{
				Name: "alipay", Source: src, Store: b.store, DeadLetter: dl, Logger: testLogger(t),
				Key: consumer.ByJSONField("notify_id"), Entity: byTrade, Stale: tc.stale,
				KeyLanes: tc.keyLanes, BatchSize: tc.batch,
				Handler: consumer.HandlerFunc[pgx.Tx](func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
					var n tradeNotify
					if err := json.Unmarshal(m.Value, &n); err != nil {
						return consumer.Permanent(err)
					}
					// The handler a user writes: the newest status wins, no
					// version check of its own.
					if _, err := tx.Exec(ctx, `INSERT INTO `+tradesT+` (trade_no, status, seq) VALUES ($1, $2, $3)
						ON CONFLICT (trade_no) DO UPDATE SET status = excluded.status, seq = excluded.seq`, n.TradeNo, n.Status, n.Seq); err != nil {
						return err
					}
					_, err := tx.Exec(ctx, `INSERT INTO `+events+` (notify_id, trade_no, seq) VALUES ($1, $2, $3)`, n.NotifyID, n.TradeNo, n.Seq)
					return err
				}),
			}
			if tc.offsets {
				cfg.Offsets = b.store
			}
			r := start(t, cfg)
			count := func(q string) int {
				var n int
				if err := b.pool.QueryRow(ctx, q).Scan(&n); err != nil {
					t.Fatal(err)
				}
				return n
			}
			waitUntil(t, 2*time.Minute, "every notification applied or stale", func() bool {
				st := r.Stats()
				return count(`SELECT count(*) FROM `+events)+int(st.Stale)+len(dl.Letters()) >= distinct
			})
			a.WaitNoLag(t, group, topic)
			r.Stop(t)

			applied := count(`SELECT count(*) FROM ` + events)
			if n := count(`SELECT count(DISTINCT notify_id) FROM ` + events); n != applied {
				t.Errorf("%d event rows of %d notifications: one applied twice", applied, n)
			}
			if n := count(`SELECT count(*) FROM (SELECT trade_no, seq, lag(seq) OVER (PARTITION BY trade_no ORDER BY id) AS prev FROM ` + events + `) s WHERE seq <= prev`); n != 0 {
				t.Errorf("%d notifications applied at or below their trade's sequence", n)
			}
			rows, err := b.pool.Query(ctx, `SELECT trade_no, status FROM `+tradesT)
			if err != nil {
				t.Fatal(err)
			}
			got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[struct {
				Trade  string
				Status string
			}])
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
			stale, err := b.store.StaleEvents(ctx, dedup.StaleFilter{Scope: "alipay", Limit: 10000})
			if err != nil {
				t.Fatal(err)
			}
			if applied+len(stale) != distinct {
				t.Errorf("%d applied + %d stale recorded = %d, want the %d notifications", applied, len(stale), applied+len(stale), distinct)
			}
			if want := trades / 3; len(stale) < want {
				t.Errorf("%d stale recorded, want at least the %d TRADE_SUCCESS re-sent after TRADE_CLOSED", len(stale), want)
			}
			letters := dl.Letters()
			switch {
			case tc.stale == consumer.StaleDeadLetter && len(letters) != len(stale):
				t.Errorf("%d letters, want one per stale notification (%d)", len(letters), len(stale))
			case tc.stale == consumer.StaleSkip && len(letters) != 0:
				t.Errorf("%d letters, want none: %v", len(letters), letters[0].Reason)
			case tc.stale == consumer.StaleSkip && r.Stats().Stale != int64(len(stale)):
				t.Errorf("Stats.Stale %d, %d recorded", r.Stats().Stale, len(stale))
			}
			for _, l := range letters {
				if l.Cause != consumer.CauseStale || l.Watermark.Compare(l.Entity.Version) < 0 {
					t.Errorf("letter %s: cause %v, version %v, watermark %v", l.Message.Coordinates(), l.Cause, l.Entity.Version, l.Watermark)
				}
			}
		})
	}
}
