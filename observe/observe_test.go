package observe_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	dto "github.com/prometheus/client_model/go"
	kafkago "github.com/segmentio/kafka-go"
	"go.uber.org/goleak"

	"github.com/idemkit/idem/adapters/kafka"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/consumer/otelconsumer"
	"github.com/idemkit/idem/consumer/source"
	"github.com/idemkit/idem/consumer/wire"
	"github.com/idemkit/idem/dedup/memstore"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/internal/testenv/kafkatest"
	"github.com/idemkit/idem/internal/testenv/pgtest"
	"github.com/idemkit/idem/internal/testenv/promtest"
	"github.com/idemkit/idem/observe"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// healthz fetches /healthz and decodes it.
func healthz(t *testing.T, base, query string) (int, observe.HealthJSON) {
	t.Helper()
	code, body := promtest.Get(t, base+"/healthz"+query)
	var h observe.HealthJSON
	if err := json.Unmarshal([]byte(body), &h); err != nil {
		t.Fatalf("/healthz%s: %d %q: %v", query, code, body, err)
	}
	return code, h
}

// counters are every counter a consumer's telemetry exports, as Prometheus
// names them, with the labels of its zero points.
var counters = func() map[string][]map[string]string {
	c := map[string][]map[string]string{
		"messaging_client_consumed_messages_total": {{"messaging_operation_name": "process"}},
		"idem_consumer_applied_total":              {{}},
		"idem_consumer_duplicates_total":           {{}},
		"idem_consumer_released_total":             {{}},
		"idem_consumer_conflicts_total":            {{}},
		"idem_consumer_transactions_total":         {{"idem_transaction_outcome": "commit"}},
	}
	for _, cause := range wire.Causes() {
		c["idem_consumer_dead_letters_total"] = append(c["idem_consumer_dead_letters_total"], map[string]string{"idem_dead_letter_cause": cause.String()})
	}
	for _, class := range []string{"unknown", "retryable", "unavailable", "conflict"} {
		c["idem_consumer_retries_total"] = append(c["idem_consumer_retries_total"], map[string]string{"error_type": class})
	}
	return c
}()

// TestScrapeRightAfterStart runs a consumer from Kafka into Postgres
// behind a Server: a scrape right after Watch, before any message, lists
// every idem counter at 0 with the system and group the Kafka source says,
// the health gauges and the Go runtime's; once messages are applied the
// counters show them, and /healthz reports the consumer, its lanes and no
// stopped or stalled one.
func TestScrapeRightAfterStart(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	pool, schema := testenv.SchemaPool(t)
	ctx := testenv.Context(t, 3*time.Minute)
	admin := kafkatest.NewAdmin(t, brokers)
	topic := testenv.Name(t, "observe")
	admin.CreateTopic(t, topic, 2)
	admin.CreateTopic(t, topic+"_dlq", 1)
	if _, err := pool.Exec(ctx, `CREATE TABLE ledger (txn_id text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	store := pgtest.Store(t, pool, schema)
	src, err := kafka.New(kafka.Config{Brokers: brokers, Topics: []string{topic}, Group: topic, DeadLetterTopic: topic + "_dlq", Logger: testenv.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	obs, err := observe.New(observe.Config{Logger: testenv.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	tel, err := obs.Telemetry(otelconsumer.Config{})
	if err != nil {
		t.Fatal(err)
	}
	c, err := consumer.New(consumer.Config[pgx.Tx]{
		Name: "payments", Source: src, DeadLetter: src, Store: store, Observer: tel, Logger: testenv.Logger(t),
		Key: consumer.ByJSONField("txn_id"),
		Handler: consumer.HandlerFunc[pgx.Tx](func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			id, _ := consumer.ByJSONField("txn_id")(m)
			_, err := tx.Exec(ctx, `INSERT INTO ledger VALUES ($1)`, id)
			return err
		}),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := obs.Watch(c, tel); err != nil {
		t.Fatal(err)
	}
	if err := obs.Watch(c, tel); err == nil {
		t.Error("the same consumer watched twice")
	}
	base := promtest.Serve(t, obs)
	who := map[string]string{"idem_consumer_name": "payments", "messaging_system": "kafka", "messaging_consumer_group_name": topic}

	// Right after start.
	fams := promtest.Scrape(t, base)
	for name, sets := range counters {
		if f := fams[name]; f == nil || f.GetType() != dto.MetricType_COUNTER {
			t.Errorf("%s: not listed as a counter", name)
			continue
		}
		for _, extra := range sets {
			where := map[string]string{}
			for k, v := range who {
				where[k] = v
			}
			for k, v := range extra {
				where[k] = v
			}
			if v, n := promtest.Sum(fams, name, where); n != 1 || v != 0 {
				t.Errorf("%s%v: %d samples, sum %v; want one at 0", name, extra, n, v)
			}
		}
	}
	for _, name := range []string{"idem_consumer_in_flight", "idem_consumer_lanes_stopped", "idem_consumer_lanes_stalled", "idem_consumer_progress_age_seconds"} {
		if v, n := promtest.Sum(fams, name, who); n != 1 || v != 0 {
			t.Errorf("gauge %s: %d samples, %v; want one at 0 before Run", name, n, v)
		}
	}
	for _, name := range []string{"go_goroutines", "go_memstats_heap_alloc_bytes", "go_gc_duration_seconds", "process_cpu_seconds_total", "process_resident_memory_bytes"} {
		if fams[name] == nil {
			t.Errorf("no %s: the Go runtime and process metrics are missing", name)
		}
	}
	if code, h := healthz(t, base, ""); code != http.StatusServiceUnavailable || len(h.Consumers) != 1 || h.Consumers[0].Running ||
		h.Consumers[0].System != "kafka" || h.Consumers[0].Group != topic || !strings.Contains(h.Error, "not running") {
		t.Errorf("before Run: %d %+v", code, h)
	}

	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	var msgs []kafkago.Message
	for i, v := range []string{`{"txn_id":"T1"}`, `{"txn_id":"T2"}`, `{"amount":1}`, `{"txn_id":"T1"}`} {
		msgs = append(msgs, kafkago.Message{Partition: i % 2, Value: []byte(v)})
	}
	admin.Produce(t, topic, msgs...)
	var rows int
	testenv.WaitUntilProgress(t, 2*time.Minute, "the ledger has T1 and T2, every message settled", func() (bool, string) {
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM ledger`).Scan(&rows); err != nil {
			t.Fatal(err)
		}
		st := c.Stats()
		return rows == 2 && st.Applied+st.Duplicates+st.DeadLettered == 4, fmt.Sprintf("%d rows, %+v", rows, st)
	})
	// The counters of a batch are recorded when it ends, just after its
	// acknowledgement: poll.
	testenv.WaitUntilProgress(t, time.Minute, "the counters show the run", func() (bool, string) {
		fams = promtest.Scrape(t, base)
		applied, _ := promtest.Sum(fams, "idem_consumer_applied_total", who)
		dups, _ := promtest.Sum(fams, "idem_consumer_duplicates_total", who)
		bad, _ := promtest.Sum(fams, "idem_consumer_dead_letters_total", map[string]string{"idem_consumer_name": "payments", "idem_dead_letter_cause": "bad_input"})
		consumed, _ := promtest.Sum(fams, "messaging_client_consumed_messages_total", who)
		return applied == 2 && dups == 1 && bad == 1 && consumed == 4, fmt.Sprintf("applied %v, duplicates %v, bad input %v, consumed %v", applied, dups, bad, consumed)
	})
	for _, p := range []string{"0", "1"} {
		if _, n := promtest.Sum(fams, "idem_consumer_transactions_total", map[string]string{"messaging_destination_name": topic, "messaging_destination_partition_id": p}); n == 0 {
			t.Errorf("no transactions of partition %s", p)
		}
	}
	code, h := healthz(t, base, "")
	if code != http.StatusOK || !h.Ready || !h.Live || len(h.Consumers) != 1 {
		t.Fatalf("running: %d %+v", code, h)
	}
	if cj := h.Consumers[0]; !cj.Running || cj.StoppedLanes == nil || len(cj.StoppedLanes) != 0 || cj.StalledLanes == nil ||
		len(cj.StalledLanes) != 0 || cj.LastProgress == nil || len(cj.Lanes) != 2 || !strings.HasPrefix(cj.Lanes[0].Lane, topic+"/") {
		t.Errorf("running: %+v", cj)
	}

	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if code, _ := healthz(t, base, "?probe=ready"); code != http.StatusServiceUnavailable {
		t.Errorf("stopped, ready probe: %d", code)
	}
	if code, _ := healthz(t, base, "?probe=live"); code != http.StatusOK {
		t.Errorf("stopped, live probe: %d", code) // nothing in flight, nothing stopped: a restart is not asked for
	}
}

// lanesSource is a consumertest.Source that reports lanes
// (source.Description.Lanes) as given.
type lanesSource struct {
	*consumertest.Source
	lanes []source.LaneStatus
}

func (s lanesSource) Describe() source.Description {
	d := s.Source.Describe()
	d.Lanes = func() []source.LaneStatus { return s.lanes }
	return d
}

// TestHealthzShowsStoppedAndStalledLanes: a lane stopped by a message that
// used up its retries and a lane the source reports not fetched from are
// both in /healthz, by name, and in the gauges; the consumer is not live.
func TestHealthzShowsStoppedAndStalledLanes(t *testing.T) {
	inner := consumertest.NewSource(consumertest.Script{})
	src := lanesSource{Source: inner, lanes: []source.LaneStatus{
		{Lane: "pay/0", LastFetch: time.Now(), LastSettled: time.Now()},
		{Lane: "pay/1", LastFetch: time.Now().Add(-10 * time.Minute), LastSettled: time.Now().Add(-10 * time.Minute)},
	}}
	obs, err := observe.New(observe.Config{Stall: time.Minute, Logger: testenv.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	tel, err := obs.Telemetry(otelconsumer.Config{System: "test"})
	if err != nil {
		t.Fatal(err)
	}
	c, err := consumer.New(consumer.Config[*memstore.Tx]{
		Name: "payments", Source: src, DeadLetter: &consumertest.DeadLetters{}, Store: memstore.New(memstore.Config{}),
		Key: consumer.ByMessageID(), Observer: tel, Logger: testenv.Logger(t), Clock: consumertest.NewClock(),
		OnExhausted: consumer.StopLaneOnExhausted, Retry: consumer.RetryPolicy{MaxAttempts: 2},
		Handler: consumer.HandlerFunc[*memstore.Tx](func(context.Context, *memstore.Tx, *consumer.Message) error {
			return consumer.Retryable(errors.New("downstream away"))
		}),
	})
	if err != nil {
		t.Fatal(err)
	}
	base, stop := watchAndRun(t, obs, c, tel)
	inner.Push(consumertest.Message("pay", 0, 0, "", "x"))

	var h observe.HealthJSON
	var code int
	testenv.WaitUntilProgress(t, time.Minute, "pay/0 stopped", func() (bool, string) {
		code, h = healthz(t, base, "")
		return len(h.Consumers) == 1 && len(h.Consumers[0].StoppedLanes) == 1, fmt.Sprintf("%d %+v", code, h)
	})
	cj := h.Consumers[0]
	if code != http.StatusServiceUnavailable || h.Live || cj.Live || !cj.Ready ||
		cj.StoppedLanes[0] != "pay/0" || len(cj.StalledLanes) != 1 || !strings.HasPrefix(cj.StalledLanes[0], "pay/1: not fetched from for 10m") {
		t.Errorf("healthz: %d %+v", code, h)
	}
	if code, _ := healthz(t, base, "?probe=ready"); code != http.StatusOK {
		t.Errorf("ready probe %d: a stopped lane needs a restart, not a wait", code)
	}
	fams := promtest.Scrape(t, base)
	who := map[string]string{"idem_consumer_name": "payments", "messaging_system": "test"}
	if v, _ := promtest.Sum(fams, "idem_consumer_lanes_stopped", who); v != 1 {
		t.Errorf("lanes stopped gauge %v, want 1", v)
	}
	if v, _ := promtest.Sum(fams, "idem_consumer_lanes_stalled", who); v != 1 {
		t.Errorf("lanes stalled gauge %v, want 1", v)
	}
	stop()
}

// TestHealthzSaysAKeyFunctionLooksWrong: a key path with a typo fails on
// every message; /healthz names the consumer's misconfiguration, and both
// probes still pass (a restart would not fix it).
func TestHealthzSaysAKeyFunctionLooksWrong(t *testing.T) {
	src := consumertest.NewSource(consumertest.Script{})
	obs, err := observe.New(observe.Config{Logger: testenv.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	tel, err := obs.Telemetry(otelconsumer.Config{System: "test"})
	if err != nil {
		t.Fatal(err)
	}
	c, err := consumer.New(consumer.Config[*memstore.Tx]{
		Name: "payments", Source: src, DeadLetter: &consumertest.DeadLetters{}, Store: memstore.New(memstore.Config{}),
		Key: consumer.ByJSONField("txnid"), Observer: tel, Logger: testenv.Logger(t), Clock: consumertest.NewClock(),
		Handler: consumer.HandlerFunc[*memstore.Tx](func(context.Context, *memstore.Tx, *consumer.Message) error { return nil }),
	})
	if err != nil {
		t.Fatal(err)
	}
	base, stop := watchAndRun(t, obs, c, tel)
	for i := range 30 {
		src.Push(consumertest.Message("pay", 0, int64(i), "", fmt.Sprintf(`{"txn_id":"T%d"}`, i)))
	}
	var h observe.HealthJSON
	var code int
	testenv.WaitUntilProgress(t, time.Minute, "the key check's verdict", func() (bool, string) {
		code, h = healthz(t, base, "")
		return len(h.Consumers) == 1 && h.Consumers[0].Misconfigured != "", fmt.Sprintf("%d %+v", code, h)
	})
	if cj := h.Consumers[0]; code != http.StatusOK || !cj.Ready || !cj.Live || !strings.Contains(cj.Misconfigured, "Config.Key") {
		t.Errorf("healthz: %d %+v; want 200, ready and live, and the misconfiguration naming Config.Key", code, h)
	}
	stop()
}

// watchAndRun watches c with tel, serves obs and runs c. It returns the
// Server's base URL and stop, which stops c and checks what Run returned.
func watchAndRun(t *testing.T, obs *observe.Server, c *consumer.Consumer[*memstore.Tx], tel *otelconsumer.Telemetry) (base string, stop func()) {
	t.Helper()
	if err := obs.Watch(c, tel); err != nil {
		t.Fatal(err)
	}
	base = promtest.Serve(t, obs)
	ctx := testenv.Context(t, time.Minute)
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	return base, func() {
		t.Helper()
		if err := c.Stop(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}

// TestNothingWatched: a Server with no consumer is not ready, and says so;
// a probe it does not know is a bad request.
func TestNothingWatched(t *testing.T) {
	obs, err := observe.New(observe.Config{})
	if err != nil {
		t.Fatal(err)
	}
	base := promtest.Serve(t, obs)
	if code, h := healthz(t, base, ""); code != http.StatusServiceUnavailable || h.Ready || !strings.Contains(h.Error, "no consumer") {
		t.Errorf("nothing watched: %d %+v", code, h)
	}
	if code, _ := healthz(t, base, "?probe=live"); code != http.StatusOK {
		t.Errorf("nothing watched, live probe: %d", code)
	}
	if code, body := promtest.Get(t, base+"/healthz?probe=lively"); code != http.StatusBadRequest || !strings.Contains(body, "lively") {
		t.Errorf("unknown probe: %d %s", code, body)
	}
	if _, err := observe.New(observe.Config{Stall: -time.Second}); err == nil || !strings.Contains(err.Error(), "Stall") {
		t.Errorf("a negative Stall: %v", err)
	}
}
