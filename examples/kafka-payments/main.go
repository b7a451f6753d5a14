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

	kafkago "github.com/segmentio/kafka-go"

	"github.com/idemkit/idem/adapters/kafka"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/otelconsumer"
	"github.com/idemkit/idem/examples/payments"
	"github.com/idemkit/idem/observe"
)

func main() {
	brokers := flag.String("brokers", "127.0.0.1:9092", "Kafka brokers, comma separated")
	f := payments.RegisterFlags(flag.CommandLine)
	listen := flag.String("listen", "", "serve /metrics and /healthz on this address, e.g. 127.0.0.1:9464")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := run(strings.Split(*brokers, ","), f, *listen, log); err != nil {
		log.Error("kafka-payments", slog.Any("error", err))
		os.Exit(1)
	}
}

func run(brokers []string, f *payments.Flags, listen string, log *slog.Logger) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	pool, store, err := payments.Open(ctx, f, func(ctx context.Context, cbs []payments.Callback) error {
		return publishDemo(ctx, brokers, f.Topic, cbs)
	})
	if err != nil {
		return err
	}
	defer pool.Close()

	// The Source is the consumer's dead-letter sink too: <topic>.dlq.
	src, err := kafka.New(kafka.Config{Brokers: brokers, Topics: []string{f.Topic}, Group: f.Group,
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
	cfg := payments.ConsumerConfig(src, src, store, log)
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
	return payments.Run(ctx, c, f, log)
}

// publishDemo sends the demo's callbacks (payments.DemoCallbacks).
func publishDemo(ctx context.Context, brokers []string, topic string, cbs []payments.Callback) error {
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

	w := &kafkago.Writer{Addr: kafkago.TCP(brokers...), Topic: topic, Transport: tr,
		RequiredAcks: kafkago.RequireAll, BatchTimeout: 10 * time.Millisecond}
	defer w.Close()
	msgs := make([]kafkago.Message, len(cbs))
	for i, cb := range cbs {
		v, _ := json.Marshal(cb)
		msgs[i] = kafkago.Message{Key: []byte(cb.OrderID), Value: v}
	}
	return w.WriteMessages(ctx, msgs...)
}
