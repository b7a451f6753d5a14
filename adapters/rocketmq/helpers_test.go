package rocketmq_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/admin"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/idemkit/idem/adapters/rocketmq"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/dedup/pgstore"
	"github.com/idemkit/idem/internal/testenv"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(runChild())
	}
	if code, rerun := testenv.RerunWithRocketMQRaceSuppressions(); rerun {
		os.Exit(code)
	}
	level := slog.LevelError
	switch os.Getenv("IDEM_TEST_LOG") {
	case "debug":
		level = slog.LevelDebug
	case "info":
		level = slog.LevelInfo
	}
	rocketmq.SetClientLogger(clientLog(), level)
	code := m.Run()
	closeEnv()
	if code == 0 {
		if err := goleak.Find(leakOptions...); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// leakOptions ignore the goroutines the RocketMQ client leaves behind after
// Shutdown. Each ends by itself, but later than a test run, because it
// sleeps or waits before it looks at the client's done channel:
var leakOptions = testenv.RocketMQClientLeaks

// clientLog is where the RocketMQ client's logs go in tests: nowhere, or
// stderr with IDEM_TEST_LOG set (the client logs errors while it shuts down,
// for requests it cut off itself).
func clientLog() *slog.Logger {
	if os.Getenv("IDEM_TEST_LOG") == "" {
		return slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return slog.New(slog.NewTextHandler(os.Stderr, nil))
}

var uniq atomic.Int64

// name returns a topic or group name unique to this test run (RocketMQ
// allows letters, digits, '_' and '-').
func name(t testing.TB, what string) string {
	s := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			return r
		}
		return '_'
	}, t.Name())
	if len(s) > 60 {
		s = s[:60]
	}
	return fmt.Sprintf("idem_%s_%s_%d_%d", what, s, os.Getpid(), uniq.Add(1))
}

// testLogger is testenv.Logger.
func testLogger(t testing.TB) *slog.Logger { return testenv.Logger(t) }

// rmqEnv is the RocketMQ of the test environment.
type rmqEnv struct {
	namesrv []string
	broker  string // address of the (single) broker, for topic creation
	admin   admin.Admin
}

var (
	envMu  sync.Mutex
	shared *rmqEnv
)

// rocketEnv returns the test environment's RocketMQ, or skips (fails under
// CI) when IDEM_TEST_ROCKETMQ_NAMESRV is unset.
func rocketEnv(t testing.TB) *rmqEnv {
	t.Helper()
	ns := testenv.RocketMQNamesrv(t)
	envMu.Lock()
	defer envMu.Unlock()
	if shared != nil {
		return shared
	}
	broker, err := brokerAddr(ns)
	if err != nil {
		t.Fatal(err)
	}
	adm, err := admin.NewAdmin(admin.WithResolver(primitive.NewPassthroughResolver(ns)))
	if err != nil {
		t.Fatalf("rocketmq admin: %v", err)
	}
	shared = &rmqEnv{namesrv: ns, broker: broker, admin: adm}
	return shared
}

func closeEnv() {
	envMu.Lock()
	defer envMu.Unlock()
	if shared != nil {
		shared.admin.Close()
		shared = nil
	}
}

// brokerAddr asks the name server, through mqadmin clusterList, for the
// address of the cluster's master broker.
func brokerAddr(namesrv []string) (string, error) {
	out, err := mqadmin("clusterList", "-n", namesrv[0])
	if err != nil {
		return "", err
	}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		// #Cluster Name  #Broker Name  #BID  #Addr ...
		if len(f) >= 4 && f[2] == "0" && strings.Contains(f[3], ":") {
			return f[3], nil
		}
	}
	return "", fmt.Errorf("mqadmin clusterList named no master broker:\n%s", out)
}

// mqadmin runs RocketMQ's own admin tool (MQAdminStartup, from the test
// environment's jars) and returns its output. It exits 0 even when the
// command failed: callers check the output.
func mqadmin(args ...string) (string, error) {
	_, file, _, _ := runtime.Caller(0)
	script := filepath.Join(filepath.Dir(file), "..", "..", "scripts", "testenv", "rocketmq.sh")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, script, append([]string{"admin"}, args...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("mqadmin %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// createTopic creates topic with queues read/write queues and waits until
// the name server routes it.
func createTopic(t testing.TB, topic string, queues int) []*primitive.MessageQueue {
	t.Helper()
	e := rocketEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := e.admin.CreateTopic(ctx, admin.WithTopicCreate(topic), admin.WithBrokerAddrCreate(e.broker),
		admin.WithReadQueueNums(queues), admin.WithWriteQueueNums(queues))
	if err != nil {
		t.Fatalf("create topic %s: %v", topic, err)
	}
	var mqs []*primitive.MessageQueue
	waitFor(t, "route of topic "+topic, time.Minute, func() bool {
		mqs, err = e.admin.FetchPublishMessageQueues(ctx, topic)
		return err == nil && len(mqs) == queues
	})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = e.admin.DeleteTopic(ctx, admin.WithTopicDelete(topic), admin.WithBrokerAddrDelete(e.broker),
			admin.WithNameSrvAddr(e.namesrv))
	})
	return mqs
}

// waitFor polls cond until it holds, failing the test after timeout. The
// timeout only bounds a hung test; nothing asserts how long it took.
func waitFor(t testing.TB, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// newProducer starts a producer for the test's messages.
func newProducer(t testing.TB, opts ...producer.Option) interface {
	SendSync(ctx context.Context, msgs ...*primitive.Message) (*primitive.SendResult, error)
} {
	t.Helper()
	e := rocketEnv(t)
	opts = append([]producer.Option{
		producer.WithNsResolver(primitive.NewPassthroughResolver(e.namesrv)),
		producer.WithGroupName(name(t, "pg")),
		producer.WithInstanceName(name(t, "pi")),
		producer.WithRetry(2),
	}, opts...)
	p, err := producer.NewDefaultProducer(opts...)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Shutdown() })
	return p
}

// send sends msgs synchronously, in batches of one topic and queue.
func send(t testing.TB, p interface {
	SendSync(ctx context.Context, msgs ...*primitive.Message) (*primitive.SendResult, error)
}, msgs ...*primitive.Message) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for len(msgs) > 0 {
		n := 1
		// A batch goes to one queue: group consecutive messages without a
		// chosen queue, or with the same one.
		for n < len(msgs) && n < 64 && sameQueue(msgs[0], msgs[n]) {
			n++
		}
		res, err := p.SendSync(ctx, msgs[:n]...)
		if err != nil || res.Status != primitive.SendOK {
			t.Fatalf("send: %v (%v)", err, res)
		}
		msgs = msgs[n:]
	}
}

func sameQueue(a, b *primitive.Message) bool {
	if a.Queue == nil || b.Queue == nil {
		return a.Queue == b.Queue
	}
	return *a.Queue == *b.Queue
}

// db is one test's Postgres: a fresh schema with the dedup table and an
// append-only effects table (no unique constraint, so that a double effect
// shows up as a second row instead of an error).
type db struct {
	pool    *pgxpool.Pool
	schema  string
	store   *pgstore.Store
	effects string
}

func newDB(t testing.TB) *db {
	t.Helper()
	pool := testenv.Pool(t)
	schema := testenv.Schema(t, pool)
	st, err := pgstore.New(pool, pgstore.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	effects := pgx.Identifier{schema, "effects"}.Sanitize()
	if _, err := pool.Exec(ctx, `CREATE TABLE `+effects+` (
		id bigserial PRIMARY KEY, key text NOT NULL, amount bigint NOT NULL DEFAULT 0,
		queue text NOT NULL DEFAULT '', seq int NOT NULL DEFAULT 0, run int NOT NULL DEFAULT 0,
		attempt int NOT NULL DEFAULT 0)`); err != nil {
		t.Fatal(err)
	}
	return &db{pool: pool, schema: schema, store: st, effects: effects}
}

func (d *db) count(t testing.TB, where string, args ...any) int {
	t.Helper()
	var n int
	q := `SELECT count(*) FROM ` + d.effects
	if where != "" {
		q += ` WHERE ` + where
	}
	if err := d.pool.QueryRow(context.Background(), q, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// running is a consumer running in the background.
type running struct {
	c      *consumer.Consumer[pgx.Tx]
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
	err    error
}

// start runs a consumer built from cfg until the test stops or kills it (or
// ends: then it is killed).
func start(t testing.TB, cfg consumer.Config[pgx.Tx]) *running {
	t.Helper()
	c, err := consumer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{c: c, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- c.Run(ctx) }()
	t.Cleanup(func() { r.kill(t) })
	return r
}

func (r *running) wait(t testing.TB) error {
	r.once.Do(func() {
		select {
		case r.err = <-r.done:
		case <-time.After(2 * time.Minute):
			t.Error("consumer.Run did not return within 2 minutes")
			r.err = errors.New("hung")
		}
	})
	return r.err
}

// stop stops the consumer gracefully.
func (r *running) stop(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := r.c.Stop(ctx); err != nil {
		t.Errorf("Stop: %v", err)
	}
	if err := r.wait(t); err != nil {
		t.Errorf("Run: %v", err)
	}
	r.cancel()
}

// kill is a hard stop: the context of Run ends, in-flight transactions roll
// back and their messages are released unacknowledged.
func (r *running) kill(t testing.TB) {
	r.cancel()
	if err := r.wait(t); err != nil {
		t.Errorf("Run: %v", err)
	}
}

// source builds a Source on the test environment.
func source(t testing.TB, cfg rocketmq.Config) *rocketmq.Source {
	t.Helper()
	cfg.NameServers = rocketEnv(t).namesrv
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t)
	}
	s, err := rocketmq.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// readTopic consumes topic from the start with a fresh group and no
// consumer in between (every message acked at once) until it has seen n
// messages, and returns them.
func readTopic(t testing.TB, topic string, n int) []*consumer.Message {
	t.Helper()
	src := source(t, rocketmq.Config{Group: name(t, "reader"), Topics: []string{topic}})
	var mu sync.Mutex
	var got []*consumer.Message
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- src.Run(ctx, func(ctx context.Context, m *consumer.Message) error {
			mu.Lock()
			got = append(got, m)
			mu.Unlock()
			go src.Ack(ctx, []*consumer.Message{m})
			return nil
		})
	}()
	waitFor(t, fmt.Sprintf("%d messages in %s", n, topic), time.Minute, func() bool {
		select {
		case err := <-done:
			t.Fatalf("reading %s: %v", topic, err)
		default:
		}
		mu.Lock()
		defer mu.Unlock()
		return len(got) >= n
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	return append([]*consumer.Message(nil), got...)
}

// topicCount returns how many messages topic holds, from mqadmin
// topicStatus (max offset - min offset over its queues).
func topicCount(t testing.TB, topic string) int {
	t.Helper()
	out, err := mqadmin("topicStatus", "-n", rocketEnv(t).namesrv[0], "-t", topic)
	if err != nil {
		t.Fatal(err)
	}
	total, rows := 0, 0
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		// #Broker Name  #QID  #Min Offset  #Max Offset  #Last Updated
		if len(f) < 4 || strings.HasPrefix(f[0], "#") {
			continue
		}
		minOff, err1 := strconv.Atoi(f[2])
		maxOff, err2 := strconv.Atoi(f[3])
		if _, err3 := strconv.Atoi(f[1]); err1 != nil || err2 != nil || err3 != nil {
			continue
		}
		total += maxOff - minOff
		rows++
	}
	if rows == 0 {
		t.Fatalf("mqadmin topicStatus %s printed no queue:\n%s", topic, out)
	}
	return total
}
