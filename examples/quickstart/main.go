// Command quickstart shows idem at work in one command, with nothing to set
// up: an in-process Kafka (franz-go's kfake) and an embedded SQLite store.
//
//	go run ./examples/quickstart            # a human summary
//	go run ./examples/quickstart -json      # the last line is one JSON object
//	go run ./examples/quickstart -kafka 127.0.0.1:9092 -postgres 'postgres://postgres@127.0.0.1:5432/idem_test'
//	go run ./examples/quickstart -metrics 127.0.0.1:9464   # and curl http://127.0.0.1:9464/metrics
//
// It produces a stream of payment callbacks with the duplicates real channels
// make (gateway retries, a channel re-sending its callback three times) and
// bad messages, consumes the first half, crashes the consumer and loses its
// last offset commits, consumes the rest with a second consumer (which is
// delivered again what the first had settled since those commits), and
// reconciles the four business tables and the dedup table. Every count is
// printed, and they add up: delivered = applied + duplicates skipped +
// dead-lettered + released.
//
// The counts depend only on -n and -seed: the stream is generated from the
// seed, the crash comes when the first half is settled and committed, and
// the commits lost are the last 100 of each partition. Only a Kafka group
// rebalance (a member missing its heartbeats on an overloaded machine)
// redelivers more; the summary says so when it happens.
//
// The exit status is 1 when reconciliation fails, 2 on any other error.
package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	kafkago "github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/idemkit/idem/adapters/kafka"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/otelconsumer"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/pgstore"
	"github.com/idemkit/idem/dedup/sqlitestore"
	"github.com/idemkit/idem/examples/payments"
	"github.com/idemkit/idem/observe"
)

const (
	topic      = "payments"
	dlqTopic   = "payments.dlq"
	partitions = 4
	scope      = "quickstart"
)

// Summary is what a run did; -json prints it as one line. At the end of a
// run Delivered = Applied + DuplicatesSkipped + DeadLetterWrites + Released.
type Summary struct {
	Seed   uint64 `json:"seed"`
	Unique int    `json:"unique"` // payments in the stream
	// Produced is every callback written to the topic: Unique first sends,
	// GatewayRetries, 3 × ChannelResends, Bad and Conflicting.
	Produced       int `json:"produced"`
	GatewayRetries int `json:"gateway_retries"`
	ChannelResends int `json:"channel_resends"` // payments whose callback was re-sent three times
	Bad            int `json:"bad"`             // invalid JSON, no transaction number, oversized
	Conflicting    int `json:"conflicting"`     // a known transaction number with another amount
	// Redelivered is how many settled callbacks the crash made Kafka deliver
	// again (the offset commits it lost); Rebalanced, how many more a group
	// rebalance redelivered (0 on a healthy run).
	Redelivered int64 `json:"redelivered"`
	Rebalanced  int64 `json:"rebalanced"`

	// The consumers' counters (consumer.Stats), both consumers summed.
	Delivered         int64 `json:"delivered"`
	Applied           int64 `json:"applied"`
	DuplicatesSkipped int64 `json:"duplicates_skipped"`
	DeadLetterWrites  int64 `json:"dead_letter_writes"` // a redelivered bad callback is dead-lettered again
	Released          int64 `json:"released"`

	DeadLettered  int   `json:"dead_lettered"` // distinct callbacks dead-lettered
	DoubleApplied int64 `json:"double_applied"`
	Reconciled    bool  `json:"reconciled"`
}

func usage() {
	fmt.Fprint(flag.CommandLine.Output(), `quickstart: idem end to end, with nothing to set up.

It writes a stream of payment callbacks into an in-process Kafka, with the
duplicates payment channels make (gateway retries, callbacks re-sent three
times) and bad messages. A first consumer applies the first half through idem
into four tables of an SQLite file in a temp dir, then crashes and loses its
last offset commits; a second consumer is delivered those callbacks again and
the rest. The tables are reconciled: every payment applied once, every bad
callback dead-lettered. The counts depend only on -n and -seed.

Exit status 1 when reconciliation fails, 2 on any other error.

Usage: go run ./examples/quickstart [flags]

`)
	flag.PrintDefaults()
}

func main() {
	flag.Usage = usage
	kafkaAddr := flag.String("kafka", "", "Kafka broker host:port (default: an in-process Kafka)")
	pgURL := flag.String("postgres", "", "Postgres URL (default: an embedded SQLite file in a temp dir)")
	n := flag.Int("n", 2000, "payments to produce")
	seed := flag.Uint64("seed", 1, "seed of the generated stream")
	asJSON := flag.Bool("json", false, "print the summary as one JSON object on the last line")
	verbose := flag.Bool("v", false, "log what idem does")
	metricsAddr := flag.String("metrics", "", "serve the consumers' metrics on this address (e.g. 127.0.0.1:9464) at /metrics, in Prometheus' text format, and keep serving after the run until Ctrl-C")
	flag.Parse()

	logger := slog.New(slog.DiscardHandler)
	if *verbose {
		logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	var obs consumer.Observer
	if *metricsAddr != "" {
		tel, stop, err := serveMetrics(*metricsAddr, os.Stderr)
		if err != nil {
			fmt.Fprintln(os.Stderr, "quickstart:", err)
			os.Exit(2)
		}
		defer stop()
		obs = tel
	}
	sum, report, err := run(context.Background(), *kafkaAddr, *pgURL, *n, *seed, logger, os.Stderr, obs)
	if err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(2)
	}
	if *asJSON {
		out, err := json.Marshal(sum)
		if err != nil {
			fmt.Fprintln(os.Stderr, "quickstart:", err)
			os.Exit(2)
		}
		fmt.Println(string(out))
	} else {
		printSummary(os.Stdout, sum, report)
	}
	if *metricsAddr != "" {
		fmt.Fprintf(os.Stderr, "still serving the metrics at http://%s/metrics; Ctrl-C to stop\n", *metricsAddr)
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		<-ctx.Done()
		stop()
	}
	if !sum.Reconciled {
		os.Exit(1)
	}
}

// serveMetrics serves OpenTelemetry's Prometheus exporter at
// http://addr/metrics (package observe), says where on w, and returns the
// Observer that records into it (consumer/otelconsumer). The Kafka source
// says the system and the group.
func serveMetrics(addr string, w io.Writer) (consumer.Observer, func(), error) {
	obs, err := observe.New(observe.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return nil, nil, err
	}
	tel, err := obs.Telemetry(otelconsumer.Config{})
	if err != nil {
		return nil, nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- obs.Serve(ctx, ln) }()
	fmt.Fprintf(w, "metrics: http://%s/metrics (curl it while the run goes on, or after)\n", ln.Addr())
	return tel, func() { cancel(); <-served; _ = obs.Close(context.Background()) }, nil
}

func printSummary(w io.Writer, s Summary, report payments.Report) {
	fmt.Fprintf(w, "%d payments (seed %d): %d callbacks produced = %d first sends + %d gateway retries\n",
		s.Unique, s.Seed, s.Produced, s.Unique, s.GatewayRetries)
	fmt.Fprintf(w, "  + %d channel re-sends (3 each for %d payments) + %d bad + %d with a known number and another amount.\n",
		3*s.ChannelResends, s.ChannelResends, s.Bad, s.Conflicting)
	fmt.Fprintf(w, "The first consumer crashed after the first half; its last offset commits were lost with it,\n")
	fmt.Fprintf(w, "  so %d callbacks it had settled were delivered again to the second.\n", s.Redelivered)
	if s.Rebalanced != 0 {
		fmt.Fprintf(w, "A Kafka group rebalance redelivered %d more (the machine was slow to heartbeat).\n", s.Rebalanced)
	}
	fmt.Fprintf(w, `
  delivered           %5d  = %d produced + %d redelivered`, s.Delivered, s.Produced, s.Redelivered)
	if s.Rebalanced != 0 {
		fmt.Fprintf(w, " + %d rebalanced", s.Rebalanced)
	}
	fmt.Fprintf(w, `
    applied           %5d  each payment once
    duplicates        %5d  skipped: gateway retries, re-sends, redeliveries
    dead-lettered     %5d  %d bad or conflicting callbacks, %d of them again after the redelivery
    released          %5d  handed back unacknowledged at a stop
  applied twice       %5d
  %s
`, s.Applied, s.DuplicatesSkipped, s.DeadLetterWrites, s.DeadLettered, s.DeadLetterWrites-int64(s.DeadLettered),
		s.Released, s.DoubleApplied, report)
}

// backend is the store and the business tables, on SQLite or Postgres.
type backend struct {
	db      payments.DB
	dedup   string
	consume func(ctx context.Context, cfg kafka.Config, dl *countingDeadLetter, logger *slog.Logger, obs consumer.Observer) (*runner, error)
	close   func()
}

// run runs the quickstart; obs, when not nil, observes both consumers.
func run(ctx context.Context, kafkaAddr, pgURL string, n int, seed uint64, logger *slog.Logger, progress io.Writer, obs consumer.Observer) (Summary, payments.Report, error) {
	var sum Summary
	brokers := []string{kafkaAddr}
	if kafkaAddr == "" {
		c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, topic, dlqTopic))
		if err != nil {
			return sum, payments.Report{}, fmt.Errorf("in-process kafka: %w", err)
		}
		defer c.Close()
		brokers = c.ListenAddrs()
	}
	// A fresh topic name per run on a real broker, so reruns start clean.
	runTopic, runDLQ, group := topic, dlqTopic, "quickstart"
	if kafkaAddr != "" {
		suffix := fmt.Sprint(time.Now().UnixNano())
		runTopic, runDLQ, group = topic+"-"+suffix, dlqTopic+"-"+suffix, "quickstart-"+suffix
		if err := createTopicsNamed(ctx, kafkaAddr, runTopic, runDLQ); err != nil {
			return sum, payments.Report{}, err
		}
	}

	b, err := openBackend(ctx, pgURL)
	if err != nil {
		return sum, payments.Report{}, err
	}
	defer b.close()

	s := payments.Generate(n, seed)
	sum.Seed, sum.Unique, sum.Produced = seed, len(s.Expected), len(s.Payloads)
	sum.GatewayRetries, sum.ChannelResends, sum.Bad, sum.Conflicting = s.GatewayRetries, s.ChannelResends, s.Bad, s.Conflicting
	if err := payments.Setup(ctx, b.db); err != nil {
		return sum, payments.Report{}, err
	}
	if err := payments.CreateOrders(ctx, b.db, s.Orders); err != nil {
		return sum, payments.Report{}, err
	}
	half := len(s.Payloads) / 2
	if err := produce(ctx, brokers, runTopic, s.Payloads[:half]); err != nil {
		return sum, payments.Report{}, err
	}

	dl := &countingDeadLetter{seen: map[string]bool{}}
	cfg := kafka.Config{Brokers: brokers, Topics: []string{runTopic}, Group: group, DeadLetterTopic: runDLQ, Logger: logger,
		SessionTimeout: 6 * time.Second, HeartbeatInterval: time.Second}
	lagDone := func() bool { lag, err := groupLag(ctx, brokers, group, runTopic); return err == nil && lag == 0 }

	start := time.Now()
	// First consumer: settles the first half and commits its offsets, then
	// crashes. The crash comes at a settled point, so that a run depends on
	// its seed alone.
	first, err := b.consume(ctx, cfg, dl, logger, obs)
	if err != nil {
		return sum, payments.Report{}, err
	}
	finished := waitFor(lagDone, start, progress, first.stats, consumer.Stats{}, 60*time.Second)
	_ = first.Stop(nil)
	if !finished {
		return sum, payments.Report{}, errors.New("the first consumer did not finish within 60s")
	}
	stats1 := first.stats()
	// The crash loses the last offset commits: what the first consumer
	// settled since is delivered again to the second one, and skipped.
	sum.Redelivered, err = loseCommits(ctx, brokers, group, runTopic, 100)
	if err != nil {
		return sum, payments.Report{}, err
	}
	if err := produce(ctx, brokers, runTopic, s.Payloads[half:]); err != nil {
		return sum, payments.Report{}, err
	}
	// Second consumer: same group, starts from the committed offsets.
	second, err := b.consume(ctx, cfg, dl, logger, obs)
	if err != nil {
		return sum, payments.Report{}, err
	}
	finished = waitFor(lagDone, start, progress, second.stats, stats1, 90*time.Second)
	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := second.Stop(stopCtx); err != nil {
		return sum, payments.Report{}, err
	}
	if !finished {
		return sum, payments.Report{}, errors.New("the second consumer did not finish within 90s")
	}
	stats2 := second.stats()

	r, err := payments.Reconcile(ctx, b.db, b.dedup, scope, s.Expected)
	if err != nil {
		return sum, r, err
	}
	sum.Delivered = stats1.Delivered + stats2.Delivered
	sum.Applied = stats1.Applied + stats2.Applied
	sum.DuplicatesSkipped = stats1.Duplicates + stats2.Duplicates
	sum.DeadLetterWrites = stats1.DeadLettered + stats2.DeadLettered
	sum.Released = stats1.Released + stats2.Released
	sum.Rebalanced = sum.Delivered - int64(sum.Produced) - sum.Redelivered
	sum.DoubleApplied = r.DoubleApplied + r.Unexpected
	sum.DeadLettered = dl.count()
	problem := func(format string, args ...any) { r.Problems = append(r.Problems, fmt.Sprintf(format, args...)) }
	if want := s.Bad + s.Conflicting; sum.DeadLettered != want {
		problem("%d callbacks dead-lettered, want %d", sum.DeadLettered, want)
	}
	if sum.Applied != r.Payments || r.Payments != int64(sum.Unique) {
		problem("%d applied and %d ledger rows for %d payments", sum.Applied, r.Payments, sum.Unique)
	}
	if settled := sum.Applied + sum.DuplicatesSkipped + sum.DeadLetterWrites + sum.Released; settled != sum.Delivered {
		problem("delivered %d, but applied + duplicates + dead-lettered + released = %d", sum.Delivered, settled)
	}
	sum.Reconciled = r.OK()
	return sum, r, nil
}

func openBackend(ctx context.Context, pgURL string) (*backend, error) {
	if pgURL == "" {
		dir, err := os.MkdirTemp("", "idem-quickstart-")
		if err != nil {
			return nil, err
		}
		db, err := sqlitestore.Open(filepath.Join(dir, "quickstart.db"), sqlitestore.Config{})
		if err != nil {
			return nil, err
		}
		st, err := sqlitestore.New(db, sqlitestore.Config{})
		if err == nil {
			err = st.Migrate(ctx)
		}
		if err != nil {
			db.Close()
			return nil, err
		}
		h := payments.Handler(func(tx *sql.Tx) payments.DB { return payments.SQL(tx) })
		return &backend{
			db: payments.SQL(db), dedup: `"idem_dedup"`,
			consume: func(ctx context.Context, cfg kafka.Config, dl *countingDeadLetter, logger *slog.Logger, obs consumer.Observer) (*runner, error) {
				return start(ctx, cfg, dl, st, h, logger, obs)
			},
			close: func() { db.Close(); os.RemoveAll(dir) },
		}, nil
	}
	schema := fmt.Sprintf("quickstart_%d", time.Now().UnixNano())
	admin, err := pgxpool.New(ctx, pgURL)
	if err != nil {
		return nil, err
	}
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		admin.Close()
		return nil, fmt.Errorf("postgres: %w", err)
	}
	pcfg, err := pgxpool.ParseConfig(pgURL)
	if err != nil {
		admin.Close()
		return nil, err
	}
	pcfg.ConnConfig.RuntimeParams["search_path"] = schema
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		admin.Close()
		return nil, err
	}
	st, err := pgstore.New(pool, pgstore.Config{Schema: schema})
	if err == nil {
		err = st.Migrate(ctx)
	}
	if err != nil {
		pool.Close()
		admin.Close()
		return nil, err
	}
	h := payments.Handler(func(tx pgx.Tx) payments.DB { return payments.Pgx(tx) })
	return &backend{
		db: payments.Pgx(pool), dedup: st.Table(),
		consume: func(ctx context.Context, cfg kafka.Config, dl *countingDeadLetter, logger *slog.Logger, obs consumer.Observer) (*runner, error) {
			return start(ctx, cfg, dl, st, h, logger, obs)
		},
		close: func() {
			pool.Close()
			_, _ = admin.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE")
			admin.Close()
		},
	}, nil
}

// runner is one running consumer.
type runner struct {
	stats  func() consumer.Stats
	cancel context.CancelFunc
	stop   func(context.Context) error
	done   chan error
}

// Stop stops the consumer: with a nil ctx as a crash would (nothing more is
// committed), else gracefully.
func (r *runner) Stop(ctx context.Context) error {
	var err error
	if ctx != nil {
		err = r.stop(ctx)
	}
	r.cancel()
	return errors.Join(err, <-r.done)
}

func start[TTx any](ctx context.Context, cfg kafka.Config, dl *countingDeadLetter, st dedup.Store[TTx], h consumer.Handler[TTx], logger *slog.Logger, obs consumer.Observer) (*runner, error) {
	src, err := kafka.New(cfg)
	if err != nil {
		return nil, err
	}
	c, err := consumer.New(consumer.Config[TTx]{
		Name: scope, Source: src, Store: st, Handler: h, DeadLetter: dl.of(src), // src writes to Config.DeadLetterTopic
		Key: consumer.ByJSONField(payments.KeyField), MaxPayloadBytes: payments.MaxPayload,
		Logger: logger, Observer: obs,
	})
	if err != nil {
		return nil, err
	}
	runCtx, cancel := context.WithCancel(ctx)
	r := &runner{stats: c.Stats, cancel: cancel, stop: c.Stop, done: make(chan error, 1)}
	go func() { r.done <- c.Run(runCtx) }()
	return r, nil
}

// waitFor polls done, printing progress every second once the run takes
// more than two seconds.
func waitFor(done func() bool, start time.Time, progress io.Writer, stats func() consumer.Stats, before consumer.Stats, limit time.Duration) bool {
	deadline := time.Now().Add(limit)
	lastPrint := time.Now()
	for time.Now().Before(deadline) {
		if done() {
			return true
		}
		time.Sleep(50 * time.Millisecond)
		if time.Since(start) > 2*time.Second && time.Since(lastPrint) >= time.Second {
			s := stats()
			s.Delivered += before.Delivered
			s.Applied += before.Applied
			s.Duplicates += before.Duplicates
			fmt.Fprintf(progress, "  %5.1fs  delivered %d, applied %d, duplicates skipped %d\n",
				time.Since(start).Seconds(), s.Delivered, s.Applied, s.Duplicates)
			lastPrint = time.Now()
		}
	}
	return done()
}

func produce(ctx context.Context, brokers []string, topic string, payloads [][]byte) error {
	w := &kafkago.Writer{Addr: kafkago.TCP(brokers...), Topic: topic, Balancer: &kafkago.Hash{},
		BatchSize: 500, BatchTimeout: 10 * time.Millisecond, RequiredAcks: kafkago.RequireAll}
	defer w.Close()
	msgs := make([]kafkago.Message, len(payloads))
	for i, p := range payloads {
		msgs[i] = kafkago.Message{Key: []byte(payments.PartitionKey(p)), Value: p}
	}
	for len(msgs) > 0 {
		k := min(len(msgs), 500)
		if err := w.WriteMessages(ctx, msgs[:k]...); err != nil {
			return fmt.Errorf("produce: %w", err)
		}
		msgs = msgs[k:]
	}
	return nil
}

// groupLag is the group's lag summed over the topic's partitions.
func groupLag(ctx context.Context, brokers []string, group, topic string) (int64, error) {
	cl := &kafkago.Client{Addr: kafkago.TCP(brokers...), Timeout: 5 * time.Second}
	reqs := make([]kafkago.OffsetRequest, partitions)
	parts := make([]int, partitions)
	for p := range partitions {
		reqs[p] = kafkago.LastOffsetOf(p)
		parts[p] = p
	}
	ends, err := cl.ListOffsets(ctx, &kafkago.ListOffsetsRequest{Topics: map[string][]kafkago.OffsetRequest{topic: reqs}})
	if err != nil {
		return 0, err
	}
	committed, err := cl.OffsetFetch(ctx, &kafkago.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: parts}})
	if err != nil {
		return 0, err
	}
	done := map[int]int64{}
	for _, p := range committed.Topics[topic] {
		done[p.Partition] = p.CommittedOffset
	}
	var lag int64
	for _, p := range ends.Topics[topic] {
		c := done[p.Partition]
		if c < 0 {
			c = 0
		}
		lag += p.LastOffset - c
	}
	return lag, nil
}

// loseCommits moves the group's committed offsets back by up to k per
// partition, as a crash before the last offset commits would have left them,
// and returns by how many offsets in all.
func loseCommits(ctx context.Context, brokers []string, group, topic string, k int64) (int64, error) {
	cl := &kafkago.Client{Addr: kafkago.TCP(brokers...), Timeout: 5 * time.Second}
	parts := make([]int, partitions)
	for p := range parts {
		parts[p] = p
	}
	committed, err := cl.OffsetFetch(ctx, &kafkago.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: parts}})
	if err != nil {
		return 0, fmt.Errorf("offset fetch: %w", err)
	}
	var back []kafkago.OffsetCommit
	var moved int64
	for _, p := range committed.Topics[topic] {
		if p.CommittedOffset > 0 {
			to := max(0, p.CommittedOffset-k)
			back = append(back, kafkago.OffsetCommit{Partition: p.Partition, Offset: to})
			moved += p.CommittedOffset - to
		}
	}
	if len(back) == 0 {
		return 0, nil
	}
	res, err := cl.OffsetCommit(ctx, &kafkago.OffsetCommitRequest{GroupID: group, GenerationID: -1, Topics: map[string][]kafkago.OffsetCommit{topic: back}})
	if err != nil {
		return 0, fmt.Errorf("offset commit: %w", err)
	}
	for _, p := range res.Topics[topic] {
		if p.Error != nil {
			return 0, fmt.Errorf("offset commit: partition %d: %w", p.Partition, p.Error)
		}
	}
	return moved, nil
}

func createTopicsNamed(ctx context.Context, addr string, names ...string) error {
	cl := &kafkago.Client{Addr: kafkago.TCP(addr), Timeout: 10 * time.Second}
	var ts []kafkago.TopicConfig
	for _, n := range names {
		p := partitions
		if strings.HasSuffix(n, ".dlq") || strings.Contains(n, ".dlq-") {
			p = 1
		}
		ts = append(ts, kafkago.TopicConfig{Topic: n, NumPartitions: p, ReplicationFactor: 1})
	}
	res, err := cl.CreateTopics(ctx, &kafkago.CreateTopicsRequest{Topics: ts})
	if err != nil {
		return fmt.Errorf("create topics: %w", err)
	}
	for t, e := range res.Errors {
		if e != nil && !errors.Is(e, kafkago.TopicAlreadyExists) {
			return fmt.Errorf("create topic %s: %w", t, e)
		}
	}
	return nil
}

// countingDeadLetter counts distinct dead-lettered messages (a redelivery
// after the crash may dead-letter one twice: at-least-once) of the sinks
// that of wraps.
type countingDeadLetter struct {
	mu   sync.Mutex
	seen map[string]bool
}

// of returns next, counting the letters it wrote.
func (d *countingDeadLetter) of(next consumer.DeadLetter) consumer.DeadLetter {
	return consumer.DeadLetterFunc(func(ctx context.Context, l consumer.Letter) error {
		if err := next.DeadLetter(ctx, l); err != nil {
			return err
		}
		d.mu.Lock()
		d.seen[l.Message.ID] = true
		d.mu.Unlock()
		return nil
	})
}

func (d *countingDeadLetter) count() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.seen)
}
