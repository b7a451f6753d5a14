package rocketmq_test

import (
	"context"
	"log"
	"log/slog"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/adapters/rocketmq"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/dedup/pgstore"
)

// A payment-callback consumer: RocketMQ in, Postgres out, one effect per
// channel transaction number. (Not run: it needs a broker and a database;
// examples/rocketmq-payments is the whole program.)
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
	rocketmq.SetClientLogger(slog.Default(), slog.LevelWarn) // the client library's logs, bodies left out
	src, err := rocketmq.New(rocketmq.Config{
		NameServers: []string{"127.0.0.1:9876"},
		Group:       "ledger",
		Topics:      []string{"payment-callbacks"}, // and payment-callbacks_DLQ for dead letters
	})
	if err != nil {
		log.Fatal(err)
	}

	c, err := consumer.New(consumer.Config[pgx.Tx]{
		Name:       "ledger",
		Source:     src,
		DeadLetter: src, // payment-callbacks_DLQ, with the reason as a property
		Store:      store,
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
		_ = c.Stop(stopCtx) // finishes the calls in flight; they return ConsumeSuccess
	}()
	if err := c.Run(context.Background()); err != nil {
		log.Fatal(err)
	}
}
