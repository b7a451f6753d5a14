package kafka_test

import (
	"context"
	"log"
	"os"
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
	// SIGTERM or Ctrl-C ends ctx; DrainTimeout makes that a graceful stop.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
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
	src, err := kafka.New(kafka.Config{
		Brokers: []string{"127.0.0.1:9092"},
		Topics:  []string{"payment-callbacks"},
		Group:   "ledger",
	})
	if err != nil {
		log.Fatal(err)
	}

	txnID := consumer.ByJSONField("txn_id") // the channel's transaction number
	c, err := consumer.New(consumer.Config[pgx.Tx]{
		Name:       "ledger",
		Source:     src,
		DeadLetter: src, // to payment-callbacks.dlq, with the reason in headers
		Store:      store,
		Key:        txnID,
		Handler: consumer.HandlerFunc[pgx.Tx](func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			id, err := txnID(m) // the dedup key, not m.Key (the record key)
			if err != nil {
				return consumer.Permanent(err)
			}
			_, err = tx.Exec(ctx, `INSERT INTO ledger (txn_id, payload) VALUES ($1, $2)`, id, m.Value)
			return err
		}),
		// When ctx ends: finish and acknowledge what is in flight, for up
		// to 30s, then give the rest back (it is redelivered).
		DrainTimeout: 30 * time.Second,
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := c.Run(ctx); err != nil {
		log.Fatal(err)
	}
}
