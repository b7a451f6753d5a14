// Command idem-relay publishes an outbox's committed messages to Kafka or
// RocketMQ: a Relay on its own, for deployments that do not run it inside
// the consumer processes. Run as many as you like; they share the work.
//
//	idem-relay -postgres "$DATABASE_URL" -kafka broker1:9092,broker2:9092
//	idem-relay -postgres "$DATABASE_URL" -rocketmq namesrv1:9876 -schema payments
//
// SIGINT or SIGTERM stops it gracefully: the round in flight is published
// and marked first (within -grace).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/outbox/kafkapub"
	"github.com/idemkit/idem/outbox/rocketmqpub"
)

func main() {
	if err := run(os.Args[1:], os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "idem-relay:", err)
		os.Exit(1)
	}
}

func run(args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("idem-relay", flag.ContinueOnError)
	fs.SetOutput(stderr)
	pg := fs.String("postgres", "", "Postgres connection URL (required)")
	schema := fs.String("schema", "public", "schema of the outbox table")
	table := fs.String("table", "idem_outbox", "outbox table")
	kafkaAddrs := fs.String("kafka", "", "Kafka brokers, comma separated (this or -rocketmq)")
	rmqAddrs := fs.String("rocketmq", "", "RocketMQ name servers, comma separated (this or -kafka)")
	batch := fs.Int("batch", 500, "rows per round")
	poll := fs.Duration("poll", 50*time.Millisecond, "how often an idle relay looks for rows")
	retention := fs.Duration("retention", 0, "keep sent rows this long (0: delete them once sent)")
	grace := fs.Duration("grace", 30*time.Second, "how long a stop may take")
	migrate := fs.Bool("migrate", false, "create or upgrade the outbox tables first")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *pg == "" || (*kafkaAddrs == "") == (*rmqAddrs == "") {
		fs.Usage()
		return errors.New("-postgres and one of -kafka and -rocketmq are required")
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, *pg)
	if err != nil {
		return err
	}
	defer pool.Close()
	ob, err := outbox.New(pool, outbox.Config{Schema: *schema, Table: *table})
	if err != nil {
		return err
	}
	if *migrate {
		if err := ob.Migrate(ctx); err != nil {
			return err
		}
	}
	var pub interface {
		outbox.Publisher
		Close() error
	}
	if *kafkaAddrs != "" {
		pub, err = kafkapub.New(kafkapub.Config{Brokers: split(*kafkaAddrs)})
	} else {
		pub, err = rocketmqpub.New(rocketmqpub.Config{NameServers: split(*rmqAddrs)})
	}
	if err != nil {
		return err
	}
	defer pub.Close()
	relay, err := outbox.NewRelay(outbox.RelayConfig{Outbox: ob, Publisher: pub, BatchSize: *batch, PollInterval: *poll,
		Retention: *retention, Logger: log})
	if err != nil {
		return err
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		if _, ok := <-sigs; !ok {
			return
		}
		sctx, cancel := context.WithTimeout(ctx, *grace)
		defer cancel()
		if err := relay.Stop(sctx); err != nil {
			log.Warn("idem-relay: stop cut short: the round in flight is published again by the next relay", slog.Any("error", err))
		}
	}()
	log.Info("idem-relay: publishing", slog.String("table", ob.Table()))
	err = relay.Run(ctx)
	signal.Stop(sigs)
	close(sigs)
	<-stopped
	st := relay.Stats()
	log.Info("idem-relay: stopped", slog.Int64("published", st.Published), slog.Int64("dead_lettered", st.DeadLettered),
		slog.Int64("failed", st.Failed), slog.Int64("mark_failures", st.MarkFailures))
	return err
}

func split(s string) []string {
	var out []string
	for _, a := range strings.Split(s, ",") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, a)
		}
	}
	return out
}
