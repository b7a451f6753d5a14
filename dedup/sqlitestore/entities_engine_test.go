package sqlitestore_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/sqlitestore"
	"github.com/idemkit/idem/internal/testenv/sqlitetest"
)

// trade is one notification of a trade's status at its sequence.
type trade struct {
	ID    string `json:"id"`
	Trade string `json:"trade"`
	Seq   int64  `json:"seq"`
}

// TestEntityOrderDrivenByTheConsumer: 120 trades' notifications (three
// sequences each, and a late re-send of sequence 1 as a new notification
// on every third), shuffled over 4 partitions, so that one trade's events
// meet in 4 lanes at once, each also split over 4 key lanes by the
// notification's own record key (not the trade): delivered twice,
// reordered, with lost acks, in batches of 1 and 50. On SQLite every
// trade ends at its highest sequence, no trade's applied sequence ever
// falls, and every notification is applied once or recorded stale.
func TestEntityOrderDrivenByTheConsumer(t *testing.T) {
	for _, batch := range []int{1, 50} {
		t.Run(fmt.Sprintf("batch=%d", batch), func(t *testing.T) {
			st, db := sqlitetest.Store(t, sqlitestore.Config{})
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			if _, err := db.ExecContext(ctx, `CREATE TABLE trades (trade TEXT PRIMARY KEY, seq INTEGER NOT NULL)`); err != nil {
				t.Fatal(err)
			}
			if _, err := db.ExecContext(ctx, `CREATE TABLE trade_events (id INTEGER PRIMARY KEY AUTOINCREMENT, nid TEXT NOT NULL, trade TEXT NOT NULL, seq INTEGER NOT NULL)`); err != nil {
				t.Fatal(err)
			}
			const trades = 120
			rng := rand.New(rand.NewPCG(7, uint64(batch)))
			var msgs []*consumer.Message
			distinct := 0
			add := func(tr string, seq int64, id string) {
				v, _ := json.Marshal(trade{ID: id, Trade: tr, Seq: seq})
				msgs = append(msgs, consumertest.Message("notify", int32(rng.IntN(4)), 0, id, string(v)))
				distinct++
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
			res := consumertest.Run(t, consumer.Config[*sql.Tx]{
				Name: "alipay", Store: st, Logger: slog.New(slog.DiscardHandler), BatchSize: batch, KeyLanes: 4,
				Key: consumer.ByJSONField("id"),
				Entity: func(m *consumer.Message) (consumer.Entity, error) {
					var n trade
					err := json.Unmarshal(m.Value, &n)
					return consumer.Entity{Name: n.Trade, Version: dedup.Version{Major: n.Seq}}, err
				},
				Handler: consumer.HandlerFunc[*sql.Tx](func(ctx context.Context, tx *sql.Tx, m *consumer.Message) error {
					var n trade
					if err := json.Unmarshal(m.Value, &n); err != nil {
						return consumer.Permanent(err)
					}
					if _, err := tx.ExecContext(ctx, `INSERT INTO trades (trade, seq) VALUES (?, ?) ON CONFLICT (trade) DO UPDATE SET seq = excluded.seq`, n.Trade, n.Seq); err != nil {
						return err
					}
					_, err := tx.ExecContext(ctx, `INSERT INTO trade_events (nid, trade, seq) VALUES (?, ?, ?)`, n.ID, n.Trade, n.Seq)
					return err
				}),
			}, consumertest.Script{Seed: uint64(batch), MinDeliveries: 1, MaxDeliveries: 2, ReorderWindow: 8, CrashAfterCommitEvery: 37}, msgs...)

			count := func(q string) int {
				var n int
				if err := db.QueryRowContext(ctx, q).Scan(&n); err != nil {
					t.Fatal(err)
				}
				return n
			}
			applied := count(`SELECT count(*) FROM trade_events`)
			if n := count(`SELECT count(DISTINCT nid) FROM trade_events`); n != applied {
				t.Errorf("%d event rows of %d notifications: one applied twice", applied, n)
			}
			if n := count(`SELECT count(*) FROM trade_events a JOIN trade_events b ON a.trade = b.trade AND b.id > a.id AND b.seq <= a.seq`); n != 0 {
				t.Errorf("%d notifications applied at or below their trade's sequence", n)
			}
			if n := count(`SELECT count(*) FROM trades WHERE seq = 3`); n != trades {
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
