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
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"

	"github.com/idemkit/idem/adapters/rocketmq"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/examples/payments"
)

func main() {
	namesrv := flag.String("namesrv", "127.0.0.1:9876", "RocketMQ name servers, comma separated")
	f := payments.RegisterFlags(flag.CommandLine)
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	rocketmq.SetClientLogger(log, slog.LevelError) // the client library's own logs: errors only
	if err := run(strings.Split(*namesrv, ","), f, log); err != nil {
		log.Error("rocketmq-payments", slog.Any("error", err))
		os.Exit(1)
	}
}

func run(namesrv []string, f *payments.Flags, log *slog.Logger) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	pool, store, err := payments.Open(ctx, f, func(ctx context.Context, cbs []payments.Callback) error {
		return publishDemo(ctx, namesrv, f.Topic, cbs)
	})
	if err != nil {
		return err
	}
	defer pool.Close()

	// The Source is the consumer's dead-letter sink too: <topic>_DLQ.
	src, err := rocketmq.New(rocketmq.Config{NameServers: namesrv, Group: f.Group, Topics: []string{f.Topic}, Logger: log})
	if err != nil {
		return err
	}
	c, err := consumer.New(payments.ConsumerConfig(src, src, store, log))
	if err != nil {
		return err
	}
	return payments.Run(ctx, c, f, log)
}

// publishDemo sends the demo's callbacks (payments.DemoCallbacks).
func publishDemo(ctx context.Context, namesrv []string, topic string, cbs []payments.Callback) error {
	p, err := producer.NewDefaultProducer(producer.WithNsResolver(primitive.NewPassthroughResolver(namesrv)),
		producer.WithGroupName("payments-demo"), producer.WithRetry(2))
	if err != nil {
		return err
	}
	if err := p.Start(); err != nil {
		return err
	}
	defer p.Shutdown()
	for _, cb := range cbs {
		body, _ := json.Marshal(cb)
		m := primitive.NewMessage(topic, body)
		m.WithKeys([]string{cb.TxnID}) // mqadmin queryMsgByKey finds it
		if _, err := p.SendSync(ctx, m); err != nil {
			return err
		}
	}
	return nil
}
