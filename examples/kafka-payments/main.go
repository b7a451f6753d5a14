// Command kafka-payments books payment-channel callbacks from Kafka into
// Postgres, once each, however often the channel re-sends a callback or
// Kafka redelivers it.
//
// A callback says that the channel captured a payment for an order:
//
//	{"txn_id":"wx-4200001","order_id":"o-1","amount":1299,"status":"SUCCESS"}
//
// The handler and the four tables (orders, ledger, accounts, inventory) are
// examples/payments. The dedup key is the channel's transaction number
// (txn_id): the row in idem's dedup table, the order marked paid, the ledger
// line, the balance and the inventory commit in one transaction, and the
// offset is committed after it. Callbacks that cannot be booked (not JSON,
// unknown order, wrong amount, an order paid twice by different
// transactions) go to the dead-letter topic <topic>.dlq with the reason, for
// the reconciliation team.
//
// Run it against the test environment (make testenv-up), with -demo to create
// three orders and publish each callback three times:
//
//	go run ./examples/kafka-payments -demo
//
// With -listen it serves /metrics (Prometheus' text format, from
// consumer/otelconsumer through OpenTelemetry's Prometheus exporter) and
// /healthz (consumer.Health as JSON: 200 when ready and live, 503 when not;
// ?probe=ready for a readiness probe, ?probe=live for a liveness probe):
//
//	go run ./examples/kafka-payments -demo -listen 127.0.0.1:9464
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	kafkago "github.com/segmentio/kafka-go"

	"github.com/idemkit/idem/adapters/kafka"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/otelconsumer"
	"github.com/idemkit/idem/dedup/pgstore"
	"github.com/idemkit/idem/examples/payments"
	"github.com/idemkit/idem/observe"
)

func main() {
	brokers := flag.String("brokers", "127.0.0.1:9092", "Kafka brokers, comma separated")
	pgURL := flag.String("postgres", envOr("IDEM_TEST_PG_URL", "postgres://postgres@127.0.0.1:5432/idem_test?sslmode=disable"), "Postgres URL")
	topic := flag.String("topic", "payment-callbacks", "topic of the channel's callbacks")
	group := flag.String("group", "payments-ledger", "consumer group")
	demo := flag.Bool("demo", false, "create three orders and publish each callback three times")
	listen := flag.String("listen", "", "serve /metrics and /healthz on this address, e.g. 127.0.0.1:9464")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := run(*brokers, *pgURL, *topic, *group, *demo, *listen, log); err != nil {
		log.Error("kafka-payments", slog.Any("error", err))
		os.Exit(1)
	}
}

func run(brokerList, pgURL, topic, group string, demo bool, listen string, log *slog.Logger) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	brokers := strings.Split(brokerList, ",")

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
		if err := publishDemo(ctx, pool, brokers, topic); err != nil {
			return fmt.Errorf("demo: %w", err)
		}
	}

	// The Source is the consumer's dead-letter sink too: <topic>.dlq.
	src, err := kafka.New(kafka.Config{Brokers: brokers, Topics: []string{topic}, Group: group,
		DeadLetterAutoCreate: true, Logger: log})
	if err != nil {
		return err
	}
	var srv *observe.Server
	var tel *otelconsumer.Telemetry
	if listen != "" {
		// /metrics and /healthz: the system and the group come from the
		// Source, the letters are traced without a wrapper.
		if srv, err = observe.New(observe.Config{Stall: 2 * time.Minute, Logger: log}); err != nil {
			return err
		}
		defer srv.Close(context.Background()) //nolint:errcheck
		if tel, err = srv.Telemetry(otelconsumer.Config{}); err != nil {
			return err
		}
	}
	cfg := consumer.Config[pgx.Tx]{
		Name:            "payments-ledger",
		Source:          src,
		Store:           store,
		Handler:         payments.Handler(func(tx pgx.Tx) payments.DB { return payments.Pgx(tx) }),
		DeadLetter:      src,
		Key:             consumer.ByJSONField(payments.KeyField),
		MaxPayloadBytes: payments.MaxPayload,
		DrainTimeout:    30 * time.Second,
		Logger:          log,
	}
	if tel != nil {
		cfg.Observer = tel
	}
	c, err := consumer.New(cfg)
	if err != nil {
		return err
	}
	if srv != nil {
		if err := srv.Watch(c, tel); err != nil {
			return err
		}
		ln, err := net.Listen("tcp", listen)
		if err != nil {
			return err
		}
		sctx, stopServing := context.WithCancel(ctx)
		served := make(chan error, 1)
		go func() { served <- srv.Serve(sctx, ln) }()
		defer func() {
			stopServing()
			if err := <-served; err != nil {
				log.Warn("serving", slog.Any("error", err))
			}
		}()
		log.Info("serving", slog.String("metrics", "http://"+ln.Addr().String()+"/metrics"), slog.String("health", "http://"+ln.Addr().String()+"/healthz"))
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
func publishDemo(ctx context.Context, pool *pgxpool.Pool, brokers []string, topic string) error {
	// Create the topics first: a writer's first message to a topic that
	// auto-creation has yet to create fails.
	tr := &kafkago.Transport{}
	defer tr.CloseIdleConnections()
	admin := &kafkago.Client{Addr: kafkago.TCP(brokers...), Transport: tr}
	res, err := admin.CreateTopics(ctx, &kafkago.CreateTopicsRequest{Topics: []kafkago.TopicConfig{
		{Topic: topic, NumPartitions: 4, ReplicationFactor: 1},
		{Topic: topic + ".dlq", NumPartitions: 4, ReplicationFactor: 1},
	}})
	if err != nil {
		return err
	}
	for t, err := range res.Errors {
		if err != nil && !errors.Is(err, kafkago.TopicAlreadyExists) {
			return fmt.Errorf("create topic %s: %w", t, err)
		}
	}

	suffix := time.Now().Format("150405")
	w := &kafkago.Writer{Addr: kafkago.TCP(brokers...), Topic: topic, Transport: tr,
		RequiredAcks: kafkago.RequireAll, BatchTimeout: 10 * time.Millisecond}
	defer w.Close()
	var msgs []kafkago.Message
	for i := 1; i <= 3; i++ {
		order := payments.Order{ID: fmt.Sprintf("o-%s-%d", suffix, i), Account: "merchant-demo", SKU: "sku-demo", Amount: int64(1000 * i)}
		if err := payments.CreateOrders(ctx, payments.Pgx(pool), []payments.Order{order}); err != nil {
			return err
		}
		cb, _ := json.Marshal(payments.Callback{TxnID: fmt.Sprintf("wx-%s-%d", suffix, i), OrderID: order.ID, Amount: order.Amount, Channel: "wechat", Status: "SUCCESS"})
		for range 3 {
			msgs = append(msgs, kafkago.Message{Key: []byte(order.ID), Value: cb})
		}
	}
	stray, _ := json.Marshal(payments.Callback{TxnID: "wx-" + suffix + "-x", OrderID: "nobody", Amount: 5, Channel: "wechat", Status: "SUCCESS"})
	msgs = append(msgs, kafkago.Message{Key: []byte("nobody"), Value: stray})
	return w.WriteMessages(ctx, msgs...)
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
