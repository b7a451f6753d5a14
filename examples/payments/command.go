package payments

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/source"
	"github.com/idemkit/idem/dedup/pgstore"
)

// The commands examples/kafka-payments and examples/rocketmq-payments share
// what is not their broker's: the flags, the database, the demo's orders and
// callbacks, the consumer and its run.

// Flags are the flags both commands take besides their broker's.
type Flags struct {
	Postgres, Topic, Group string
	Demo                   bool
}

// RegisterFlags defines -postgres (default $IDEM_TEST_PG_URL or the test
// environment's), -topic, -group and -demo on fs.
func RegisterFlags(fs *flag.FlagSet) *Flags {
	f := &Flags{}
	fs.StringVar(&f.Postgres, "postgres", envOr("IDEM_TEST_PG_URL", "postgres://postgres@127.0.0.1:5432/idem_test?sslmode=disable"), "Postgres URL")
	fs.StringVar(&f.Topic, "topic", "payment-callbacks", "topic of the channel's callbacks")
	fs.StringVar(&f.Group, "group", "payments-ledger", "consumer group")
	fs.BoolVar(&f.Demo, "demo", false, "create three orders and publish each callback three times")
	return f
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// Open connects to f.Postgres, creates the four tables when missing and
// migrates idem's dedup table; with f.Demo it then creates three orders
// and hands publish their callbacks (DemoCallbacks). The caller closes the
// pool.
func Open(ctx context.Context, f *Flags, publish func(context.Context, []Callback) error) (*pgxpool.Pool, *pgstore.Store, error) {
	pool, err := pgxpool.New(ctx, f.Postgres)
	if err != nil {
		return nil, nil, err
	}
	store, err := open(ctx, pool, f.Demo, publish)
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return pool, store, nil
}

func open(ctx context.Context, pool *pgxpool.Pool, demo bool, publish func(context.Context, []Callback) error) (*pgstore.Store, error) {
	if err := Setup(ctx, Pgx(pool)); err != nil {
		return nil, err
	}
	store, err := pgstore.New(pool, pgstore.Config{}) // keys kept forever: a channel may re-send months later
	if err != nil {
		return nil, err
	}
	if err := store.Migrate(ctx); err != nil {
		return nil, err
	}
	if demo {
		cbs, err := DemoCallbacks(ctx, Pgx(pool))
		if err == nil {
			err = publish(ctx, cbs)
		}
		if err != nil {
			return nil, fmt.Errorf("demo: %w", err)
		}
	}
	return store, nil
}

// DemoCallbacks creates three orders and returns each one's callback three
// times, plus a callback for an order nobody placed.
func DemoCallbacks(ctx context.Context, db DB) ([]Callback, error) {
	suffix := time.Now().Format("150405")
	var cbs []Callback
	for i := 1; i <= 3; i++ {
		order := Order{ID: fmt.Sprintf("o-%s-%d", suffix, i), Account: "merchant-demo", SKU: "sku-demo", Amount: int64(1000 * i)}
		if err := CreateOrders(ctx, db, []Order{order}); err != nil {
			return nil, err
		}
		cb := Callback{TxnID: fmt.Sprintf("wx-%s-%d", suffix, i), OrderID: order.ID, Amount: order.Amount, Channel: "wechat", Status: "SUCCESS"}
		for range 3 {
			cbs = append(cbs, cb)
		}
	}
	return append(cbs, Callback{TxnID: "wx-" + suffix + "-x", OrderID: "nobody", Amount: 5, Channel: "wechat", Status: "SUCCESS"}), nil
}

// ConsumerConfig is the ledger consumer on Postgres: src's callbacks, keyed
// by KeyField, applied by Handler, the bad ones to dl.
func ConsumerConfig(src source.Source, dl consumer.DeadLetter, store *pgstore.Store, log *slog.Logger) consumer.Config[pgx.Tx] {
	return consumer.Config[pgx.Tx]{
		Name:            "payments-ledger", // the dedup scope: keep it when the group changes
		Source:          src,
		DeadLetter:      dl,
		Store:           store,
		Handler:         Handler(func(tx pgx.Tx) DB { return Pgx(tx) }),
		Key:             consumer.ByJSONField(KeyField),
		MaxPayloadBytes: MaxPayload,
		DrainTimeout:    30 * time.Second,
		Logger:          log,
	}
}

// Run runs c until ctx ends and logs what it booked.
func Run(ctx context.Context, c *consumer.Consumer[pgx.Tx], f *Flags, log *slog.Logger) error {
	log.Info("consuming; Ctrl-C to stop", slog.String("topic", f.Topic), slog.String("group", f.Group))
	err := c.Run(ctx) // Ctrl-C drains: what is in flight is finished and acknowledged
	st := c.Stats()
	log.Info("stopped", slog.Int64("applied", st.Applied), slog.Int64("duplicates", st.Duplicates),
		slog.Int64("dead_lettered", st.DeadLettered))
	return err
}
