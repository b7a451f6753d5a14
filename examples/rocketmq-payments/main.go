// Command rocketmq-payments books payment-channel callbacks from RocketMQ
// into Postgres, once each, however often the channel re-sends a callback or
// RocketMQ redelivers it.
//
// A callback says that the channel captured a payment for an order:
//
//	{"txn_id":"wx-4200001","order_id":"o-1","amount":1299,"status":"SUCCESS"}
//
// The handler and the four tables (orders, ledger, accounts, inventory) are
// examples/payments. The dedup key is the channel's transaction number
// (txn_id): the row in idem's dedup table, the order marked paid, the ledger
// line, the balance and the inventory commit in one transaction, and only
// then does the consume call return ConsumeSuccess. Callbacks that cannot be
// booked (not JSON, unknown order, wrong amount, an order paid twice by
// different transactions) go to the dead-letter topic <topic>_DLQ, with the
// reason as a property, for the reconciliation team.
//
// Create the topics first (the push consumer does not start on a missing
// topic), or run it against the test environment with -demo, which creates
// three orders and publishes each callback three times (the test broker
// creates topics on first use):
//
//	eval "$(scripts/testenv.sh up postgres rocketmq)"
//	go run ./examples/rocketmq-payments -demo
//
// RocketMQ's own tools work as well:
//
//	scripts/testenv/rocketmq.sh admin sendMessage -t payment-callbacks -k wx-1 \
//	  -p '{"txn_id":"wx-1","order_id":"o-1","amount":1299,"status":"SUCCESS"}'
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/adapters/rocketmq"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/dedup/pgstore"
	"github.com/idemkit/idem/examples/payments"
)

func main() {
	namesrv := flag.String("namesrv", "127.0.0.1:9876", "RocketMQ name servers, comma separated")
	pgURL := flag.String("postgres", envOr("IDEM_TEST_PG_URL", "postgres://postgres@127.0.0.1:5432/idem_test?sslmode=disable"), "Postgres URL")
	topic := flag.String("topic", "payment-callbacks", "topic of the channel's callbacks")
	group := flag.String("group", "payments-ledger", "consumer group")
	demo := flag.Bool("demo", false, "create three orders and publish each callback three times")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	rocketmq.SetClientLogger(log, slog.LevelError) // the client library's own logs: errors only
	if err := run(strings.Split(*namesrv, ","), *pgURL, *topic, *group, *demo, log); err != nil {
		log.Error("rocketmq-payments", slog.Any("error", err))
		os.Exit(1)
	}
}

func run(namesrv []string, pgURL, topic, group string, demo bool, log *slog.Logger) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	pool, err := pgxpool.New(ctx, pgURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := payments.Setup(ctx, payments.Pgx(pool)); err != nil {
		return err
	}
	store, err := pgstore.New(pool, pgstore.Config{}) // keys kept forever: a channel may re-send months later
	if err != nil {
		return err
	}
	if err := store.Migrate(ctx); err != nil {
		return err
	}
	if demo {
		if err := publishDemo(ctx, pool, namesrv, topic); err != nil {
			return fmt.Errorf("demo: %w", err)
		}
	}

	// The Source is the consumer's dead-letter sink too: <topic>_DLQ.
	src, err := rocketmq.New(rocketmq.Config{NameServers: namesrv, Group: group, Topics: []string{topic}, Logger: log})
	if err != nil {
		return err
	}
	c, err := consumer.New(consumer.Config[pgx.Tx]{
		Name:            "payments-ledger", // the dedup scope: keep it when the group changes
		Source:          src,
		DeadLetter:      src,
		Store:           store,
		Handler:         payments.Handler(func(tx pgx.Tx) payments.DB { return payments.Pgx(tx) }),
		Key:             consumer.ByJSONField(payments.KeyField),
		MaxPayloadBytes: payments.MaxPayload,
		DrainTimeout:    30 * time.Second,
		Logger:          log,
	})
	if err != nil {
		return err
	}

	log.Info("consuming; Ctrl-C to stop", slog.String("topic", topic), slog.String("group", group))
	err = c.Run(ctx) // Ctrl-C drains: what is in flight is finished and acknowledged
	st := c.Stats()
	log.Info("stopped", slog.Int64("applied", st.Applied), slog.Int64("duplicates", st.Duplicates),
		slog.Int64("dead_lettered", st.DeadLettered))
	return err
}

// publishDemo creates three orders and sends each one's callback three
// times, plus a callback for an order nobody placed.
func publishDemo(ctx context.Context, pool *pgxpool.Pool, namesrv []string, topic string) error {
	p, err := producer.NewDefaultProducer(producer.WithNsResolver(primitive.NewPassthroughResolver(namesrv)),
		producer.WithGroupName("payments-demo"), producer.WithRetry(2))
	if err != nil {
		return err
	}
	if err := p.Start(); err != nil {
		return err
	}
	defer p.Shutdown()
	send := func(cb payments.Callback) error {
		body, _ := json.Marshal(cb)
		m := primitive.NewMessage(topic, body)
		m.WithKeys([]string{cb.TxnID}) // mqadmin queryMsgByKey finds it
		_, err := p.SendSync(ctx, m)
		return err
	}
	suffix := time.Now().Format("150405")
	for i := 1; i <= 3; i++ {
		order := payments.Order{ID: fmt.Sprintf("o-%s-%d", suffix, i), Account: "merchant-demo", SKU: "sku-demo", Amount: int64(1000 * i)}
		if err := payments.CreateOrders(ctx, payments.Pgx(pool), []payments.Order{order}); err != nil {
			return err
		}
		cb := payments.Callback{TxnID: fmt.Sprintf("wx-%s-%d", suffix, i), OrderID: order.ID, Amount: order.Amount, Channel: "wechat", Status: "SUCCESS"}
		for range 3 {
			if err := send(cb); err != nil {
				return err
			}
		}
	}
	return send(payments.Callback{TxnID: "wx-" + suffix + "-x", OrderID: "nobody", Amount: 5, Channel: "wechat", Status: "SUCCESS"})
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
