// Command idem-relay publishes an outbox's committed messages to Kafka or
// RocketMQ: a Relay on its own, for deployments that do not run it inside
// the consumer processes. Run as many as you like; they share the work.
//
//	idem-relay -postgres "$DATABASE_URL" -kafka broker1:9092,broker2:9092
//	idem-relay -postgres "$DATABASE_URL" -rocketmq namesrv1:9876 -schema payments
//
// SIGINT or SIGTERM stops it gracefully: the round in flight is published
// and marked first (within -grace).
//
// -metrics ADDR serves /metrics (Prometheus; the relay's counters and the
// outbox's backlog, package observe) and /healthz on ADDR, e.g.
// 127.0.0.1:9465 or, for a scraper on another host, :9465 (every
// interface). Default: off.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/observe"
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
	metrics := fs.String("metrics", "", "serve /metrics and /healthz on this host:port, e.g. 127.0.0.1:9465 (default off; :9465 listens on every interface)")
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
	if *metrics != "" {
		stopServing, err := serveMetrics(ctx, *metrics, ob, relay, log)
		if err != nil {
			return err
		}
		defer stopServing()
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
		slog.Int64("failed", st.Failed), slog.Int64("mark_failures", st.MarkFailures), slog.Int64("republished", st.Republished),
		slog.Int64("failed_rounds", st.FailedRounds))
	return err
}

// serveMetrics serves the relay's /metrics and /healthz on addr until the
// returned function is called.
func serveMetrics(ctx context.Context, addr string, ob *outbox.Outbox, relay *outbox.Relay, log *slog.Logger) (func(), error) {
	obs, err := observe.New(observe.Config{Logger: log})
	if err != nil {
		return nil, err
	}
	if err := obs.WatchRelay(ob, relay); err != nil {
		return nil, errors.Join(err, obs.Close(ctx))
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("-metrics: %w", err), obs.Close(ctx))
	}
	log.Info("idem-relay: serving /metrics and /healthz", slog.String("addr", ln.Addr().String()))
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := obs.Serve(sctx, ln); err != nil {
			log.Error("idem-relay: /metrics stopped", slog.Any("error", err))
		}
	}()
	return func() {
		cancel()
		<-done
		_ = obs.Close(context.WithoutCancel(ctx))
	}, nil
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
