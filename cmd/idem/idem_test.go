package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	kafkago "github.com/segmentio/kafka-go"

	"github.com/idemkit/idem/adapters/kafka"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/wire"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/sqlitestore"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/internal/testenv/pgtest"
	"github.com/idemkit/idem/internal/testenv/rmqtest"
)

// TestMain runs the tests with the RocketMQ client's own races suppressed,
// its logs discarded (IDEM_TEST_LOG set: on stderr), and checks for leaked
// goroutines but those the client leaves behind after Shutdown.
func TestMain(m *testing.M) {
	var w io.Writer = io.Discard
	if os.Getenv("IDEM_TEST_LOG") != "" {
		w = os.Stderr
	}
	rmqtest.Main(m, slog.New(slog.NewTextHandler(w, nil)), slog.LevelWarn)
}

// idem runs the command in-process and returns its exit status and output.
func idem(t *testing.T, stdin string, envs map[string]string, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	e := &env{stdin: strings.NewReader(stdin), stdout: &out, stderr: &errOut, getenv: func(k string) string { return envs[k] }}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	code := run(ctx, args, e)
	t.Logf("idem %q -> %d\n%s%s", args, code, out.String(), errOut.String()) // %q: the arguments may be hostile
	return code, out.String(), errOut.String()
}

func decode[T any](t *testing.T, s string) T {
	t.Helper()
	var v T
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, s)
	}
	return v
}

func TestHelpListsTheCommands(t *testing.T) {
	code, out, _ := idem(t, "", nil, "--help")
	if code != exitOK {
		t.Errorf("exit %d", code)
	}
	for _, c := range []string{"migrate", "status", "show", "failed", "release", "redrive", "purge", "retention", "console", "retries", "audit", "effects"} {
		if !strings.Contains(out, "\n  "+c+" ") {
			t.Errorf("--help does not list %s", c)
		}
	}
	if code, _, _ := idem(t, "", nil); code != exitUsage {
		t.Errorf("no command: exit %d", code)
	}
	if code, _, _ := idem(t, "", nil, "frobnicate"); code != exitUsage {
		t.Errorf("unknown command: exit %d", code)
	}
	if code, _, errOut := idem(t, "", nil, "status"); code != exitError || !strings.Contains(errOut, "IDEM_PG_URL") {
		t.Errorf("no store: exit %d, %q", code, errOut)
	}
	if code, _, _ := idem(t, "", nil, "release", "--sqlite", "x.db", "K"); code != exitUsage {
		t.Errorf("release without --scope: exit %d", code)
	}
}

// TestSQLite: status, show, failed and release on an SQLite store, with the
// confirmation and the dry run.
func TestSQLite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "idem.db")
	envs := map[string]string{"IDEM_SQLITE": path}
	if code, _, _ := idem(t, "", envs, "status"); code != exitError {
		t.Errorf("status of a missing SQLite file: exit %d", code)
	}
	if code, _, _ := idem(t, "", envs, "migrate"); code != exitOK {
		t.Fatalf("migrate: exit %d", code)
	}
	db, err := sqlitestore.Open(path, sqlitestore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	st, err := sqlitestore.New(db, sqlitestore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	claim := func(id string) dedup.Claim {
		return dedup.Claim{Key: dedup.Key{Scope: "pay", ID: id}, Fingerprint: dedup.FingerprintOf([]byte(id)), Source: "pay/0/" + id}
	}
	results := make([]dedup.Result, 2)
	if err := st.InTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		return st.Claim(ctx, tx, []dedup.Claim{claim("A1"), claim("A2")}, results)
	}); err != nil {
		t.Fatal(err)
	}
	if err := st.RecordFailure(ctx, claim("F1"), "account closed"); err != nil {
		t.Fatal(err)
	}

	code, out, _ := idem(t, "", envs, "status", "--json")
	sum := decode[[]summaryJSON](t, out)
	if code != exitOK || len(sum) != 2 || sum[0].Outcome != "done" || sum[0].Rows != 2 || sum[1].Rows != 1 || sum[1].OldestKey != "F1" || !sum[0].Forever {
		t.Errorf("status: %d %+v", code, sum)
	}
	if code, out, _ := idem(t, "", envs, "status"); code != exitOK || !strings.Contains(out, "OLDEST KEY") || !strings.Contains(out, "forever") {
		t.Errorf("status: %d %q", code, out)
	}
	code, out, _ = idem(t, "", envs, "show", "F1", "--scope", "pay", "--json")
	rows := decode[[]rowJSON](t, out)
	if code != exitOK || len(rows) != 1 || rows[0].Outcome != "failed" || rows[0].Reason != "account closed" || rows[0].Source != "pay/0/F1" ||
		rows[0].Fingerprint != dedup.FingerprintOf([]byte("F1")).String() || rows[0].ExpiresAt != nil {
		t.Errorf("show F1: %d %+v", code, rows)
	}
	if code, out, _ := idem(t, "", envs, "show", "A1"); code != exitOK || !strings.Contains(out, "outcome      done") {
		t.Errorf("show A1: %d %q", code, out)
	}
	if code, _, _ := idem(t, "", envs, "show", "nope"); code != exitPartial {
		t.Errorf("show of a missing key: exit %d", code)
	}
	code, out, _ = idem(t, "", envs, "failed", "--json", "--reason", "closed")
	if rows := decode[[]rowJSON](t, out); code != exitOK || len(rows) != 1 || rows[0].Key != "F1" {
		t.Errorf("failed: %d %+v", code, rows)
	}
	if code, out, _ := idem(t, "", envs, "failed", "--older-than", "1h"); code != exitOK || !strings.Contains(out, "no failed rows") {
		t.Errorf("failed --older-than 1h: %d %q", code, out)
	}

	if code, out, _ := idem(t, "", envs, "release", "--scope", "pay", "--dry-run", "F1", "A1"); code != exitPartial || !strings.Contains(out, "would release pay F1") {
		t.Errorf("release --dry-run: %d %q", code, out)
	}
	if code, _, _ := idem(t, "n\n", envs, "release", "--scope", "pay", "F1"); code != exitNotConfirmed {
		t.Errorf("release answered no: exit %d", code)
	}
	if code, _, _ := idem(t, "", envs, "show", "F1", "--scope", "pay"); code != exitOK {
		t.Error("released without a confirmation")
	}
	if code, out, _ := idem(t, "y\n", envs, "release", "--scope", "pay", "F1", "A1"); code != exitPartial || !strings.Contains(out, "released pay F1") {
		t.Errorf("release answered yes: %d %q", code, out)
	}
	if code, _, _ := idem(t, "", envs, "show", "F1", "--scope", "pay"); code != exitPartial {
		t.Error("F1 was not released")
	}
	if code, _, _ := idem(t, "", envs, "show", "A1", "--scope", "pay"); code != exitOK {
		t.Error("a done row was released")
	}
	if code, out, _ := idem(t, "", envs, "purge", "--json"); code != exitOK || decode[map[string]int](t, out)["purged"] != 0 {
		t.Errorf("purge: %d %q", code, out)
	}
	if code, out, _ := idem(t, "", envs, "retention"); code != exitOK || !strings.Contains(out, "no_data") {
		t.Errorf("retention without metrics: %d %q", code, out)
	}
}

// payments is a consumer of payment callbacks on Kafka into Postgres whose
// handler refuses a blocked account: dead-lettered, recorded as failed.
type payments struct {
	t          *testing.T
	pool       *pgxpool.Pool
	schema     string
	brokers    []string
	topic, dlq string
	consumer   *consumer.Consumer[pgx.Tx]
	stop       func()
	envs       map[string]string
	tr         *kafkago.Transport
	// key is the consumer's Config.Key; nil: ByJSONField("txn_id"), or
	// none with offsets.
	key consumer.KeyFunc
	// offsets keeps the consumer's offsets in the store (Config.Offsets).
	offsets bool
}

func newPayments(t *testing.T) *payments {
	brokers := testenv.KafkaBrokers(t)
	pool, schema := testenv.SchemaPool(t)
	suffix := fmt.Sprintf("%d-%d", os.Getpid(), time.Now().UnixNano())
	p := &payments{t: t, pool: pool, schema: schema, brokers: brokers, topic: "pay-" + suffix, dlq: "pay-" + suffix + ".dlq", tr: &kafkago.Transport{}}
	t.Cleanup(p.tr.CloseIdleConnections)
	p.envs = map[string]string{"IDEM_PG_URL": testenv.PostgresURL(t), "IDEM_PG_SCHEMA": schema, "IDEM_KAFKA_BROKERS": brokers[0]}
	ctx := context.Background()
	cl := &kafkago.Client{Addr: kafkago.TCP(brokers...), Timeout: 30 * time.Second, Transport: p.tr}
	res, err := cl.CreateTopics(ctx, &kafkago.CreateTopicsRequest{Topics: []kafkago.TopicConfig{
		{Topic: p.topic, NumPartitions: 2, ReplicationFactor: 1}, {Topic: p.dlq, NumPartitions: 1, ReplicationFactor: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	for topic, err := range res.Errors {
		if err != nil {
			t.Fatalf("create %s: %v", topic, err)
		}
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE ledger (txn_id text PRIMARY KEY, amount int8 NOT NULL);
CREATE TABLE blocked (txn_id text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	return p
}

func (p *payments) produce(ids ...string) {
	p.t.Helper()
	w := &kafkago.Writer{Addr: kafkago.TCP(p.brokers...), Topic: p.topic, Balancer: &kafkago.Hash{}, RequiredAcks: kafkago.RequireAll, BatchTimeout: time.Millisecond, Transport: p.tr}
	defer w.Close()
	var msgs []kafkago.Message
	for i, id := range ids {
		msgs = append(msgs, kafkago.Message{Key: []byte(id), Value: fmt.Appendf(nil, `{"txn_id":%q,"amount":%d}`, id, 100+i),
			Headers: []kafkago.Header{{Key: "traceparent", Value: []byte("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")}}})
	}
	if err := w.WriteMessages(context.Background(), msgs...); err != nil {
		p.t.Fatal(err)
	}
}

func (p *payments) start() {
	src, err := kafka.New(kafka.Config{Brokers: p.brokers, Topics: []string{p.topic}, Group: p.topic, DeadLetterTopic: p.dlq, Logger: testenv.Logger(p.t)})
	if err != nil {
		p.t.Fatal(err)
	}
	key := p.key
	if key == nil && !p.offsets {
		key = consumer.ByJSONField("txn_id")
	}
	p.consumer, p.stop = startPay(p.t, p.pool, p.schema, consumer.Config[pgx.Tx]{Source: src, DeadLetter: src, Key: key}, p.offsets, 30*time.Second)
}

// startPay runs the tests' consumer "pay" of cfg's source on a migrated
// pgstore in schema (its offset store too, with offsets), until stop
// (idempotent; the test's end stops it too) gives it grace to stop. It
// books each payment callback in ledger, and dead-letters those whose
// txn_id is in blocked.
func startPay(t *testing.T, pool *pgxpool.Pool, schema string, cfg consumer.Config[pgx.Tx], offsets bool, grace time.Duration) (*consumer.Consumer[pgx.Tx], func()) {
	ctx := context.Background()
	store := pgtest.Store(t, pool, schema)
	if offsets {
		cfg.Offsets = store
	}
	cfg.Name, cfg.Store, cfg.Logger = "pay", store, testenv.Logger(t)
	cfg.Handler = consumer.HandlerFunc[pgx.Tx](func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		var cb struct {
			TxnID  string `json:"txn_id"`
			Amount int64  `json:"amount"`
		}
		if err := json.Unmarshal(m.Value, &cb); err != nil {
			return consumer.Permanent(err)
		}
		var blocked bool
		if err := tx.QueryRow(ctx, `SELECT exists(SELECT FROM blocked WHERE txn_id = $1)`, cb.TxnID).Scan(&blocked); err != nil {
			return err
		}
		if blocked {
			return consumer.Permanent(errors.New("account blocked"))
		}
		_, err := tx.Exec(ctx, `INSERT INTO ledger VALUES ($1, $2)`, cb.TxnID, cb.Amount)
		return err
	})
	c, err := consumer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	var once sync.Once
	stop := func() { // stops this consumer; the caller may start another
		once.Do(func() {
			stopCtx, cancelStop := context.WithTimeout(ctx, grace)
			defer cancelStop()
			if err := c.Stop(stopCtx); err != nil {
				t.Error(err)
			}
			cancel()
			if err := <-done; err != nil {
				t.Error(err)
			}
		})
	}
	t.Cleanup(stop)
	return c, stop
}

// waitFor waits until the consumer's stats satisfy ok.
func (p *payments) waitFor(what string, ok func(consumer.Stats) bool) {
	p.t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for !ok(p.consumer.Stats()) {
		if time.Now().After(deadline) {
			p.t.Fatalf("%s: not within 90s: %+v", what, p.consumer.Stats())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (p *payments) ledger() map[string]int { p.t.Helper(); return ledgerRows(p.t, p.pool) }

// ledgerRows counts the ledger's rows per transaction.
func ledgerRows(t testing.TB, pool *pgxpool.Pool) map[string]int {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT txn_id FROM ledger`)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, id := range ids {
		out[id]++
	}
	return out
}

// end is the sum of a topic's end offsets.
func (p *payments) end(topic string) int64 {
	p.t.Helper()
	cl := &kafkago.Client{Addr: kafkago.TCP(p.brokers...), Timeout: 10 * time.Second, Transport: p.tr}
	res, err := cl.ListOffsets(context.Background(), &kafkago.ListOffsetsRequest{Topics: map[string][]kafkago.OffsetRequest{
		topic: {kafkago.LastOffsetOf(0), kafkago.LastOffsetOf(1)}}})
	if err != nil {
		p.t.Fatal(err)
	}
	var n int64
	for _, po := range res.Topics[topic] {
		if po.Error == nil {
			n += po.LastOffset
		}
	}
	return n
}

type redriveJSON struct {
	Letters []letterResult `json:"letters"`
	Counts  map[string]int `json:"counts"`
}

// TestReleaseAndRedrive: two payments of a blocked account are
// dead-lettered and recorded as failed. status, show and failed see them.
// A redrive refuses them while their keys are not released and sends
// nothing. One account is unblocked, both keys released, and the redrive
// brings both back: the unblocked payment is applied once, the other fails
// again and is dead-lettered with its lineage; the next redrive resumes
// after the letters it sent and refuses the new one.
func TestReleaseAndRedrive(t *testing.T) {
	p := newPayments(t)
	ctx := context.Background()
	if _, err := p.pool.Exec(ctx, `INSERT INTO blocked VALUES ('T03'), ('T07')`); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for i := range 10 {
		ids = append(ids, fmt.Sprintf("T%02d", i))
	}
	p.produce(ids...)
	p.start()
	p.waitFor("10 settled", func(s consumer.Stats) bool { return s.Applied+s.DeadLettered == 10 })
	if s := p.consumer.Stats(); s.Applied != 8 || s.DeadLettered != 2 {
		t.Fatalf("stats %+v", s)
	}

	code, out, _ := idem(t, "", p.envs, "status", "--json")
	sum := decode[[]summaryJSON](t, out)
	if code != exitOK || len(sum) != 2 || sum[0].Scope != "pay" || sum[0].Rows != 8 || sum[1].Outcome != "failed" || sum[1].Rows != 2 {
		t.Errorf("status: %d %+v", code, sum)
	}
	if code, out, _ := idem(t, "", p.envs, "status"); code != exitOK || !strings.Contains(out, "OLDEST KEY") || !strings.Contains(out, " pay ") {
		t.Errorf("status: %d %q", code, out)
	}
	if code, out, _ := idem(t, "", p.envs, "failed"); code != exitOK || !strings.Contains(out, "account blocked") {
		t.Errorf("failed: %d %q", code, out)
	}
	code, out, _ = idem(t, "", p.envs, "failed", "--scope", "pay", "--json")
	failed := decode[[]rowJSON](t, out)
	if code != exitOK || len(failed) != 2 || !strings.Contains(failed[0].Reason, "account blocked") {
		t.Errorf("failed: %d %+v", code, failed)
	}
	code, out, _ = idem(t, "", p.envs, "show", "T03", "--scope", "pay", "--json")
	if rows := decode[[]rowJSON](t, out); code != exitOK || len(rows) != 1 || rows[0].Outcome != "failed" || !strings.HasPrefix(rows[0].Source, p.topic+"/") {
		t.Errorf("show T03: %d %+v", code, rows)
	}

	// Not released: refused, nothing sent, nothing committed.
	topicEnd := p.end(p.topic)
	code, out, _ = idem(t, "", p.envs, "redrive", "--topic", p.dlq, "--json")
	rd := decode[redriveJSON](t, out)
	if code != exitPartial || rd.Counts["refused"] != 1 || rd.Counts["sent"] != 0 || !strings.Contains(rd.Letters[0].Reason, "release it first") {
		t.Errorf("redrive of unreleased keys: %d %+v", code, rd)
	}
	if code, out, _ = idem(t, "", p.envs, "redrive", "--topic", p.dlq, "--dry-run", "--json"); code != exitPartial {
		t.Errorf("redrive --dry-run: exit %d", code)
	}
	if rd := decode[redriveJSON](t, out); rd.Counts["refused"] != 1 || len(rd.Letters) != 1 {
		t.Errorf("redrive --dry-run shows more than the run does (its partition stops at the first refused letter): %+v", rd)
	}
	if end := p.end(p.topic); end != topicEnd {
		t.Fatalf("a refused redrive sent %d messages", end-topicEnd)
	}

	// T03's account is fixed; both keys released; T07 fails again.
	if _, err := p.pool.Exec(ctx, `DELETE FROM blocked WHERE txn_id = 'T03'`); err != nil {
		t.Fatal(err)
	}
	if code, _, _ := idem(t, "", p.envs, "release", "--scope", "pay", "--yes", "T03", "T07"); code != exitOK {
		t.Fatalf("release: exit %d", code)
	}
	code, out, _ = idem(t, "", p.envs, "redrive", "--topic", p.dlq, "--json")
	rd = decode[redriveJSON](t, out)
	if code != exitOK || rd.Counts["sent"] != 2 || len(rd.Letters) != 2 {
		t.Fatalf("redrive: %d %+v", code, rd)
	}
	for _, l := range rd.Letters {
		if l.Count != 1 || !strings.HasPrefix(l.To, p.topic+"/") {
			t.Errorf("letter %+v", l)
		}
	}
	p.waitFor("the redriven two settled", func(s consumer.Stats) bool { return s.Applied+s.DeadLettered == 12 })
	if s := p.consumer.Stats(); s.Applied != 9 || s.DeadLettered != 3 {
		t.Errorf("after the redrive: %+v", s)
	}
	if got := p.ledger(); got["T03"] != 1 || len(got) != 9 || got["T07"] != 0 {
		t.Errorf("ledger after the redrive: %v", got)
	}

	// The next redrive starts after the two letters it sent: it sees T07's
	// new letter, with its lineage, and refuses it: T07 failed again.
	code, out, _ = idem(t, "", p.envs, "redrive", "--topic", p.dlq, "--json")
	rd = decode[redriveJSON](t, out)
	if code != exitPartial || len(rd.Letters) != 1 || rd.Letters[0].Key != "T07" || rd.Letters[0].Count != 2 || rd.Letters[0].Action != "refused" {
		t.Errorf("second redrive: %d %+v", code, rd)
	}
	lineage := readLetter(t, p.brokers, p.dlq, 2)
	for k, want := range map[string]string{wire.MetaRedriveCount: "1", wire.MetaRedrivenFrom: p.dlq + "/0/"} {
		if v := lineage[k]; !strings.HasPrefix(v, want) {
			t.Errorf("the redriven T07's dead letter: %s = %q, want %q…", k, v, want)
		}
	}
	if lineage["traceparent"] == "" {
		t.Error("the producer's traceparent was lost on the way")
	}

	// A new redrive group from the start: T03's letter is passed by as a
	// duplicate now that its key was applied, so a payment is never
	// applied twice by a redrive.
	code, out, _ = idem(t, "", p.envs, "redrive", "--topic", p.dlq, "--group", "again", "--skip", "--json")
	rd = decode[redriveJSON](t, out)
	var t03 []letterResult
	for _, l := range rd.Letters {
		if l.Key == "T03" {
			t03 = append(t03, l)
		}
	}
	if code != exitPartial || len(t03) != 1 || t03[0].Action != "duplicate" || !strings.Contains(t03[0].Reason, "applied") {
		t.Errorf("redrive of an applied key: %d %+v", code, rd)
	}
	if got := p.ledger(); got["T03"] != 1 {
		t.Errorf("T03 applied %d times", got["T03"])
	}
}

// readLetter reads the dead letter at offset of partition 0 and returns its
// headers.
func readLetter(t *testing.T, brokers []string, topic string, offset int64) map[string]string {
	t.Helper()
	m := readAt(t, brokers, topic, offset)
	out := map[string]string{}
	for _, h := range m.Headers {
		out[h.Key] = string(h.Value)
	}
	return out
}

// readAt reads the record at offset of partition 0 of topic.
func readAt(t *testing.T, brokers []string, topic string, offset int64) kafkago.Message {
	t.Helper()
	r := kafkago.NewReader(kafkago.ReaderConfig{Brokers: brokers, Topic: topic, Partition: 0, MaxWait: 100 * time.Millisecond})
	defer r.Close()
	if err := r.SetOffset(offset); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m, err := r.ReadMessage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return m
}
