package outbox_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/dedup/pgstore"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/outbox"
)

// BenchmarkConsumerBatch is what the outbox costs a consumer: the same
// consumer (pgstore, four lanes, batches of 100) without an outbox and with
// one outgoing message per input. handler/*: a Handler inserting one
// ledger row per message, and Enqueue per message; "+notify" adds the
// NOTIFY a LISTENing relay would need (the wakeup the relay does not use;
// see the package doc). batch/*: a BatchHandler inserting the batch's
// ledger rows in one statement, and EnqueueAll for the batch. Run it on a
// durable Postgres to see what NOTIFY's commit lock costs:
//
//	IDEM_TEST_PG_URL=$IDEM_BENCH_PG_URL go test -run '^$' -bench ConsumerBatch -benchtime 20000x ./outbox/
func BenchmarkConsumerBatch(b *testing.B) {
	payload := `{"txn_id":"T%09d","order_id":"O-%06d","amount":%d,"currency":"CNY","channel":"wechat","status":"SUCCESS"}`
	for _, mode := range []string{"handler/no-outbox", "handler/outbox", "handler/outbox+notify", "batch/no-outbox", "batch/outbox"} {
		b.Run(mode, func(b *testing.B) {
			pool, schema := testenv.SchemaPool(b)
			ctx := context.Background()
			st, err := pgstore.New(pool, pgstore.Config{Schema: schema})
			if err != nil {
				b.Fatal(err)
			}
			ob, err := outbox.New(pool, outbox.Config{Schema: schema})
			if err != nil {
				b.Fatal(err)
			}
			if err := st.Migrate(ctx); err != nil {
				b.Fatal(err)
			}
			if err := ob.Migrate(ctx); err != nil {
				b.Fatal(err)
			}
			if _, err := pool.Exec(ctx, `CREATE TABLE ledger (txn_id text PRIMARY KEY, amount bigint NOT NULL)`); err != nil {
				b.Fatal(err)
			}
			msgs := make([]*consumer.Message, b.N)
			for i := range msgs {
				msgs[i] = consumertest.Message("payments", int32(i%4), int64(i/4), "", fmt.Sprintf(payload, i, i%100000, 100+i%1000))
			}
			handler := consumer.HandlerFunc[pgx.Tx](func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
				k, _ := m.DedupKey()
				if _, err := tx.Exec(ctx, `INSERT INTO ledger (txn_id, amount) VALUES ($1, 1)`, k.ID); err != nil {
					return err
				}
				if mode == "handler/no-outbox" {
					return nil
				}
				if err := ob.Enqueue(ctx, tx, m, outbox.Message{Topic: "order.paid", Key: m.Key, Value: m.Value}); err != nil {
					return err
				}
				if mode == "handler/outbox+notify" {
					_, err := tx.Exec(ctx, `SELECT pg_notify('idem_outbox', '')`)
					return err
				}
				return nil
			})
			batch := consumer.BatchHandlerFunc[pgx.Tx](func(ctx context.Context, tx pgx.Tx, ms []*consumer.Message) error {
				ids := make([]string, len(ms))
				var out []outbox.Outgoing
				for i, m := range ms {
					k, _ := m.DedupKey()
					ids[i] = k.ID
					if mode == "batch/outbox" {
						out = append(out, outbox.Outgoing{From: m, Messages: []outbox.Message{{Topic: "order.paid", Key: m.Key, Value: m.Value}}})
					}
				}
				if _, err := tx.Exec(ctx, `INSERT INTO ledger (txn_id, amount) SELECT unnest($1::text[]), 1`, ids); err != nil {
					return err
				}
				return ob.EnqueueAll(ctx, tx, out)
			})
			cfg := consumer.Config[pgx.Tx]{Name: "payments", Store: st, Key: consumer.ByJSONField("txn_id"), BatchSize: 100, Logger: quiet}
			if strings.HasPrefix(mode, "batch/") {
				cfg.BatchHandler = batch
			} else {
				cfg.Handler = handler
			}
			b.ResetTimer()
			res := consumertest.Run(b, cfg, consumertest.Script{}, msgs...)
			b.StopTimer()
			if res.Stats.Applied != int64(b.N) {
				b.Fatalf("applied %d of %d", res.Stats.Applied, b.N)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/msg")
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
		})
	}
}
