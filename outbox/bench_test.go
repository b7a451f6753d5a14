package outbox_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/pgstore"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/internal/testenv/relaytest"
	"github.com/idemkit/idem/outbox"
)

// BenchmarkConsumerBatch is what the outbox costs a consumer: the same
// consumer (pgstore, four lanes, batches of 100) without an outbox and with
// one outgoing message per input. handler/*: a Handler inserting one
// ledger row per message, and Enqueue per message; "+notify" adds the
// NOTIFY a LISTENing relay would need (the wakeup the relay does not use;
// see the package doc). batch/*: a BatchHandler inserting the batch's
// ledger rows in one statement, and EnqueueAll for the batch (and one
// NOTIFY per transaction). Run it on a
// durable Postgres to see what NOTIFY's commit lock costs:
//
//	IDEM_TEST_PG_URL=$IDEM_BENCH_PG_URL go test -run '^$' -bench ConsumerBatch -benchtime 20000x ./outbox/
func BenchmarkConsumerBatch(b *testing.B) {
	payload := `{"txn_id":"T%09d","order_id":"O-%06d","amount":%d,"currency":"CNY","channel":"wechat","status":"SUCCESS"}`
	for _, mode := range []string{"handler/no-outbox", "handler/outbox", "handler/outbox+notify", "batch/no-outbox", "batch/outbox", "batch/outbox+notify"} {
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
					if mode != "batch/no-outbox" {
						out = append(out, outbox.Outgoing{From: m, Messages: []outbox.Message{{Topic: "order.paid", Key: m.Key, Value: m.Value}}})
					}
				}
				if _, err := tx.Exec(ctx, `INSERT INTO ledger (txn_id, amount) SELECT unnest($1::text[]), 1`, ids); err != nil {
					return err
				}
				if err := ob.EnqueueAll(ctx, tx, out); err != nil || mode != "batch/outbox+notify" {
					return err
				}
				_, err := tx.Exec(ctx, `SELECT pg_notify('idem_outbox', '')`)
				return err
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

// BenchmarkRelayDrain is the relay's database side alone: rounds of 500
// rows (1,000 keys, 256-byte values) read, handed to a publisher that
// returns at once, deleted and committed. It bounds what a relay can
// publish whatever the broker.
func BenchmarkRelayDrain(b *testing.B) {
	ob, pool, _ := relaytest.NewOutbox(b)
	ctx := context.Background()
	value := []byte(fmt.Sprintf("%0256d", 0))
	for i := 0; i < b.N; i += 500 {
		var msgs []outbox.Message
		for j := i; j < min(i+500, b.N); j++ {
			msgs = append(msgs, outbox.Message{Topic: "order.paid", Key: []byte(fmt.Sprintf("O-%06d", j%1000)), Value: value})
		}
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			return ob.EnqueueFor(ctx, tx, dedup.Key{Scope: "payments", ID: fmt.Sprint(i)}, msgs...)
		}); err != nil {
			b.Fatal(err)
		}
	}
	relay, err := outbox.NewRelay(outbox.RelayConfig{Outbox: ob, Publisher: outbox.PublisherFunc(func(context.Context, []outbox.Record, []error) {}),
		BatchSize: 500, PollInterval: time.Millisecond, Logger: quiet})
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan error, 1)
	b.ResetTimer()
	go func() { done <- relay.Run(ctx) }()
	for relay.Stats().Published < int64(b.N) {
		if b.Elapsed() > 5*time.Minute {
			_ = relay.Stop(ctx)
			<-done
			b.Fatalf("stats %+v after 5 minutes", relay.Stats())
		}
		time.Sleep(time.Millisecond)
	}
	b.StopTimer()
	if err := relay.Stop(ctx); err != nil {
		b.Fatal(err)
	}
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}
