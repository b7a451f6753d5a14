package refunds_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	kafkago "github.com/segmentio/kafka-go"

	"github.com/idemkit/idem/adapters/kafka"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/pgstore"
	"github.com/idemkit/idem/effect"
	"github.com/idemkit/idem/examples/refunds"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/internal/testenv/kafkatest"
	"github.com/idemkit/idem/internal/testenv/pgtest"
	"github.com/idemkit/idem/internal/testenv/provider"
)

// refundsPerRun is the refunds of a run: 1000, about 15 s at the slowest
// row (4 lanes of 50 ms calls), or IDEM_BENCH_REFUNDS.
func refundsPerRun(b *testing.B) int { return envInt(b, "IDEM_BENCH_REFUNDS", 1000) }

// journalConns is the journal's own pool: its statements are short
// transactions between the calls; IDEM_BENCH_JOURNAL_CONNS sets it.
func journalConns(b *testing.B) int { return envInt(b, "IDEM_BENCH_JOURNAL_CONNS", 8) }

func envInt(b *testing.B, name string, def int) int {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		b.Fatalf("%s=%q: want a positive number", name, s)
	}
	return n
}

const (
	// benchPartitions as the tests: the lanes without KeyLanes, and a
	// topic of a size people run.
	benchPartitions = 4
	benchLatency    = 50 * time.Millisecond
)

// BenchmarkRefunds50ms drains a backlog of refund requests (refundsPerRun),
// each once, from a topic of benchPartitions partitions through a refund
// consumer on real Kafka and Postgres, the provider answering every
// request after 50 ms: how far KeyLanes takes a stream whose calls are
// slow. The records are partitioned as Sarama's default partitioner and
// kafka-go's Hash balancer do (FNV-1a of the key, home). journal:
// refunds.Handler, the call a step of the effect journal, on a pool of
// its own (journalConns). direct: the provider called in the handler with
// the refund's ID as its out_request_no, no journal. The consumer's pool
// has a connection for every lane (partitions × KeyLanes): each holds one
// for its batch's transaction while its calls run. Both pools are open
// before the run.
//
// refunds/s: from the first batch to the last commit (the group's join
// left out). tx-p50-ms, tx-p99-ms: how long the committed transactions
// were open; refunds/tx: how many refunds they held. call-p50-ms,
// call-p99-ms: a provider request as the client saw it. lanes: the lanes
// that ran a batch; lane-skew: the busiest lane's refunds over the mean
// (the run ends with that lane). pool-wait-ms/refund,
// journal-wait-ms/refund: waits for a connection of either pool.
// cpu-busy-%: the whole machine's, whoever kept it busy; cpu-ms/refund:
// this process's (consumer, provider, producer). Every run checks that
// each refund is booked once and executed once on the provider's ledger,
// and with the journal that each step succeeded.
func BenchmarkRefunds50ms(b *testing.B) {
	for _, journal := range []bool{true, false} {
		for _, lanes := range []int{1, 8, 32} {
			name := fmt.Sprintf("direct/keylanes=%d", lanes)
			if journal {
				name = fmt.Sprintf("journal/keylanes=%d", lanes)
			}
			b.Run(name, func(b *testing.B) {
				var m runMetrics
				for range b.N {
					b.StopTimer()
					r := newBenchRun(b, journal, lanes)
					b.StartTimer()
					r.drain()
					b.StopTimer()
					m.add(r)
				}
				m.report(b)
			})
		}
	}
}

// benchRun is one drain of the backlog.
type benchRun struct {
	b       *testing.B
	n       int // refunds
	journal bool
	cfg     consumer.Config[pgx.Tx]
	p       *provider.Server
	pool    *pgxpool.Pool
	steps   *pgstore.Store
	// stepPool is the journal's; nil without it
	stepPool *pgxpool.Pool
	obs      *txTimes
	stats    consumer.Stats
	// poolWait and stepWait are how long the consumer's and the journal's
	// pools made callers wait for a connection during the run, in all
	poolWait, stepWait time.Duration
}

func newBenchRun(b *testing.B, journal bool, keyLanes int) *benchRun {
	b.Helper()
	brokers := testenv.KafkaBrokers(b)
	lanes := benchPartitions * keyLanes
	n := refundsPerRun(b)
	schema := testenv.Schema(b, testenv.Pool(b))
	pool := benchPool(b, schema, lanes+2) // the lanes, and the source's checks
	store := pgtest.Store(b, pool, schema)
	if _, err := pool.Exec(testenv.Context(b, time.Minute), refunds.Schema); err != nil {
		b.Fatal(err)
	}
	admin := kafkatest.NewAdmin(b, brokers)
	topic := testenv.Name(b, "refunds")
	admin.CreateTopic(b, topic, benchPartitions)
	admin.CreateTopic(b, topic+".dlq", benchPartitions)
	msgs := make([]kafkago.Message, 0, n)
	for i := 1; i <= n; i++ {
		r := refunds.Request{RefundID: fmt.Sprintf("rf-%04d", i), TradeNo: fmt.Sprintf("T-rf-%04d", i), Amount: int64(100 + i)}
		msgs = append(msgs, message(r, home(r.RefundID)))
	}
	admin.Produce(b, topic, msgs...)

	p := provider.Start(b, provider.Config{Latency: benchLatency})
	obs := &txTimes{lanes: map[string]int{}}
	// An idle connection to the provider for every lane: Go's default
	// transport keeps 2 a host and would dial for the others on every call.
	ch := &refunds.Channel{URL: p.URL(), HTTP: &http.Client{Timeout: 5 * time.Second,
		Transport: timedCalls{obs, &http.Transport{MaxIdleConnsPerHost: lanes}}}}
	b.Cleanup(ch.HTTP.CloseIdleConnections)
	r := &benchRun{b: b, n: n, journal: journal, p: p, pool: pool, obs: obs}
	var h consumer.Handler[pgx.Tx] = direct{ch}
	if journal {
		r.stepPool = benchPool(b, schema, journalConns(b))
		var err error
		if r.steps, err = pgstore.New(r.stepPool, pgstore.Config{Schema: schema}); err != nil {
			b.Fatal(err)
		}
		h = &refunds.Handler{Journal: r.steps, Channel: ch, KeyTTL: 24 * time.Hour, ReadBackLag: readBackLag, Lease: 30 * time.Second}
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	src, err := kafka.New(kafka.Config{Brokers: brokers, Topics: []string{topic}, Group: testenv.Name(b, "g"),
		MaxWait: 100 * time.Millisecond, RequestTimeout: 3 * time.Second, ReconnectBackoff: 200 * time.Millisecond,
		SessionTimeout: 6 * time.Second, HeartbeatInterval: 200 * time.Millisecond, RebalanceTimeout: 10 * time.Second,
		JoinGroupBackoff: 200 * time.Millisecond, CloseTimeout: 5 * time.Second, Logger: log})
	if err != nil {
		b.Fatal(err)
	}
	r.cfg = consumer.Config[pgx.Tx]{
		Name: "refunds", Source: src, DeadLetter: src, Store: store, Handler: h,
		Key:      consumer.ByJSONField(refunds.KeyField),
		KeyLanes: keyLanes,
		Observer: r.obs,
		Logger:   log,
	}
	return r
}

// benchPool is a pool of conns connections on schema.
func benchPool(b *testing.B, schema string, conns int) *pgxpool.Pool {
	b.Helper()
	cfg, err := pgxpool.ParseConfig(testenv.PostgresURL(b))
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = int32(conns)
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	// Open every connection now, as a service's pool is open by the time
	// a backlog builds: the run measures no dialing.
	ctx := testenv.Context(b, time.Minute)
	held := make([]*pgxpool.Conn, conns)
	for i := range held {
		if held[i], err = pool.Acquire(ctx); err != nil {
			b.Fatal(err)
		}
	}
	for _, c := range held {
		c.Release()
	}
	return pool
}

// drain runs the consumer until every refund is booked, stops it, and
// checks the data.
func (r *benchRun) drain() {
	b := r.b
	c, err := consumer.New(r.cfg)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	poolWait, stepWait := r.waits()
	ran := make(chan error, 1)
	go func() { ran <- c.Run(ctx) }()
	testenv.WaitUntilProgress(b, 5*time.Minute, "every refund booked", func() (bool, string) {
		select {
		case err := <-ran:
			b.Fatalf("the consumer stopped: %v", err)
		default:
		}
		n := c.Stats().Applied
		return n >= int64(r.n), fmt.Sprintf("%d of %d booked", n, r.n)
	})
	b.StopTimer()
	r.obs.mu.Lock()
	r.obs.cpuEnd = readCPU()
	r.obs.mu.Unlock()
	r.poolWait, r.stepWait = r.waits()
	r.poolWait -= poolWait
	r.stepWait -= stepWait
	stopCtx, stopped := context.WithTimeout(context.Background(), time.Minute)
	defer stopped()
	if err := c.Stop(stopCtx); err != nil {
		b.Fatalf("stop: %v", err)
	}
	if err := <-ran; err != nil {
		b.Fatalf("run: %v", err)
	}
	r.stats = c.Stats()
	r.check()
}

// waits are how long the consumer's and the journal's pools made callers
// wait for a connection so far.
func (r *benchRun) waits() (pool, steps time.Duration) {
	pool = r.pool.Stat().AcquireDuration()
	if r.stepPool != nil {
		steps = r.stepPool.Stat().AcquireDuration()
	}
	return pool, steps
}

// check fails the benchmark unless every refund is booked once, as
// succeeded, and executed once on the provider's ledger, and, with the
// journal, its step succeeded.
func (r *benchRun) check() {
	b := r.b
	ctx := testenv.Context(b, time.Minute)
	var booked, succeeded, distinct int
	if err := r.pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE status = 'succeeded'), count(DISTINCT trade_no) FROM refunds`).
		Scan(&booked, &succeeded, &distinct); err != nil {
		b.Fatal(err)
	}
	if booked != r.n || succeeded != r.n || distinct != r.n {
		b.Fatalf("booked %d refunds (%d succeeded, %d trades), want %d each", booked, succeeded, distinct, r.n)
	}
	exec := map[string]int{}
	for _, e := range r.p.Ledger() {
		exec[e.TradeNo]++
	}
	for i := 1; i <= r.n; i++ {
		if n := exec[fmt.Sprintf("T-rf-%04d", i)]; n != 1 {
			b.Fatalf("the provider executed refund %d %d times, want once (ledger of %d for %d refunds)", i, n, len(r.p.Ledger()), r.n)
		}
	}
	if len(exec) != r.n {
		b.Fatalf("the provider executed %d trades, want %d", len(exec), r.n)
	}
	if r.journal {
		by, _, err := r.steps.CountSteps(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if by[dedup.StepSucceeded] != int64(r.n) || len(by) != 1 {
			b.Fatalf("journal steps by state %v, want %d succeeded", by, r.n)
		}
	}
}

// direct is the refund handler without the journal, as users write it:
// the provider called with the refund's own ID as its out_request_no.
type direct struct{ ch *refunds.Channel }

func (d direct) Handle(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
	var r refunds.Request
	if err := json.Unmarshal(m.Value, &r); err != nil {
		return consumer.Permanent(err)
	}
	answer, err := d.ch.Refund(ctx, effect.Call{ProviderKey: r.RefundID}, r)
	status := "succeeded"
	if refused := (*effect.RefusedError)(nil); errors.As(err, &refused) {
		status, answer, err = "refused", refused.Result, nil
	}
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `INSERT INTO refunds (refund_id, trade_no, amount, status, answer) VALUES ($1, $2, $3, $4, $5)`,
		r.RefundID, r.TradeNo, r.Amount, status, string(answer))
	return err
}

// txTimes records when the first batch started, each committed
// transaction's size, duration and end, each provider call's duration,
// and the machine's CPU counters from the first batch to the end.
type txTimes struct {
	consumer.NopObserver
	mu       sync.Mutex
	first    time.Time
	last     time.Time // the last commit's end
	open     []time.Duration
	sizes    []int
	calls    []time.Duration
	lanes    map[string]int // messages per lane
	cpuStart cpuTimes
	cpuEnd   cpuTimes
}

func (o *txTimes) BatchStart(ctx context.Context, b consumer.Batch) context.Context {
	o.mu.Lock()
	o.lanes[b.Lane] += len(b.Messages)
	if o.first.IsZero() {
		o.first = time.Now()
		o.cpuStart = readCPU()
	}
	o.mu.Unlock()
	return ctx
}

// timedCalls records the duration of each request to the provider, from
// the client's side: the provider's Latency plus the wait for a CPU.
type timedCalls struct {
	o    *txTimes
	next http.RoundTripper
}

func (t timedCalls) RoundTrip(r *http.Request) (*http.Response, error) {
	start := time.Now()
	resp, err := t.next.RoundTrip(r)
	t.o.mu.Lock()
	t.o.calls = append(t.o.calls, time.Since(start))
	t.o.mu.Unlock()
	return resp, err
}

// cpuTimes are the machine's CPU counters (the first line of /proc/stat,
// in clock ticks): how busy all its cores were, whoever kept them busy;
// and this process's CPU time (consumer, provider and producer alike).
type cpuTimes struct {
	busy, total int64
	self        time.Duration
}

func readCPU() cpuTimes {
	var c cpuTimes
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		c.self = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return c
	}
	line, _, _ := strings.Cut(string(b), "\n")
	for i, f := range strings.Fields(line)[1:] {
		v, _ := strconv.ParseInt(f, 10, 64)
		c.total += v
		if i != 3 && i != 4 { // idle, iowait
			c.busy += v
		}
	}
	return c
}

func (o *txTimes) TxEnd(_ context.Context, t consumer.TxEvent) {
	if t.Err != nil {
		return
	}
	o.mu.Lock()
	o.open = append(o.open, t.End.Sub(t.Start))
	o.sizes = append(o.sizes, t.Messages)
	if t.End.After(o.last) {
		o.last = t.End
	}
	o.mu.Unlock()
}

// runMetrics sums the runs of a sub-benchmark.
type runMetrics struct {
	refunds int
	took    time.Duration
	open    []time.Duration
	txs     int
	inTxs   int // messages in the committed transactions
	calls   []time.Duration
	retries int64
	busy    cpuTimes // over the runs' windows
	lanes   int
	skew    float64          // the busiest lane's messages over the mean, summed over runs
	waits   [2]time.Duration // the consumer's pool, the journal's
}

func (m *runMetrics) add(r *benchRun) {
	m.refunds += r.n
	m.took += r.obs.last.Sub(r.obs.first)
	m.open = append(m.open, r.obs.open...)
	for _, n := range r.obs.sizes {
		m.txs++
		m.inTxs += n
	}
	m.calls = append(m.calls, r.obs.calls...)
	m.lanes += len(r.obs.lanes)
	most, all := 0, 0
	for _, n := range r.obs.lanes {
		most, all = max(most, n), all+n
	}
	m.skew += float64(most) * float64(len(r.obs.lanes)) / float64(all)
	m.waits[0] += r.poolWait
	m.waits[1] += r.stepWait
	m.retries += r.stats.Retries
	m.busy.busy += r.obs.cpuEnd.busy - r.obs.cpuStart.busy
	m.busy.total += r.obs.cpuEnd.total - r.obs.cpuStart.total
	m.busy.self += r.obs.cpuEnd.self - r.obs.cpuStart.self
}

func (m *runMetrics) report(b *testing.B) {
	b.ReportMetric(float64(m.refunds)/m.took.Seconds(), "refunds/s")
	b.ReportMetric(quantileMs(m.open, 0.5), "tx-p50-ms")
	b.ReportMetric(quantileMs(m.open, 0.99), "tx-p99-ms")
	b.ReportMetric(float64(m.inTxs)/float64(m.txs), "refunds/tx")
	b.ReportMetric(quantileMs(m.calls, 0.5), "call-p50-ms")
	b.ReportMetric(quantileMs(m.calls, 0.99), "call-p99-ms")
	if m.busy.total > 0 {
		b.ReportMetric(100*float64(m.busy.busy)/float64(m.busy.total), "cpu-busy-%")
	}
	b.ReportMetric(float64(m.busy.self)/float64(time.Millisecond)/float64(m.refunds), "cpu-ms/refund")
	b.ReportMetric(float64(m.lanes)/float64(b.N), "lanes")
	b.ReportMetric(m.skew/float64(b.N), "lane-skew")
	b.ReportMetric(float64(m.waits[0])/float64(time.Millisecond)/float64(m.refunds), "pool-wait-ms/refund")
	b.ReportMetric(float64(m.waits[1])/float64(time.Millisecond)/float64(m.refunds), "journal-wait-ms/refund")
	b.ReportMetric(float64(m.retries), "retries")
}

// quantileMs is the q-quantile of ds, in milliseconds.
func quantileMs(ds []time.Duration, q float64) float64 {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	return float64(ds[int(q*float64(len(ds)-1))]) / float64(time.Millisecond)
}
