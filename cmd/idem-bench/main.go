// Command idem-bench measures idem side by side with what people write
// instead, against a real Kafka broker, a real RocketMQ and a durable
// Postgres, in one run.
//
//	make bench-e2e
//	go run ./cmd/idem-bench -brokers 127.0.0.1:9092 -namesrv 127.0.0.1:9876 -postgres "$IDEM_BENCH_PG_URL" [-json]
//
// It prefills a Kafka topic and a RocketMQ topic with the same payloads
// (prefill time is reported apart, it is no row's), then drains them under a
// fresh consumer group per row:
//
//	raw            kafka-go consumer group: fetch, commit; no database (the broker ceiling)
//	naive          per message: BEGIN; INSERT dedup ON CONFLICT DO NOTHING; business
//	               INSERT; COMMIT; CommitMessages, in one loop (a floor, not a peer)
//	watermill      the peers (peers.go): the same transaction per message, run
//	watermill-tuned  as Go teams run it: Watermill's router over its Sarama
//	sarama         subscriber with the pool's default size and with -peer-conns
//	               connections, and a plain Sarama consumer group
//	idem-b1        idem, batch size 1, a Handler with the peers' single-row INSERT
//	idem-b100      idem, batch size 100
//	idem-entity-b100  idem-b100 with Config.Entity: every message an event of
//	               one of -entities trades, versions rising in each trade's
//	               partition, -stale of them re-sending the trade's previous
//	               event (stale)
//	idem-handler-b100  idem, batch size 100, the handler users write: a
//	               per-message Handler, one INSERT … VALUES per message
//	pg-ceiling-handler  that row's statements with no framework: the claim
//	               and one INSERT … VALUES per new message, in transactions
//	               of 100 from as many connections as pg-ceiling, no broker
//	pg-ceiling     the same claim and business insert in batches of 100 from two
//	               connections, no broker (the database ceiling)
//	idem-offsets   idem, batch size 100, offsets in the store (Config.Offsets):
//	               one offset row update per batch, no key rows; the business
//	               insert skips the re-sent keys itself (ON CONFLICT DO NOTHING)
//	pg-ceiling-1row  that business insert alone in batches of 100 from as many
//	               connections as pg-ceiling, no dedup, no broker (the ceiling
//	               of idem-offsets)
//	idem-handler-offsets  idem-offsets with a per-message Handler: one
//	               INSERT … VALUES … ON CONFLICT DO NOTHING per message
//	p1-idem        idem (batch -p1-batch, default 100) on a topic of one
//	               partition: one lane, one transaction at a time
//	p1-idem-keylanes  the same with Config.KeyLanes (-key-lanes, default 8):
//	               the partition's keys over lanes that commit side by side
//	rmq-raw        rocketmq-client-go push consumer (concurrent mode) returning
//	               ConsumeSuccess for every message; no database (the RocketMQ ceiling)
//	rmq-idem-b100  idem over adapters/rocketmq, batch size 100
//
// and prints messages/s, CPU seconds of this process per 100k messages, p50
// and p99 latency from fetch to acknowledgement, and the ratios between rows.
// With -offered (fractions of each row's capacity) or -rate (messages a
// second) the Kafka rows run again open-loop, a producer offering that rate
// while they consume, and report p50/p99/p999 latency from produce to the
// commit of the effect (openloop.go).
//
// The benchmark is a module of its own (go.mod beside this file), so that
// the peers' dependencies stay out of the library's go.mod.
//
// The RocketMQ rows run only with a name server (-namesrv, default
// $IDEM_TEST_ROCKETMQ_NAMESRV); without one the default row list skips them.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	kafkago "github.com/segmentio/kafka-go"

	"github.com/idemkit/idem/adapters/kafka"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/source"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/pgstore"
)

type settings struct {
	Brokers      string  `json:"brokers"`
	NameServers  string  `json:"rocketmq_namesrv,omitempty"`
	Messages     int     `json:"messages"`
	SlowMessages int     `json:"slow_messages"`
	Partitions   int     `json:"partitions"`
	Size         int     `json:"message_bytes"`
	DupRate      float64 `json:"duplicate_rate"`
	Entities     int     `json:"entities"`
	StaleRate    float64 `json:"stale_rate"`
	Rows         string  `json:"rows"`
	Rounds       int     `json:"rounds"`
	CeilingConns int     `json:"ceiling_connections"`
	P1Messages   int     `json:"one_partition_messages"`
	KeyLanes     int     `json:"key_lanes"`
	P1Batch      int     `json:"one_partition_batch"`
	PeerConns    int     `json:"peer_connections"`
	// CommitInterval is the idem Kafka rows' kafka.Config.CommitInterval
	// (0: the adapter's default, a commit as soon as an ack moves a
	// watermark).
	CommitInterval time.Duration `json:"idem_commit_interval_ns"`

	// The RocketMQ rows' client settings (both rows use the same).
	RMQBroker     string `json:"rocketmq_broker,omitempty"`
	RMQPullBatch  int    `json:"rocketmq_pull_batch"`
	RMQCallBatch  int    `json:"rocketmq_consume_batch"`
	RMQGoroutines int    `json:"rocketmq_consume_goroutines"`
	RMQClientLog  string `json:"-"`

	tableSizeSettings // prefill.go
	openSettings      // openloop.go
}

// The rows, in their default order, and the broker each needs.
var (
	kafkaRows = []string{"raw", "naive", "watermill", "watermill-tuned", "sarama", "idem-b1", "idem-b100", "idem-entity-b100", "idem-handler-b100", "idem-offsets", "idem-handler-offsets"}
	p1Rows    = []string{"p1-idem", "p1-idem-keylanes"}
	rmqRows   = []string{"rmq-raw", "rmq-idem-b100"}
	allRows   = []string{"raw", "naive", "watermill", "watermill-tuned", "sarama", "idem-b1", "idem-b100", "idem-entity-b100", "pg-ceiling", "idem-handler-b100", "pg-ceiling-handler", "idem-offsets", "pg-ceiling-1row", "idem-handler-offsets", "p1-idem", "p1-idem-keylanes", "rmq-raw", "rmq-idem-b100"}
)

// Row is one measured configuration.
type Row struct {
	Name       string  `json:"name"`
	Messages   int     `json:"messages"`
	Seconds    float64 `json:"seconds"`
	PerSecond  float64 `json:"messages_per_second"`
	CPUPer100k float64 `json:"cpu_seconds_per_100k"`
	DBCPU100k  float64 `json:"postgres_cpu_seconds_per_100k"`
	// The broker's CPU per 100k messages (Kafka or RocketMQ on this
	// machine) and how busy the machine was over the row (0..1, all cores).
	BrokerCPU100k float64 `json:"broker_cpu_seconds_per_100k"`
	MachineBusy   float64 `json:"machine_busy"`
	P50Ms         float64 `json:"p50_ms"`
	P99Ms         float64 `json:"p99_ms"`
	P999Ms        float64 `json:"p999_ms"`
	Effects       int64   `json:"effects"`
	// The stale events the store recorded (idem-entity-b100); 0 for the
	// other rows.
	Stale int64 `json:"stale,omitempty"`
	// An open-loop row's offered rate (openloop.go); 0 for the others.
	Offered float64 `json:"offered_per_second,omitempty"`
	// The idem rows' transactions (acknowledged batches) and the messages
	// each carried on average; 0 for the other rows.
	Transactions   int64   `json:"transactions,omitempty"`
	PerTransaction float64 `json:"messages_per_transaction,omitempty"`
	// The table-size rows' dedup table (prefill.go); nil for the others.
	Table *tableStats `json:"dedup_table,omitempty"`
}

func main() {
	var s settings
	pgURL := flag.String("postgres", os.Getenv("IDEM_BENCH_PG_URL"), "durable Postgres URL (fsync on); default $IDEM_BENCH_PG_URL")
	flag.StringVar(&s.Brokers, "brokers", envOr("IDEM_TEST_KAFKA_BROKERS", "127.0.0.1:9092"), "Kafka brokers")
	flag.StringVar(&s.NameServers, "namesrv", os.Getenv("IDEM_TEST_ROCKETMQ_NAMESRV"), "RocketMQ name servers, host:port separated by commas; default $IDEM_TEST_ROCKETMQ_NAMESRV (none: the default rows skip RocketMQ)")
	flag.IntVar(&s.Messages, "messages", 200000, "messages to prefill and drain")
	flag.IntVar(&s.SlowMessages, "slow-messages", 20000, "messages the per-message rows (naive, the peers, idem-b1) drain; their rate is measured on these")
	flag.IntVar(&s.Partitions, "partitions", 8, "topic partitions (Kafka) and queues (RocketMQ)")
	flag.IntVar(&s.Size, "size", 256, "message size in bytes")
	flag.Float64Var(&s.DupRate, "dup", 0.10, "share of messages that repeat an earlier business key")
	flag.IntVar(&s.Entities, "entities", 8000, "trades (entities) the payloads are events of, spread over the partitions (idem-entity-b100)")
	flag.Float64Var(&s.StaleRate, "stale", 0.05, "share of a trade's events after its first that re-send its previous event: stale in idem-entity-b100")
	flag.StringVar(&s.Rows, "rows", strings.Join(allRows, ","), "rows to run, in this order")
	flag.IntVar(&s.Rounds, "rounds", 1, "run the rows this many times, alternating, and keep each row's best")
	flag.IntVar(&s.CeilingConns, "ceiling-conns", 2, "connections of the pg-ceiling row")
	flag.IntVar(&s.P1Messages, "p1-messages", 50000, "messages the one-partition rows (p1-*) drain, from a topic of one partition")
	flag.IntVar(&s.KeyLanes, "key-lanes", 8, "Config.KeyLanes of the p1-idem-keylanes row")
	flag.IntVar(&s.P1Batch, "p1-batch", 100, "BatchSize of the one-partition rows")
	flag.DurationVar(&s.CommitInterval, "commit-interval", 0, "kafka.Config.CommitInterval of idem's Kafka rows; 0: the adapter's default (the peers' Sarama commits once a second)")
	flag.IntVar(&s.PeerConns, "peer-conns", 10, "pgx pool size of the watermill-tuned and sarama rows (watermill keeps pgxpool's default)")
	flag.StringVar(&s.RMQBroker, "rmq-broker", "", "RocketMQ broker address to create the topic on; default: asked from mqadmin clusterList (scripts/testenv/rocketmq.sh)")
	flag.IntVar(&s.RMQPullBatch, "rmq-pull-batch", 32, "RocketMQ rows: messages pulled from a queue at once (PullBatchSize; the broker caps a pull at maxTransferCountOnMessageInMemory, 32 by default)")
	flag.IntVar(&s.RMQCallBatch, "rmq-consume-batch", 32, "RocketMQ rows: most messages per consume call (ConsumeMessageBatchMaxSize; a call never spans two pulls)")
	flag.IntVar(&s.RMQGoroutines, "rmq-goroutines", 64, "RocketMQ rows: consume calls in flight per topic (ConsumeGoroutineNums; adapters/rocketmq's default 64)")
	flag.StringVar(&s.RMQClientLog, "rmq-client-log", "off", "RocketMQ client library logs to stderr at this level and above: off, debug, info, warn, error")
	asJSON := flag.Bool("json", false, "print one JSON object with every row and ratio")
	jsonFile := flag.String("json-file", "", "also write that JSON object to this file (the table is still printed)")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of this process, prefill and rows, to this file")
	tableSizeFlags(&s.tableSizeSettings)
	openFlags(&s.openSettings)
	flag.Parse()
	if *pgURL == "" {
		fmt.Fprintln(os.Stderr, "idem-bench: -postgres (or IDEM_BENCH_PG_URL) is required: a durable Postgres, see scripts/testenv/postgres-durable.sh")
		os.Exit(2)
	}
	rowsSet := false
	flag.Visit(func(f *flag.Flag) { rowsSet = rowsSet || f.Name == "rows" })
	if err := errors.Join(checkTableSize(s), checkOpen(&s)); err != nil {
		fmt.Fprintln(os.Stderr, "idem-bench:", err)
		os.Exit(2)
	}
	if s.Prefill != "" && !rowsSet {
		s.Rows, rowsSet = "", true // the table-size rows alone
	}
	if !rowsSet && s.NameServers == "" {
		fmt.Fprintln(os.Stderr, "idem-bench: no RocketMQ name server (-namesrv, $IDEM_TEST_ROCKETMQ_NAMESRV): skipping the rows", strings.Join(rmqRows, ", "))
		s.Rows = strings.Join(slices.DeleteFunc(strings.Split(s.Rows, ","), func(r string) bool { return slices.Contains(rmqRows, r) }), ",")
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "idem-bench: -cpuprofile:", err)
			os.Exit(2)
		}
	}
	res, err := bench(context.Background(), s, *pgURL, os.Stderr)
	pprof.StopCPUProfile() // no-op without -cpuprofile
	if err != nil {
		fmt.Fprintln(os.Stderr, "idem-bench:", err)
		os.Exit(1)
	}
	s.SharedBuffers = res.sharedBuffers
	ratios := ratiosOf(res.rows)
	out, _ := json.Marshal(map[string]any{"settings": s, "rows": res.rows, "ratios": ratios, "prefill_seconds": res.prefill, "open_loop": res.open})
	if *jsonFile != "" {
		if err := os.WriteFile(*jsonFile, append(out, '\n'), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "idem-bench: -json-file:", err)
			os.Exit(1)
		}
	}
	if *asJSON {
		fmt.Println(string(out))
		return
	}
	printTable(os.Stdout, s, res, ratios)
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// result is what bench measured.
type result struct {
	rows          []Row
	open          []Row              // the open-loop rows (openloop.go)
	prefill       map[string]float64 // seconds per broker ("kafka", "rocketmq"), not part of any row
	sharedBuffers string             // the server's shared_buffers
}

// env is what the rows run against.
type env struct {
	s        settings
	brokers  []string // Kafka
	topic    string   // Kafka topic
	topic1   string   // Kafka topic of one partition (the p1-* rows)
	rmq      *rmqEnv  // nil without RocketMQ rows
	pool     *pgxpool.Pool
	pgURL    string // for the peers' own pools
	pgServer int    // pid of the Postgres server (postmaster) when it runs on this machine, else 0
	payloads [][]byte
	log      io.Writer
	// run by runRow after the row's last CPU snapshot (the peers' pools)
	afterRow []func()
	// set by runEngineWith for the row being run: transactions and the
	// messages they acknowledged
	txns, txnMsgs int64
	// the table-size row being run (prefill.go), nil for the others
	ts *tableSizeRun
	// the open-loop row being run (openloop.go), nil for the others
	open *openRun
}

func bench(ctx context.Context, s settings, pgURL string, log io.Writer) (result, error) {
	res := result{prefill: map[string]float64{}}
	names := strings.Split(s.Rows, ",")
	if s.Rows == "" {
		names = nil
	}
	for _, name := range names {
		if !slices.Contains(allRows, name) {
			return res, fmt.Errorf("unknown row %q (rows: %s)", name, strings.Join(allRows, ", "))
		}
	}
	uses := func(rows []string) bool {
		return slices.ContainsFunc(names, func(n string) bool { return slices.Contains(rows, n) }) ||
			s.Prefill != "" && slices.Equal(rows, kafkaRows)
	}
	pool, err := pgxpool.New(ctx, pgURL)
	if err != nil {
		return res, err
	}
	defer pool.Close()
	var fsync, sync string
	if err := pool.QueryRow(ctx, "SELECT current_setting('fsync'), current_setting('synchronous_commit')").Scan(&fsync, &sync); err != nil {
		return res, err
	}
	if err := pool.QueryRow(ctx, "SELECT current_setting('shared_buffers')").Scan(&s.SharedBuffers); err != nil {
		return res, err
	}
	res.sharedBuffers = s.SharedBuffers
	fmt.Fprintf(log, "postgres: fsync=%s synchronous_commit=%s shared_buffers=%s\n", fsync, sync, s.SharedBuffers)
	e := &env{s: s, brokers: strings.Split(s.Brokers, ","), topic: fmt.Sprintf("idem-bench-%d", time.Now().UnixNano()), pool: pool, pgURL: pgURL, log: log}
	var backend int
	if err := pool.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&backend); err == nil {
		e.pgServer = serverOf(backend)
	}
	payloads, unique := generate(s)
	e.payloads = payloads
	if uses(kafkaRows) {
		fmt.Fprintf(log, "prefilling Kafka topic %s: %d messages, %d unique keys, %d partitions\n", e.topic, len(payloads), unique, s.Partitions)
		t0 := time.Now()
		if err := prefill(ctx, e.brokers, e.topic, s.Partitions, payloads); err != nil {
			return res, err
		}
		res.prefill["kafka"] = time.Since(t0).Seconds()
		fmt.Fprintf(log, "  prefilled in %.1f s\n", res.prefill["kafka"])
	}
	if uses(p1Rows) {
		e.topic1 = e.topic + "-p1"
		n := min(s.P1Messages, len(payloads))
		fmt.Fprintf(log, "prefilling Kafka topic %s: %d messages, 1 partition\n", e.topic1, n)
		t0 := time.Now()
		if err := prefill(ctx, e.brokers, e.topic1, 1, payloads[:n]); err != nil {
			return res, err
		}
		fmt.Fprintf(log, "  prefilled in %.1f s\n", time.Since(t0).Seconds())
	}
	if uses(rmqRows) {
		if s.NameServers == "" {
			return res, errors.New("the RocketMQ rows need a name server: -namesrv or $IDEM_TEST_ROCKETMQ_NAMESRV")
		}
		if err := setClientLog(s.RMQClientLog); err != nil {
			return res, err
		}
		fmt.Fprintf(log, "prefilling RocketMQ topic %s: %d messages, %d unique keys, %d queues\n", e.topic, len(payloads), unique, s.Partitions)
		r, took, err := setupRocketMQ(ctx, s, e.topic, payloads, log)
		if r != nil {
			defer r.close()
		}
		if err != nil {
			return res, fmt.Errorf("rocketmq: %w", err)
		}
		e.rmq = r
		res.prefill["rocketmq"] = took.Seconds()
		fmt.Fprintf(log, "  prefilled in %.1f s\n", took.Seconds())
	}
	best := map[string]Row{}
	for round := range s.Rounds {
		order := slices.Clone(names)
		if round%2 == 1 {
			slices.Reverse(order)
		}
		for _, name := range order {
			n := s.Messages
			if name == "naive" || name == "idem-b1" || slices.Contains(peerRows, name) {
				n = min(n, s.SlowMessages)
			}
			if slices.Contains(p1Rows, name) {
				n = min(n, s.P1Messages)
			}
			fmt.Fprintf(log, "round %d: %s over %d messages...\n", round+1, name, n)
			r, err := runRow(ctx, e, name, n)
			if err != nil {
				return res, fmt.Errorf("%s: %w", name, err)
			}
			fmt.Fprintf(log, "  %.0f msg/s\n", r.PerSecond)
			if b, ok := best[name]; !ok || r.PerSecond > b.PerSecond {
				best[name] = r
			}
		}
	}
	for _, name := range names {
		res.rows = append(res.rows, best[name])
	}
	if s.openLoop() {
		rows, err := benchOpen(ctx, e, names, best)
		res.open = rows
		if err != nil {
			return res, fmt.Errorf("open-loop rows: %w", err)
		}
	}
	if s.Prefill != "" {
		rows, err := benchTableSize(ctx, e)
		res.rows = append(res.rows, rows...)
		if err != nil {
			return res, fmt.Errorf("table-size rows: %w", err)
		}
	}
	return res, nil
}

// generate makes the payloads: JSON of about size bytes, a share of them
// repeating an earlier business key with the same body. Each new payload
// is also the next event of one of s.Entities trades ("trade", "seq"):
// a trade's events lie on one partition (the one its txn_id's key hashes
// to), its seq rising with the partition's order, and a share s.StaleRate
// of the events after a trade's first re-send its previous event (the
// same seq): stale, when the row applies entity order.
func generate(s settings) ([][]byte, int) {
	rng := rand.New(rand.NewPCG(1, 2))
	staleRng := rand.New(rand.NewPCG(3, 4)) // apart, so that the rows' keys and amounts stay as they were
	parts := make([]int, max(s.Partitions, 1))
	for i := range parts {
		parts[i] = i
	}
	perPart := max(s.Entities/len(parts), 1)
	seen := make([]int, len(parts)) // new payloads per partition so far
	var balancer kafkago.Hash
	var out [][]byte
	unique := 0
	for i := 0; len(out) < s.Messages; i++ {
		if len(out) > 0 && rng.Float64() < s.DupRate {
			out = append(out, out[rng.IntN(len(out))])
			continue
		}
		txn := fmt.Sprintf("T%012d", i)
		part := balancer.Balance(kafkago.Message{Key: []byte(txn)}, parts...)
		n := seen[part]
		seen[part]++
		seq := n
		if n >= perPart && staleRng.Float64() < s.StaleRate {
			seq = n - perPart // the trade's previous event again
		}
		p := fmt.Sprintf(`{"txn_id":"%s","order_id":"O-%d","amount":%d,"trade":"E%d-%d","seq":%d,"pad":""}`,
			txn, i, 100+rng.IntN(10000), part, n%perPart, seq)
		if pad := s.Size - len(p); pad > 0 {
			p = strings.Replace(p, `"pad":""`, `"pad":"`+strings.Repeat("x", pad)+`"`, 1)
		}
		out = append(out, []byte(p))
		unique++
	}
	return out, unique
}

func prefill(ctx context.Context, brokers []string, topic string, partitions int, payloads [][]byte) error {
	cl := &kafkago.Client{Addr: kafkago.TCP(brokers...), Timeout: 30 * time.Second}
	res, err := cl.CreateTopics(ctx, &kafkago.CreateTopicsRequest{Topics: []kafkago.TopicConfig{{Topic: topic, NumPartitions: partitions, ReplicationFactor: 1}}})
	if err != nil {
		return err
	}
	if e := res.Errors[topic]; e != nil {
		return e
	}
	w := &kafkago.Writer{Addr: kafkago.TCP(brokers...), Topic: topic, Balancer: &kafkago.Hash{}, BatchSize: 2000,
		BatchBytes: 4 << 20, BatchTimeout: 5 * time.Millisecond, RequiredAcks: kafkago.RequireOne}
	defer w.Close()
	msgs := make([]kafkago.Message, len(payloads))
	for i, p := range payloads {
		msgs[i] = kafkago.Message{Key: p[11:24], Value: p} // key: the txn_id digits, so a duplicate lands where its first did
	}
	for len(msgs) > 0 {
		k := min(len(msgs), 10000)
		if err := w.WriteMessages(ctx, msgs[:k]...); err != nil {
			return fmt.Errorf("prefill: %w", err)
		}
		msgs = msgs[k:]
	}
	return nil
}

// latencies records fetch-to-ack durations, or in an open-loop row
// produce-to-commit durations (openloop.go).
type latencies struct {
	mu sync.Mutex
	d  []time.Duration
	// produced: the latency starts at the produce time the payload
	// carries; payloads produced before from (the warm-up) are not
	// recorded.
	produced bool
	from     time.Time
}

// since records the latency of the message with payload value, done now,
// that the row started handling at t.
func (l *latencies) since(value []byte, t time.Time) { l.sinceAt(value, t, time.Now()) }

// sinceAt is since with the end given.
func (l *latencies) sinceAt(value []byte, t, now time.Time) {
	if l.produced {
		at, ok := producedAt(value)
		if !ok || at.Before(l.from) {
			return
		}
		t = at
	}
	l.add(now.Sub(t))
}

func (l *latencies) add(d time.Duration) {
	l.mu.Lock()
	l.d = append(l.d, d)
	l.mu.Unlock()
}

func (l *latencies) pct(p float64) float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.d) == 0 {
		return 0
	}
	slices.Sort(l.d)
	return float64(l.d[int(float64(len(l.d)-1)*p)]) / float64(time.Millisecond)
}

// schema makes a fresh schema with the business table.
func schema(ctx context.Context, pool *pgxpool.Pool, name string) (string, error) {
	sc := fmt.Sprintf("bench_%s_%d", strings.ReplaceAll(name, "-", "_"), time.Now().UnixNano())
	_, err := pool.Exec(ctx, `CREATE SCHEMA `+sc+`; CREATE TABLE `+sc+`.effects (txn_id text PRIMARY KEY, amount bigint NOT NULL)`)
	return sc, err
}

func runRow(ctx context.Context, e *env, name string, n int) (Row, error) {
	r := Row{Name: name, Messages: n}
	lat := &latencies{}
	if e.open != nil {
		lat.produced, lat.from = true, e.open.from
	}
	pool := e.pool
	var sc string
	if name != "raw" && name != "rmq-raw" {
		var err error
		if sc, err = schema(ctx, pool, name); err != nil {
			return r, err
		}
		defer pool.Exec(context.Background(), "DROP SCHEMA "+sc+" CASCADE")
	}
	group := fmt.Sprintf("%s-%s-%d", e.topic, name, time.Now().UnixNano())
	defer func() {
		for _, f := range e.afterRow {
			f()
		}
		e.afterRow = nil
	}()
	c0, t0 := snapCPU(e.pgServer), time.Now()
	e.txns, e.txnMsgs = 0, 0
	var err error
	switch name {
	case "raw":
		err = runRaw(ctx, e.brokers, e.topic, group, n, lat)
	case "naive":
		err = runNaive(ctx, e.brokers, e.topic, group, n, pool, sc, lat)
	case "watermill":
		err = runWatermill(ctx, e, group, n, sc, 0, lat)
	case "watermill-tuned":
		err = runWatermill(ctx, e, group, n, sc, e.s.PeerConns, lat)
	case "sarama":
		err = runSarama(ctx, e, group, n, sc, e.s.PeerConns, lat)
	case "idem-b1":
		err = runIdem(ctx, e, e.topic, group, n, sc, 1, 0, lat)
	case "idem-b100":
		err = runIdem(ctx, e, e.topic, group, n, sc, 100, 0, lat)
	case "idem-entity-b100":
		err = runIdemEntity(ctx, e, e.topic, group, n, sc, 100, lat)
	case "idem-handler-b100":
		err = runIdemHandler(ctx, e, e.topic, group, n, sc, 100, lat)
	case "idem-offsets":
		err = runIdemOffsets(ctx, e, e.topic, group, n, sc, 100, false, lat)
	case "idem-handler-offsets":
		err = runIdemOffsets(ctx, e, e.topic, group, n, sc, 100, true, lat)
	case "p1-idem":
		err = runIdem(ctx, e, e.topic1, group, n, sc, e.s.P1Batch, 0, lat)
	case "p1-idem-keylanes":
		err = runIdem(ctx, e, e.topic1, group, n, sc, e.s.P1Batch, e.s.KeyLanes, lat)
	case "pg-ceiling":
		err = runCeiling(ctx, pool, sc, e.payloads[:n], e.s.CeilingConns, lat)
	case "pg-ceiling-1row":
		err = runCeiling1Row(ctx, pool, sc, e.payloads[:n], e.s.CeilingConns, lat)
	case "pg-ceiling-handler":
		err = runCeilingHandler(ctx, pool, sc, e.payloads[:n], e.s.CeilingConns, lat)
	case "rmq-raw":
		err = runRMQRaw(ctx, e, group, n, lat)
	case "rmq-idem-b100":
		err = runRMQIdem(ctx, e, group, n, sc, 100, lat)
	default:
		err = fmt.Errorf("unknown row %q", name)
	}
	if err != nil {
		return r, err
	}
	elapsed, c1 := time.Since(t0), snapCPU(e.pgServer)
	used := c1.since(c0)
	per100k := func(d time.Duration) float64 { return d.Seconds() * 100000 / float64(n) }
	r.Seconds = elapsed.Seconds()
	r.PerSecond = float64(n) / r.Seconds
	r.CPUPer100k = per100k(used.self)
	r.DBCPU100k = per100k(used.postgres)
	r.BrokerCPU100k = per100k(used.kafka + used.rocketmq)
	if used.total > 0 {
		r.MachineBusy = used.busy.Seconds() / used.total.Seconds()
	}
	r.P50Ms, r.P99Ms, r.P999Ms = lat.pct(0.50), lat.pct(0.99), lat.pct(0.999)
	if e.txns > 0 {
		r.Transactions, r.PerTransaction = e.txns, float64(e.txnMsgs)/float64(e.txns)
	}
	if sc != "" {
		_ = pool.QueryRow(ctx, "SELECT count(*) FROM "+sc+".effects").Scan(&r.Effects)
	}
	if name == "idem-entity-b100" {
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+sc+".idem_dedup_stale").Scan(&r.Stale); err != nil {
			return r, fmt.Errorf("counting stale events: %w", err)
		}
		fmt.Fprintf(e.log, "  %d stale events recorded (%.1f%% of the effects applied)\n", r.Stale, 100*float64(r.Stale)/float64(max(r.Effects, 1)))
	}
	if used.total > 0 {
		fmt.Fprintf(e.log, "  CPU s/100k: this %.2f, postgres %.2f, kafka %.2f, rocketmq %.2f, everything else %.2f; machine %.0f%% busy over %.1f s\n",
			r.CPUPer100k, r.DBCPU100k, per100k(used.kafka), per100k(used.rocketmq), per100k(used.other()),
			100*used.busy.Seconds()/used.total.Seconds(), r.Seconds)
	}
	return r, nil
}

func reader(brokers []string, topic, group string, commitInterval time.Duration) *kafkago.Reader {
	return kafkago.NewReader(kafkago.ReaderConfig{Brokers: brokers, Topic: topic, GroupID: group, StartOffset: kafkago.FirstOffset,
		MinBytes: 1, MaxBytes: 4 << 20, MaxWait: 100 * time.Millisecond, CommitInterval: commitInterval, QueueCapacity: 1000})
}

func runRaw(ctx context.Context, brokers []string, topic, group string, n int, lat *latencies) error {
	r := reader(brokers, topic, group, time.Second)
	defer r.Close()
	for i := 0; i < n; i++ {
		t := time.Now()
		m, err := r.FetchMessage(ctx)
		if err != nil {
			return err
		}
		if err := r.CommitMessages(ctx, m); err != nil { // async: CommitInterval batches them
			return err
		}
		lat.since(m.Value, t)
	}
	return nil
}

func runNaive(ctx context.Context, brokers []string, topic, group string, n int, pool *pgxpool.Pool, sc string, lat *latencies) error {
	if _, err := pool.Exec(ctx, `CREATE TABLE `+sc+`.dedup (key text PRIMARY KEY, created_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return err
	}
	r := reader(brokers, topic, group, 0) // 0: synchronous commits, as hand-written loops do
	defer r.Close()
	for i := 0; i < n; i++ {
		m, err := r.FetchMessage(ctx)
		if err != nil {
			return err
		}
		t := time.Now()
		var p struct {
			TxnID  string `json:"txn_id"`
			Amount int64  `json:"amount"`
		}
		if err := json.Unmarshal(m.Value, &p); err != nil {
			return err
		}
		err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			tag, err := tx.Exec(ctx, `INSERT INTO `+sc+`.dedup (key) VALUES ($1) ON CONFLICT DO NOTHING`, p.TxnID)
			if err != nil || tag.RowsAffected() == 0 {
				return err
			}
			_, err = tx.Exec(ctx, `INSERT INTO `+sc+`.effects (txn_id, amount) VALUES ($1, $2)`, p.TxnID, p.Amount)
			return err
		})
		if err != nil {
			return err
		}
		if err := r.CommitMessages(ctx, m); err != nil {
			return err
		}
		lat.since(m.Value, t)
	}
	return nil
}

// insertEffects is the business write of idem's rows and the ceiling: one
// set-based INSERT for the batch's new messages.
func insertEffects(sc string) consumer.BatchHandlerFunc[pgx.Tx] {
	return writeEffects(`INSERT INTO ` + sc + `.effects (txn_id, amount) SELECT * FROM unnest($1::text[], $2::bigint[])`)
}

// insertEffect is the business write of the rows at batch 1, the peers'
// statement: one INSERT … VALUES per message.
func insertEffect(sc string) consumer.HandlerFunc[pgx.Tx] {
	return effectFunc(`INSERT INTO ` + sc + `.effects (txn_id, amount) VALUES ($1, $2)`)
}

// effectFunc runs q with the message's txn_id and amount as its two
// parameters.
func effectFunc(q string) consumer.HandlerFunc[pgx.Tx] {
	return func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		var p struct {
			TxnID  string `json:"txn_id"`
			Amount int64  `json:"amount"`
		}
		if err := json.Unmarshal(m.Value, &p); err != nil {
			return consumer.Permanent(err)
		}
		_, err := tx.Exec(ctx, q, p.TxnID, p.Amount)
		return err
	}
}

// upsertEffect is the business write of idem-handler-offsets: insertEffect
// skipping the keys already booked, as upsertEffects does for a batch.
func upsertEffect(sc string) consumer.HandlerFunc[pgx.Tx] {
	return effectFunc(`INSERT INTO ` + sc + `.effects (txn_id, amount) VALUES ($1, $2) ON CONFLICT (txn_id) DO NOTHING`)
}

// upsertEffects is the business write of idem-offsets and pg-ceiling-1row:
// one set-based INSERT that skips the keys already booked (the payloads'
// re-sent business keys), as a business table's own unique key does when no
// key table stands in front of it.
func upsertEffects(sc string) consumer.BatchHandlerFunc[pgx.Tx] {
	// In key order: two batches holding one re-sent key lock it in one
	// order, so they never deadlock.
	return writeEffects(`INSERT INTO ` + sc + `.effects (txn_id, amount) SELECT * FROM unnest($1::text[], $2::bigint[]) ORDER BY 1 ON CONFLICT (txn_id) DO NOTHING`)
}

// writeEffects runs q with the batch's txn_ids and amounts as its two
// array parameters.
func writeEffects(q string) consumer.BatchHandlerFunc[pgx.Tx] {
	return func(ctx context.Context, tx pgx.Tx, msgs []*consumer.Message) error {
		ids, amounts := make([]string, len(msgs)), make([]int64, len(msgs))
		for i, m := range msgs {
			var p struct {
				TxnID  string `json:"txn_id"`
				Amount int64  `json:"amount"`
			}
			if err := json.Unmarshal(m.Value, &p); err != nil {
				return &consumer.MessageError{Index: i, Err: consumer.Permanent(err)}
			}
			ids[i], amounts[i] = p.TxnID, p.Amount
		}
		_, err := tx.Exec(ctx, q, ids, amounts)
		return err
	}
}

// timedSource stamps each message on delivery and records its latency on ack.
// The engine acks once per batch, so acks counts the batches settled.
type timedSource struct {
	source.Source
	lat   *latencies
	stamp sync.Map // *consumer.Message -> time.Time
	acked atomic.Int64
	acks  atomic.Int64
}

func (t *timedSource) Run(ctx context.Context, deliver source.DeliverFunc) error {
	return t.Source.Run(ctx, func(ctx context.Context, m *consumer.Message) error {
		t.stamp.Store(m, time.Now())
		return deliver(ctx, m)
	})
}

func (t *timedSource) Ack(ctx context.Context, msgs []*consumer.Message) error {
	now := time.Now()
	for _, m := range msgs {
		if v, ok := t.stamp.LoadAndDelete(m); ok {
			t.lat.sinceAt(m.Value, v.(time.Time), now)
		}
	}
	t.acked.Add(int64(len(msgs)))
	t.acks.Add(1)
	return t.Source.Ack(ctx, msgs)
}

var quiet = slog.New(slog.DiscardHandler)

func runIdem(ctx context.Context, e *env, topic, group string, n int, sc string, batch, keyLanes int, lat *latencies) error {
	src, err := kafka.New(kafka.Config{Brokers: e.brokers, Topics: []string{topic}, Group: group, MaxBytes: 4 << 20, Logger: quiet,
		CommitInterval: e.s.CommitInterval})
	if err != nil {
		return err
	}
	return runEngine(ctx, e, src, n, sc, batch, keyLanes, lat, 0)
}

// runIdemEntity is runIdem with entity order (Config.Entity): each
// message names its trade and the event's seq, as the docs' example
// decodes them.
func runIdemEntity(ctx context.Context, e *env, topic, group string, n int, sc string, batch int, lat *latencies) error {
	src, err := kafka.New(kafka.Config{Brokers: e.brokers, Topics: []string{topic}, Group: group, MaxBytes: 4 << 20, Logger: quiet,
		CommitInterval: e.s.CommitInterval})
	if err != nil {
		return err
	}
	return runEngineWith(ctx, e, src, n, sc, lat, 0, func(cfg *consumer.Config[pgx.Tx], st *pgstore.Store) {
		cfg.BatchSize = batch
		cfg.Entity = func(m *consumer.Message) (consumer.Entity, error) {
			var ev struct {
				Trade string `json:"trade"`
				Seq   int64  `json:"seq"`
			}
			if err := json.Unmarshal(m.Value, &ev); err != nil {
				return consumer.Entity{}, err
			}
			return consumer.Entity{Name: ev.Trade, Version: dedup.Version{Major: ev.Seq}}, nil
		}
	})
}

// runIdemHandler is idem with the handler users write: a per-message
// Handler, one INSERT … VALUES per message, at any batch size.
func runIdemHandler(ctx context.Context, e *env, topic, group string, n int, sc string, batch int, lat *latencies) error {
	src, err := kafka.New(kafka.Config{Brokers: e.brokers, Topics: []string{topic}, Group: group, MaxBytes: 4 << 20, Logger: quiet,
		CommitInterval: e.s.CommitInterval})
	if err != nil {
		return err
	}
	return runEngineWith(ctx, e, src, n, sc, lat, 0, func(cfg *consumer.Config[pgx.Tx], _ *pgstore.Store) {
		cfg.BatchSize, cfg.BatchHandler, cfg.Handler = batch, nil, insertEffect(sc)
	})
}

// runIdemOffsets is idem with offsets in the store: Config.Offsets, no
// key, the business insert skipping re-sent keys itself; perMessage
// writes it with a Handler, one statement per message, instead of one
// set-based statement per batch.
func runIdemOffsets(ctx context.Context, e *env, topic, group string, n int, sc string, batch int, perMessage bool, lat *latencies) error {
	st, err := pgstore.New(e.pool, pgstore.Config{Schema: sc})
	if err != nil {
		return err
	}
	src, err := kafka.New(kafka.Config{Brokers: e.brokers, Topics: []string{topic}, Group: group, MaxBytes: 4 << 20, Logger: quiet,
		CommitInterval: e.s.CommitInterval, StartOffsets: kafka.StoreOffsets(st, "bench")})
	if err != nil {
		return err
	}
	return runEngineWith(ctx, e, src, n, sc, lat, 0, func(cfg *consumer.Config[pgx.Tx], st *pgstore.Store) {
		cfg.Offsets, cfg.Key, cfg.BatchHandler, cfg.BatchSize = st, nil, upsertEffects(sc), batch
		if perMessage {
			cfg.BatchHandler, cfg.Handler = nil, upsertEffect(sc)
		}
	})
}

// runEngine runs idem over src with the business insert of sc until n
// messages were acked, then stops it gracefully. stall > 0 fails the row
// when no message was acked for that long.
func runEngine(ctx context.Context, e *env, src source.Source, n int, sc string, batch, keyLanes int, lat *latencies, stall time.Duration) error {
	return runEngineWith(ctx, e, src, n, sc, lat, stall, func(cfg *consumer.Config[pgx.Tx], _ *pgstore.Store) {
		cfg.BatchSize, cfg.KeyLanes = batch, keyLanes
		if batch == 1 {
			// One message per transaction: a Handler with the peers'
			// single-row INSERT, as one writes it for BatchSize 1 (the
			// batch insert's unnest costs Postgres twice the CPU for one
			// row).
			cfg.BatchHandler, cfg.Handler = nil, insertEffect(sc)
		}
	})
}

// runEngineWith is runEngine with the consumer's configuration changed by
// set.
func runEngineWith(ctx context.Context, e *env, src source.Source, n int, sc string, lat *latencies, stall time.Duration, set func(*consumer.Config[pgx.Tx], *pgstore.Store)) error {
	st, err := pgstore.New(e.pool, e.storeConfig(sc))
	if err != nil {
		return err
	}
	if err := st.Migrate(ctx); err != nil {
		return err
	}
	ts := &timedSource{Source: src, lat: lat}
	cfg := consumer.Config[pgx.Tx]{
		Name: "bench", Source: ts, Store: st, BatchHandler: insertEffects(sc),
		Key: consumer.ByJSONField("txn_id"), Logger: quiet,
		DeadLetter: consumer.DeadLetterFunc(func(ctx context.Context, l consumer.Letter) error {
			return fmt.Errorf("unexpected dead letter: %v", l.Reason)
		}),
	}
	set(&cfg, st)
	e.adjustConfig(&cfg)
	c, err := consumer.New(cfg)
	if err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	last, progress := int64(0), time.Now()
	for ts.acked.Load() < int64(n) {
		select {
		case err := <-done:
			return errors.Join(errors.New("consumer stopped early"), err)
		case <-time.After(5 * time.Millisecond):
		}
		if a := ts.acked.Load(); a != last {
			last, progress = a, time.Now()
		} else if stall > 0 && time.Since(progress) > stall {
			stopCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			return errors.Join(fmt.Errorf("stalled: %d of %d messages acked, none for %v", a, n, stall), c.Stop(stopCtx), <-done)
		}
	}
	stopCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	err = errors.Join(c.Stop(stopCtx), <-done)
	if a := ts.acks.Load(); a > 0 {
		e.txns, e.txnMsgs = a, ts.acked.Load()
		fmt.Fprintf(e.log, "  idem: %d transactions, %.1f messages each on average\n", a, float64(ts.acked.Load())/float64(a))
	}
	return err
}

// runCeiling is the database alone: the same claim and insert in batches of
// 100 from conns connections.
func runCeiling(ctx context.Context, pool *pgxpool.Pool, sc string, payloads [][]byte, conns int, lat *latencies) error {
	return runCeilingWith(ctx, pool, sc, payloads, conns, lat, insertEffects(sc))
}

// runCeilingWith is runCeiling with effects as the business write of each
// batch's new messages.
func runCeilingWith(ctx context.Context, pool *pgxpool.Pool, sc string, payloads [][]byte, conns int, lat *latencies, effects consumer.BatchHandlerFunc[pgx.Tx]) error {
	st, err := pgstore.New(pool, pgstore.Config{Schema: sc})
	if err != nil {
		return err
	}
	if err := st.Migrate(ctx); err != nil {
		return err
	}
	return inBatches(payloads, conns, lat, func() func([][]byte) error {
		claims := make([]dedup.Claim, 0, 100)
		results := make([]dedup.Result, 100)
		msgs := make([]*consumer.Message, 0, 100)
		fresh := make([]*consumer.Message, 0, 100)
		return func(batch [][]byte) error {
			claims, msgs = claims[:0], msgs[:0]
			for _, p := range batch {
				id := string(p[11:24])
				claims = append(claims, dedup.Claim{Key: dedup.Key{Scope: "bench", ID: "T" + id[1:]}, Fingerprint: dedup.FingerprintOf(p)})
				msgs = append(msgs, &consumer.Message{Value: p})
			}
			return st.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
				if err := st.Claim(ctx, tx, claims, results); err != nil {
					return err
				}
				fresh = fresh[:0]
				for i := range claims {
					if results[i].Status == dedup.StatusNew {
						fresh = append(fresh, msgs[i])
					}
				}
				if len(fresh) == 0 {
					return nil
				}
				return effects(ctx, tx, fresh)
			})
		}
	})
}

// runCeilingHandler is the database alone for idem-handler-b100: the same
// claim as pg-ceiling, then one INSERT … VALUES per new message (the
// per-message handler's statement, run one after the other as the engine
// runs it), in transactions of 100 from conns connections.
func runCeilingHandler(ctx context.Context, pool *pgxpool.Pool, sc string, payloads [][]byte, conns int, lat *latencies) error {
	return runCeilingWith(ctx, pool, sc, payloads, conns, lat, oneByOne(insertEffect(sc)))
}

// oneByOne is h over a batch, message by message, in one transaction.
func oneByOne(h consumer.HandlerFunc[pgx.Tx]) consumer.BatchHandlerFunc[pgx.Tx] {
	return func(ctx context.Context, tx pgx.Tx, msgs []*consumer.Message) error {
		for _, m := range msgs {
			if err := h(ctx, tx, m); err != nil {
				return err
			}
		}
		return nil
	}
}

// runCeiling1Row is the database alone for idem-offsets: the business
// insert (skipping booked keys) in batches of 100 from conns connections,
// no dedup.
func runCeiling1Row(ctx context.Context, pool *pgxpool.Pool, sc string, payloads [][]byte, conns int, lat *latencies) error {
	st, err := pgstore.New(pool, pgstore.Config{Schema: sc})
	if err != nil {
		return err
	}
	effects := upsertEffects(sc)
	return inBatches(payloads, conns, lat, func() func([][]byte) error {
		msgs := make([]*consumer.Message, 0, 100)
		return func(batch [][]byte) error {
			msgs = msgs[:0]
			for _, p := range batch {
				msgs = append(msgs, &consumer.Message{Value: p})
			}
			return st.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error { return effects(ctx, tx, msgs) })
		}
	})
}

// inBatches runs the payloads in batches of 100 from conns workers, worker
// w taking batches w, w+conns, w+2*conns and so on. newWorker is called
// once per worker and returns what runs its batches (with buffers of its
// own); a batch's time is the latency of each of its payloads. It returns
// the first error, which ends its worker.
func inBatches(payloads [][]byte, conns int, lat *latencies, newWorker func() func(batch [][]byte) error) error {
	var wg sync.WaitGroup
	errs := make(chan error, conns)
	for w := range conns {
		wg.Go(func() {
			run := newWorker()
			for start := w * 100; start < len(payloads); start += 100 * conns {
				batch := payloads[start:min(start+100, len(payloads))]
				t := time.Now()
				if err := run(batch); err != nil {
					errs <- err
					return
				}
				d := time.Since(t)
				for range batch {
					lat.add(d)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

type ratio struct {
	Name   string  `json:"name"`
	Value  float64 `json:"value"`
	Target string  `json:"target"`        // empty: informational
	Met    *bool   `json:"met,omitempty"` // nil: informational
}

func ratiosOf(rows []Row) []ratio {
	rate := map[string]float64{}
	for _, r := range rows {
		rate[r.Name] = r.PerSecond
	}
	var out []ratio
	perTxn, dbCPU := map[string]float64{}, map[string]float64{}
	for _, r := range rows {
		perTxn[r.Name], dbCPU[r.Name] = r.PerTransaction, r.DBCPU100k
	}
	add := func(a, b string, target float64, op string) {
		if rate[a] == 0 || rate[b] == 0 {
			return
		}
		v := rate[a] / rate[b]
		r := ratio{Name: a + "/" + b, Value: v}
		if op != "" {
			met := v >= target
			r.Target, r.Met = fmt.Sprintf("%s %.2f", op, target), &met
		}
		out = append(out, r)
	}
	// Postgres CPU per message of a over b's; target 0: informational.
	addCPU := func(a, b string, target float64) {
		if rate[a] == 0 || rate[b] == 0 || dbCPU[b] == 0 {
			return
		}
		v := dbCPU[a] / dbCPU[b]
		r := ratio{Name: a + "/" + b + " Postgres CPU per message", Value: v}
		if target > 0 {
			met := v <= target
			r.Target, r.Met = fmt.Sprintf("<= %.2f", target), &met
		}
		out = append(out, r)
	}
	// Against the Watermill way first (issue 29's targets).
	add("idem-b100", "watermill-tuned", 4, ">=")
	// What entity watermarks cost at batch 100 (issue 40): under 15% of
	// idem-b100's throughput.
	add("idem-entity-b100", "idem-b100", 0.85, ">=")
	addCPU("idem-entity-b100", "idem-b100", 0)
	addCPU("idem-b100", "watermill-tuned", 0)
	add("idem-offsets", "watermill-tuned", 5, ">=")
	addCPU("idem-offsets", "watermill-tuned", 0)
	add("idem-b1", "watermill-tuned", 1, ">=")
	addCPU("idem-b1", "watermill-tuned", 1.2)
	// The handler users write (issue 41): a per-message Handler beside the
	// peers, its ceiling and its BatchHandler twin; informational.
	add("idem-handler-b100", "watermill-tuned", 0, "")
	addCPU("idem-handler-b100", "watermill-tuned", 0)
	add("idem-handler-b100", "pg-ceiling-handler", 0, "")
	add("idem-handler-b100", "idem-b100", 0, "")
	add("idem-handler-offsets", "watermill-tuned", 0, "")
	addCPU("idem-handler-offsets", "watermill-tuned", 0)
	add("idem-handler-offsets", "idem-offsets", 0, "")
	add("watermill-tuned", "watermill", 0, "")
	add("sarama", "watermill-tuned", 0, "")
	add("idem-b100", "raw", 0.5, ">=")
	add("idem-b100", "naive", 10, ">=")
	add("idem-b100", "idem-b1", 20, ">=")
	add("idem-b100", "pg-ceiling", 0.7, ">=")
	add("idem-b1", "naive", 0.8, ">=")
	add("p1-idem-keylanes", "p1-idem", 2, ">=")
	add("idem-offsets", "idem-b100", 1.5, ">=")
	add("idem-offsets", "pg-ceiling-1row", 0.8, ">=")
	// 1.5 × 0.19, the ratio in the run recorded on 2026-11-30
	// (docs/records/benchmark-runs.md)
	add("rmq-idem-b100", "rmq-raw", 0.285, ">=")
	if v := perTxn["rmq-idem-b100"]; v > 0 {
		met := v >= 90
		out = append(out, ratio{Name: "rmq-idem-b100 messages/transaction", Value: v, Target: ">= 90.00", Met: &met})
	}
	add("rmq-idem-b100", "idem-b100", 0, "")
	return append(out, tableSizeRatios(rows)...)
}

func printTable(w io.Writer, s settings, res result, ratios []ratio) {
	rows := res.rows
	fmt.Fprintf(w, "\n%d messages of %d bytes, %d partitions, %.0f%% duplicate keys; per-message rows on %d messages; pg-ceiling on %d connections; best of %d round(s)\n",
		s.Messages, s.Size, s.Partitions, s.DupRate*100, s.SlowMessages, s.CeilingConns, s.Rounds)
	if slices.ContainsFunc(rows, func(r Row) bool { return r.Name == "idem-entity-b100" }) {
		fmt.Fprintf(w, "idem-entity-b100: events of %d trades, %.0f%% of the events after a trade's first re-sent (stale)\n", s.Entities, s.StaleRate*100)
	}
	if slices.ContainsFunc(rows, func(r Row) bool { return slices.Contains(p1Rows, r.Name) }) {
		fmt.Fprintf(w, "one-partition rows (p1-*): %d messages from a topic of 1 partition, BatchSize %d; KeyLanes %d\n", s.P1Messages, s.P1Batch, s.KeyLanes)
	}
	if slices.ContainsFunc(rows, func(r Row) bool { return slices.Contains(rmqRows, r.Name) }) {
		fmt.Fprintf(w, "RocketMQ rows: %d queues, PullBatchSize %d, ConsumeMessageBatchMaxSize %d, ConsumeGoroutineNums %d, concurrent mode\n",
			s.Partitions, s.RMQPullBatch, s.RMQCallBatch, s.RMQGoroutines)
	}
	var pre []string
	for _, b := range []string{"kafka", "rocketmq"} {
		if v, ok := res.prefill[b]; ok {
			pre = append(pre, fmt.Sprintf("%s %.1f s (%.0f msg/s)", b, v, float64(s.Messages)/v))
		}
	}
	if len(pre) > 0 {
		fmt.Fprintf(w, "prefill (not part of any row): %s\n", strings.Join(pre, ", "))
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "| row | messages | msg/s | CPU s/100k | Postgres CPU s/100k | broker CPU s/100k | machine busy | msgs/txn | p50 ms | p99 ms | effects |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range rows {
		perTxn := "—"
		if r.Transactions > 0 {
			perTxn = fmt.Sprintf("%.1f", r.PerTransaction)
		}
		fmt.Fprintf(w, "| %s | %d | %.0f | %.2f | %.2f | %.2f | %.0f%% | %s | %.2f | %.2f | %d |\n", r.Name, r.Messages, r.PerSecond,
			r.CPUPer100k, r.DBCPU100k, r.BrokerCPU100k, 100*r.MachineBusy, perTxn, r.P50Ms, r.P99Ms, r.Effects)
	}
	printTableSize(w, s, rows)
	printOpen(w, s, res.open)
	fmt.Fprintf(w, "\n| ratio | value | target |\n|---|---:|---|\n")
	for _, r := range ratios {
		if r.Met == nil {
			fmt.Fprintf(w, "| %s | %.2f | none (informational) |\n", r.Name, r.Value)
			continue
		}
		met := "met"
		if !*r.Met {
			met = "NOT met"
		}
		fmt.Fprintf(w, "| %s | %.2f | %s (%s) |\n", r.Name, r.Value, r.Target, met)
	}
}
