package kafka_test

import (
	"context"
	"log"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/adapters/kafka"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/dedup/pgstore"
)

// A payment-callback consumer: Kafka in, Postgres out, one effect per channel
// transaction number. (Not run: it needs a broker and a database;
// examples/kafka-payments is the whole program.)
func Example() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	pool, err := pgxpool.New(ctx, "postgres://127.0.0.1:5432/shop")
	if err != nil {
		log.Fatal(err)
	}
	store, err := pgstore.New(pool, pgstore.Config{})
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	brokers := []string{"127.0.0.1:9092"}
	src, err := kafka.New(kafka.Config{Brokers: brokers, Topics: []string{"payment-callbacks"}, Group: "ledger"})
	if err != nil {
		log.Fatal(err)
	}
	c, err := consumer.New(consumer.Config[pgx.Tx]{
		Name:       "ledger",
		Source:     src,
		Store:      store,
		DeadLetter: src, // to payment-callbacks.dlq
		Key:        consumer.ByJSONField("txn_id"),
		Handler: consumer.HandlerFunc[pgx.Tx](func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			_, err := tx.Exec(ctx, `INSERT INTO ledger (txn_id, payload) VALUES ($1, $2)`, m.Key, m.Value)
			return err
		}),
	})
	if err != nil {
		log.Fatal(err)
	}
	go func() {
		<-ctx.Done()
		stopCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = c.Stop(stopCtx) // finishes the batches in flight, commits their offsets
	}()
	if err := c.Run(context.Background()); err != nil {
		log.Fatal(err)
	}
}
