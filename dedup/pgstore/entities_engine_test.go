package pgstore_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/pgstore"
	"github.com/idemkit/idem/internal/testenv"
)

// tradeSeq is one notification of a trade's status at its sequence.
type tradeSeq struct {
	ID    string `json:"id"`
	Trade string `json:"trade"`
	Seq   int64  `json:"seq"`
}

// tradeSeqs makes three notifications per trade and, on every third
// trade, a late re-send of sequence 1 as a new notification, shuffled
// over 4 partitions, record-keyed by the notification (so a trade's
// events spread over key lanes too). It returns them and their number.
func tradeSeqs(seed uint64, trades int) ([]*consumer.Message, int) {
	rng := rand.New(rand.NewPCG(seed, seed))
	var msgs []*consumer.Message
	add := func(tr string, seq int64, id string) {
		v, _ := json.Marshal(tradeSeq{ID: id, Trade: tr, Seq: seq})
		msgs = append(msgs, consumertest.Message("notify", int32(rng.IntN(4)), 0, id, string(v)))
	}
	for i := range trades {
		tr := fmt.Sprintf("T%04d", i)
		for seq := int64(1); seq <= 3; seq++ {
			add(tr, seq, fmt.Sprintf("%s-%d", tr, seq))
		}
		if i%3 == 0 {
			add(tr, 1, tr+"-again-1")
		}
	}
	rng.Shuffle(len(msgs), func(i, j int) { msgs[i], msgs[j] = msgs[j], msgs[i] })
	offsets := map[int32]int64{}
	for _, m := range msgs {
		m.Offset = offsets[m.Partition]
		offsets[m.Partition]++
		m.ID = fmt.Sprintf("notify/%d/%d", m.Partition, m.Offset)
	}
	return msgs, len(msgs)
}

// TestEntityOrderInEveryLayout: 150 trades' notifications through the
// consumer, over 4 partitions and 4 key lanes keyed by the notification
// (a trade's events meet in several lanes at once), delivered twice,
// reordered, with lost acks, in batches of 1 and 50, on the plain,
// partitioned (PartitionWidth) and distributed (SERIALIZABLE, statement
// timeouts) layouts: on real
// Postgres every trade ends at its highest sequence, no trade's applied
// sequence ever falls, and every notification is applied once or is
// recorded stale, counted once.
func TestEntityOrderInEveryLayout(t *testing.T) {
	for _, layout := range []string{"plain", "partitioned", "distributed"} {
		for _, batch := range []int{1, 50} {
			t.Run(fmt.Sprintf("%s/batch=%d", layout, batch), func(t *testing.T) {
				var pool *pgxpool.Pool
				cfg := pgstore.Config{}
				switch layout {
				case "distributed":
					d := testenv.NewDistributed(t)
					pool, cfg.Schema, cfg.Distributed = d.Pool, d.Schema, true
				default:
					pool = testenv.Pool(t)
					cfg.Schema = testenv.Schema(t, pool)
					if layout == "partitioned" {
						cfg.PartitionWidth = time.Hour
					}
				}
				st, err := pgstore.New(pool, cfg)
				if err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				defer cancel()
				if err := st.Migrate(ctx); err != nil {
					t.Fatal(err)
				}
				tradesT := pgx.Identifier{cfg.Schema, "trades"}.Sanitize()
				events := pgx.Identifier{cfg.Schema, "trade_events"}.Sanitize()
				if _, err := pool.Exec(ctx, `CREATE TABLE `+tradesT+` (trade text PRIMARY KEY, seq bigint NOT NULL)`); err != nil {
					t.Fatal(err)
				}
				if _, err := pool.Exec(ctx, `CREATE TABLE `+events+` (id bigserial PRIMARY KEY, nid text NOT NULL, trade text NOT NULL, seq bigint NOT NULL)`); err != nil {
					t.Fatal(err)
				}
				const trades = 150
				msgs, distinct := tradeSeqs(uint64(batch), trades)
				ccfg := consumer.Config[pgx.Tx]{
					Name: "alipay", Store: st, Logger: quiet, BatchSize: batch, KeyLanes: 4,
					Key: consumer.ByJSONField("id"),
					Entity: func(m *consumer.Message) (consumer.Entity, error) {
						var n tradeSeq
						err := json.Unmarshal(m.Value, &n)
						return consumer.Entity{Name: n.Trade, Version: dedup.Version{Major: n.Seq}}, err
					},
					Handler: consumer.HandlerFunc[pgx.Tx](func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
						var n tradeSeq
						if err := json.Unmarshal(m.Value, &n); err != nil {
							return consumer.Permanent(err)
						}
						if _, err := tx.Exec(ctx, `INSERT INTO `+tradesT+` (trade, seq) VALUES ($1, $2)
								ON CONFLICT (trade) DO UPDATE SET seq = excluded.seq`, n.Trade, n.Seq); err != nil {
							return err
						}
						_, err := tx.Exec(ctx, `INSERT INTO `+events+` (nid, trade, seq) VALUES ($1, $2, $3)`, n.ID, n.Trade, n.Seq)
						return err
					}),
				}
				res := consumertest.Run(t, ccfg, consumertest.Script{Seed: uint64(batch), MinDeliveries: 1, MaxDeliveries: 2, ReorderWindow: 8, CrashAfterCommitEvery: 37}, msgs...)

				count := func(q string) int {
					var n int
					if err := pool.QueryRow(ctx, q).Scan(&n); err != nil {
						t.Fatal(err)
					}
					return n
				}
				applied := count(`SELECT count(*) FROM ` + events)
				if n := count(`SELECT count(DISTINCT nid) FROM ` + events); n != applied {
					t.Errorf("%d event rows of %d notifications: one applied twice", applied, n)
				}
				if n := count(`SELECT count(*) FROM (SELECT seq, lag(seq) OVER (PARTITION BY trade ORDER BY id) AS prev FROM ` + events + `) s WHERE seq <= prev`); n != 0 {
					t.Errorf("%d notifications applied at or below their trade's sequence", n)
				}
				if n := count(`SELECT count(*) FROM ` + tradesT + ` WHERE seq = 3`); n != trades {
					t.Errorf("%d of %d trades at sequence 3", n, trades)
				}
				stale, err := st.StaleEvents(ctx, dedup.StaleFilter{Scope: "alipay", Limit: 10000})
				if err != nil {
					t.Fatal(err)
				}
				if applied+len(stale) != distinct || res.Stats.Stale != int64(len(stale)) {
					t.Errorf("%d applied + %d stale recorded (Stats.Stale %d), want the %d notifications; %v", applied, len(stale), res.Stats.Stale, distinct, res)
				}
				if len(stale) < trades/3 {
					t.Errorf("%d stale recorded, want at least the %d late re-sends", len(stale), trades/3)
				}
				t.Logf("%v, stale %d", res, len(stale))
			})
		}
	}
}

// TestEntityOneBatchOfOneTrade: one batch holds a trade's events
// in this order: seq 1, 3, 3 again under a new notification (equal: not
// ordered, stale), 2 (stale), 2's copy under its own key (a duplicate in
// the same claim), 4, then the same again delivered later (all
// duplicates). On real Postgres seq 1, 3 and 4 apply in that order, two
// events are recorded stale once, and nothing else is counted stale.
func TestEntityOneBatchOfOneTrade(t *testing.T) {
	pool, schema, st, _ := effectsRig(t, pgstore.Config{})
	ctx := context.Background()
	events := pgx.Identifier{schema, "trade_events"}.Sanitize()
	if _, err := pool.Exec(ctx, `CREATE TABLE `+events+` (id bigserial PRIMARY KEY, nid text NOT NULL, seq bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	var msgs []*consumer.Message
	for i, n := range []tradeSeq{{"n1", "T1", 1}, {"n3", "T1", 3}, {"n3b", "T1", 3}, {"n2", "T1", 2}, {"n2", "T1", 2}, {"n4", "T1", 4}} {
		v, _ := json.Marshal(n)
		msgs = append(msgs, consumertest.Message("notify", 0, int64(i), n.ID, string(v)))
	}
	cfg := consumer.Config[pgx.Tx]{
		// The six in one batch whatever the machine's pace: the lane waits
		// for the batch to fill (without BatchWait, a busy machine split it).
		Name: "alipay", Store: st, Logger: quiet, BatchSize: len(msgs), BatchWait: time.Minute, Key: consumer.ByJSONField("id"),
		Entity: func(m *consumer.Message) (consumer.Entity, error) {
			var n tradeSeq
			err := json.Unmarshal(m.Value, &n)
			return consumer.Entity{Name: n.Trade, Version: dedup.Version{Major: n.Seq}}, err
		},
		Handler: consumer.HandlerFunc[pgx.Tx](func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			var n tradeSeq
			if err := json.Unmarshal(m.Value, &n); err != nil {
				return consumer.Permanent(err)
			}
			_, err := tx.Exec(ctx, `INSERT INTO `+events+` (nid, seq) VALUES ($1, $2)`, n.ID, n.Seq)
			return err
		}),
	}
	first := consumertest.Run(t, cfg, consumertest.Script{}, msgs...)
	if first.Stats.Commits != 1 {
		t.Fatalf("%v: the test needs the six in one batch", first)
	}
	for i, m := range msgs {
		m.Offset = int64(len(msgs) + i)
	}
	again := consumertest.Run(t, cfg, consumertest.Script{}, msgs...)

	rows, err := pool.Query(ctx, `SELECT nid FROM `+events+` ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	applied, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(applied) != "[n1 n3 n4]" {
		t.Errorf("applied %v, want [n1 n3 n4]", applied)
	}
	stale, err := st.StaleEvents(ctx, dedup.StaleFilter{Scope: "alipay"})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, s := range stale {
		got = append(got, fmt.Sprintf("%s@%s/%s", s.Key.ID, s.Version, s.Watermark))
	}
	if fmt.Sprint(got) != "[n2@2.0/3.0 n3b@3.0/3.0]" {
		t.Errorf("stale records %v, want n2 and n3b against watermark 3", got)
	}
	if first.Stats.Stale != 2 || first.Stats.Duplicates != 1 || again.Stats.Stale != 0 || again.Stats.Duplicates != 6 {
		t.Errorf("first run %v (stale %d), second %v (stale %d): want 2 stale and 1 duplicate, then 6 duplicates", first, first.Stats.Stale, again, again.Stats.Stale)
	}
}
