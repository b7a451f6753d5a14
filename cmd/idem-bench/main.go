// Command idem-bench measures idem side by side with what people write
// instead, against a real Kafka broker and a durable Postgres, in one run.
//
//	make bench-e2e
//	go run ./cmd/idem-bench -brokers 127.0.0.1:9092 -postgres "$IDEM_BENCH_PG_URL" [-json]
//
// It prefills a topic, then drains it under a fresh consumer group per row:
//
//	raw         kafka-go consumer group: fetch, commit; no database (the broker ceiling)
//	naive       per message: BEGIN; INSERT dedup ON CONFLICT DO NOTHING; business
//	            INSERT; COMMIT; CommitMessages (what people hand-write)
//	idem-b1     idem, batch size 1
//	idem-b100   idem, batch size 100
//	pg-ceiling  the same claim and business insert in batches of 100 from two
//	            connections, no broker (the database ceiling)
//
// and prints messages/s, CPU seconds of this process per 100k messages, p50
// and p99 latency from fetch to acknowledgement, and the ratios between rows.
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
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	kafkago "github.com/segmentio/kafka-go"

	"github.com/idemkit/idem/adapters/kafka"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/pgstore"
)

type settings struct {
	Brokers      string  `json:"brokers"`
	Messages     int     `json:"messages"`
	SlowMessages int     `json:"slow_messages"`
	Partitions   int     `json:"partitions"`
	Size         int     `json:"message_bytes"`
	DupRate      float64 `json:"duplicate_rate"`
	Rows         string  `json:"rows"`
	Rounds       int     `json:"rounds"`
	CeilingConns int     `json:"ceiling_connections"`
}

// Row is one measured configuration.
type Row struct {
	Name       string  `json:"name"`
	Messages   int     `json:"messages"`
	Seconds    float64 `json:"seconds"`
	PerSecond  float64 `json:"messages_per_second"`
	CPUPer100k float64 `json:"cpu_seconds_per_100k"`
	DBCPU100k  float64 `json:"postgres_cpu_seconds_per_100k"`
	P50Ms      float64 `json:"p50_ms"`
	P99Ms      float64 `json:"p99_ms"`
	Effects    int64   `json:"effects"`
}

func main() {
	var s settings
	pgURL := flag.String("postgres", os.Getenv("IDEM_BENCH_PG_URL"), "durable Postgres URL (fsync on); default $IDEM_BENCH_PG_URL")
	flag.StringVar(&s.Brokers, "brokers", envOr("IDEM_TEST_KAFKA_BROKERS", "127.0.0.1:9092"), "Kafka brokers")
	flag.IntVar(&s.Messages, "messages", 200000, "messages to prefill and drain")
	flag.IntVar(&s.SlowMessages, "slow-messages", 20000, "messages the per-message rows (naive, idem-b1) drain; their rate is measured on these")
	flag.IntVar(&s.Partitions, "partitions", 8, "topic partitions")
	flag.IntVar(&s.Size, "size", 256, "message size in bytes")
	flag.Float64Var(&s.DupRate, "dup", 0.10, "share of messages that repeat an earlier business key")
	flag.StringVar(&s.Rows, "rows", "raw,naive,idem-b1,idem-b100,pg-ceiling", "rows to run, in this order")
	flag.IntVar(&s.Rounds, "rounds", 1, "run the rows this many times, alternating, and keep each row's best")
	flag.IntVar(&s.CeilingConns, "ceiling-conns", 2, "connections of the pg-ceiling row")
	asJSON := flag.Bool("json", false, "print one JSON object with every row and ratio")
	flag.Parse()
	if *pgURL == "" {
		fmt.Fprintln(os.Stderr, "idem-bench: -postgres (or IDEM_BENCH_PG_URL) is required: a durable Postgres, see scripts/testenv/postgres-durable.sh")
		os.Exit(2)
	}
	rows, err := bench(context.Background(), s, *pgURL, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "idem-bench:", err)
		os.Exit(1)
	}
	ratios := ratiosOf(rows)
	if *asJSON {
		out, _ := json.Marshal(map[string]any{"settings": s, "rows": rows, "ratios": ratios})
		fmt.Println(string(out))
		return
	}
	printTable(os.Stdout, s, rows, ratios)
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func bench(ctx context.Context, s settings, pgURL string, log io.Writer) ([]Row, error) {
	pool, err := pgxpool.New(ctx, pgURL)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	var fsync, sync string
	if err := pool.QueryRow(ctx, "SELECT current_setting('fsync'), current_setting('synchronous_commit')").Scan(&fsync, &sync); err != nil {
		return nil, err
	}
	fmt.Fprintf(log, "postgres: fsync=%s synchronous_commit=%s\n", fsync, sync)
	brokers := strings.Split(s.Brokers, ",")
	topic := fmt.Sprintf("idem-bench-%d", time.Now().UnixNano())
	payloads, unique := generate(s)
	fmt.Fprintf(log, "prefilling %s: %d messages, %d unique keys, %d partitions\n", topic, len(payloads), unique, s.Partitions)
	if err := prefill(ctx, brokers, topic, s.Partitions, payloads); err != nil {
		return nil, err
	}
	best := map[string]Row{}
	names := strings.Split(s.Rows, ",")
	for round := range s.Rounds {
		order := slices.Clone(names)
		if round%2 == 1 {
			slices.Reverse(order)
		}
		for _, name := range order {
			n := s.Messages
			if name == "naive" || name == "idem-b1" {
				n = min(n, s.SlowMessages)
			}
			fmt.Fprintf(log, "round %d: %s over %d messages...\n", round+1, name, n)
			r, err := runRow(ctx, name, n, brokers, topic, pool, payloads, s.CeilingConns)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", name, err)
			}
			fmt.Fprintf(log, "  %.0f msg/s\n", r.PerSecond)
			if b, ok := best[name]; !ok || r.PerSecond > b.PerSecond {
				best[name] = r
			}
		}
	}
	var rows []Row
	for _, name := range names {
		rows = append(rows, best[name])
	}
	return rows, nil
}

// generate makes the payloads: JSON of about size bytes, a share of them
// repeating an earlier business key with the same body.
func generate(s settings) ([][]byte, int) {
	rng := rand.New(rand.NewPCG(1, 2))
	var out [][]byte
	unique := 0
	for i := 0; len(out) < s.Messages; i++ {
		if len(out) > 0 && rng.Float64() < s.DupRate {
			out = append(out, out[rng.IntN(len(out))])
			continue
		}
		p := fmt.Sprintf(`{"txn_id":"T%012d","order_id":"O-%d","amount":%d,"pad":""}`, i, i, 100+rng.IntN(10000))
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

// latencies records fetch-to-ack durations.
type latencies struct {
	mu sync.Mutex
	d  []time.Duration
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

// postgresCPU sums the CPU time of the machine's postgres processes (a
// local server), from /proc; 0 elsewhere.
func postgresCPU() time.Duration {
	dirs, _ := os.ReadDir("/proc")
	var ticks int64
	for _, d := range dirs {
		if d.Name()[0] < '0' || d.Name()[0] > '9' {
			continue
		}
		comm, err := os.ReadFile("/proc/" + d.Name() + "/comm")
		if err != nil || strings.TrimSpace(string(comm)) != "postgres" {
			continue
		}
		stat, err := os.ReadFile("/proc/" + d.Name() + "/stat")
		if err != nil {
			continue
		}
		f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+2:]))
		if len(f) > 12 {
			var u, s int64
			fmt.Sscan(f[11], &u)
			fmt.Sscan(f[12], &s)
			ticks += u + s
		}
	}
	return time.Duration(ticks) * 10 * time.Millisecond // USER_HZ = 100
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// schema makes a fresh schema with the business table.
func schema(ctx context.Context, pool *pgxpool.Pool, name string) (string, error) {
	sc := fmt.Sprintf("bench_%s_%d", strings.ReplaceAll(name, "-", "_"), time.Now().UnixNano())
	_, err := pool.Exec(ctx, `CREATE SCHEMA `+sc+`; CREATE TABLE `+sc+`.effects (txn_id text PRIMARY KEY, amount bigint NOT NULL)`)
	return sc, err
}

func runRow(ctx context.Context, name string, n int, brokers []string, topic string, pool *pgxpool.Pool, payloads [][]byte, conns int) (Row, error) {
	r := Row{Name: name, Messages: n}
	lat := &latencies{}
	var sc string
	if name != "raw" {
		var err error
		if sc, err = schema(ctx, pool, name); err != nil {
			return r, err
		}
		defer pool.Exec(context.Background(), "DROP SCHEMA "+sc+" CASCADE")
	}
	group := fmt.Sprintf("%s-%s-%d", topic, name, time.Now().UnixNano())
	cpu0, db0, t0 := cpuTime(), postgresCPU(), time.Now()
	var err error
	switch name {
	case "raw":
		err = runRaw(ctx, brokers, topic, group, n, lat)
	case "naive":
		err = runNaive(ctx, brokers, topic, group, n, pool, sc, lat)
	case "idem-b1":
		err = runIdem(ctx, brokers, topic, group, n, pool, sc, 1, lat)
	case "idem-b100":
		err = runIdem(ctx, brokers, topic, group, n, pool, sc, 100, lat)
	case "pg-ceiling":
		err = runCeiling(ctx, pool, sc, payloads[:n], conns, lat)
	default:
		err = fmt.Errorf("unknown row %q", name)
	}
	if err != nil {
		return r, err
	}
	elapsed, cpu, db := time.Since(t0), cpuTime()-cpu0, postgresCPU()-db0
	r.Seconds = elapsed.Seconds()
	r.PerSecond = float64(n) / r.Seconds
	r.CPUPer100k = cpu.Seconds() * 100000 / float64(n)
	r.DBCPU100k = db.Seconds() * 100000 / float64(n)
	r.P50Ms, r.P99Ms = lat.pct(0.50), lat.pct(0.99)
	if sc != "" {
		_ = pool.QueryRow(ctx, "SELECT count(*) FROM "+sc+".effects").Scan(&r.Effects)
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
		lat.add(time.Since(t))
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
		lat.add(time.Since(t))
	}
	return nil
}

// insertEffects is the business write of idem's rows and the ceiling: one
// set-based INSERT for the batch's new messages.
func insertEffects(sc string) consumer.BatchHandlerFunc[pgx.Tx] {
	q := `INSERT INTO ` + sc + `.effects (txn_id, amount) SELECT * FROM unnest($1::text[], $2::bigint[])`
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
type timedSource struct {
	consumer.Source
	lat   *latencies
	stamp sync.Map // *consumer.Message -> time.Time
	acked atomic.Int64
}

func (t *timedSource) Run(ctx context.Context, deliver consumer.DeliverFunc) error {
	return t.Source.Run(ctx, func(ctx context.Context, m *consumer.Message) error {
		t.stamp.Store(m, time.Now())
		return deliver(ctx, m)
	})
}

func (t *timedSource) Ack(ctx context.Context, msgs []*consumer.Message) error {
	now := time.Now()
	for _, m := range msgs {
		if v, ok := t.stamp.LoadAndDelete(m); ok {
			t.lat.add(now.Sub(v.(time.Time)))
		}
	}
	t.acked.Add(int64(len(msgs)))
	return t.Source.Ack(ctx, msgs)
}

func runIdem(ctx context.Context, brokers []string, topic, group string, n int, pool *pgxpool.Pool, sc string, batch int, lat *latencies) error {
	st, err := pgstore.New(pool, pgstore.Config{Schema: sc})
	if err != nil {
		return err
	}
	if err := st.Migrate(ctx); err != nil {
		return err
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	src, err := kafka.New(kafka.Config{Brokers: brokers, Topics: []string{topic}, GroupID: group, MaxBytes: 4 << 20, Logger: quiet})
	if err != nil {
		return err
	}
	ts := &timedSource{Source: src, lat: lat}
	c, err := consumer.New(consumer.Config[pgx.Tx]{
		Name: "bench", Source: ts, Store: st, BatchHandler: insertEffects(sc),
		Key: consumer.ByJSONField("txn_id"), BatchSize: batch, Logger: quiet,
		DeadLetter: consumer.DeadLetterFunc(func(ctx context.Context, l consumer.Letter) error {
			return fmt.Errorf("unexpected dead letter: %v", l.Reason)
		}),
	})
	if err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	for ts.acked.Load() < int64(n) {
		select {
		case err := <-done:
			return errors.Join(errors.New("consumer stopped early"), err)
		case <-time.After(5 * time.Millisecond):
		}
	}
	stopCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return errors.Join(c.Stop(stopCtx), <-done)
}

// runCeiling is the database alone: the same claim and insert in batches of
// 100 from conns connections.
func runCeiling(ctx context.Context, pool *pgxpool.Pool, sc string, payloads [][]byte, conns int, lat *latencies) error {
	st, err := pgstore.New(pool, pgstore.Config{Schema: sc})
	if err != nil {
		return err
	}
	if err := st.Migrate(ctx); err != nil {
		return err
	}
	effects := insertEffects(sc)
	var wg sync.WaitGroup
	errs := make(chan error, conns)
	for w := range conns {
		wg.Go(func() {
			claims := make([]dedup.Claim, 0, 100)
			results := make([]dedup.Result, 100)
			msgs := make([]*consumer.Message, 0, 100)
			fresh := make([]*consumer.Message, 0, 100)
			for start := w * 100; start < len(payloads); start += 100 * conns {
				t := time.Now()
				claims, msgs = claims[:0], msgs[:0]
				for _, p := range payloads[start:min(start+100, len(payloads))] {
					id := string(p[11:24])
					claims = append(claims, dedup.Claim{Key: dedup.Key{Scope: "bench", ID: "T" + id[1:]}, Fingerprint: dedup.FingerprintOf(p)})
					msgs = append(msgs, &consumer.Message{Value: p})
				}
				err := st.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
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
				if err != nil {
					errs <- err
					return
				}
				d := time.Since(t)
				for range claims {
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
	Target string  `json:"target"`
	Met    bool    `json:"met"`
}

func ratiosOf(rows []Row) []ratio {
	rate := map[string]float64{}
	for _, r := range rows {
		rate[r.Name] = r.PerSecond
	}
	var out []ratio
	add := func(a, b string, target float64, op string) {
		if rate[a] == 0 || rate[b] == 0 {
			return
		}
		v := rate[a] / rate[b]
		out = append(out, ratio{Name: a + "/" + b, Value: v, Target: fmt.Sprintf("%s %.2f", op, target), Met: v >= target})
	}
	add("idem-b100", "raw", 0.5, ">=")
	add("idem-b100", "naive", 10, ">=")
	add("idem-b100", "idem-b1", 20, ">=")
	add("idem-b100", "pg-ceiling", 0.7, ">=")
	add("idem-b1", "naive", 0.8, ">=")
	return out
}

func printTable(w io.Writer, s settings, rows []Row, ratios []ratio) {
	fmt.Fprintf(w, "\n%d messages of %d bytes, %d partitions, %.0f%% duplicate keys; per-message rows on %d messages; pg-ceiling on %d connections; best of %d round(s)\n\n",
		s.Messages, s.Size, s.Partitions, s.DupRate*100, s.SlowMessages, s.CeilingConns, s.Rounds)
	fmt.Fprintf(w, "| row | messages | msg/s | CPU s/100k | Postgres CPU s/100k | p50 ms | p99 ms | effects |\n|---|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range rows {
		fmt.Fprintf(w, "| %s | %d | %.0f | %.2f | %.2f | %.2f | %.2f | %d |\n", r.Name, r.Messages, r.PerSecond, r.CPUPer100k, r.DBCPU100k, r.P50Ms, r.P99Ms, r.Effects)
	}
	fmt.Fprintf(w, "\n| ratio | value | target |\n|---|---:|---|\n")
	for _, r := range ratios {
		met := "met"
		if !r.Met {
			met = "NOT met"
		}
		fmt.Fprintf(w, "| %s | %.2f | %s (%s) |\n", r.Name, r.Value, r.Target, met)
	}
}
