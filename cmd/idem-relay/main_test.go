package main

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"go.uber.org/goleak"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/internal/testenv/kafkatest"
	"github.com/idemkit/idem/internal/testenv/relaytest"
	"github.com/idemkit/idem/outbox"
)

// The command links the RocketMQ client, whose request cache starts a
// package-level janitor.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m, testenv.RocketMQClientLeaks...) }

// outboxMetric reads one series of the command's /metrics: its value, and
// whether it is listed; the status when /metrics does not answer 200.
func outboxMetric(t *testing.T, base, name string) (float64, bool, int) {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		return 0, false, 0
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		return 0, false, resp.StatusCode
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("/metrics: %v", err)
	}
	f := fams[name]
	if f == nil || len(f.GetMetric()) != 1 {
		return 0, false, resp.StatusCode
	}
	m := f.GetMetric()[0]
	if m.Counter != nil {
		return m.GetCounter().GetValue(), true, resp.StatusCode
	}
	return m.GetGauge().GetValue(), true, resp.StatusCode
}

// TestRelayToKafka runs the command against the test environment: it
// migrates, serves /metrics with every outbox series from 0, publishes
// what was enqueued, which /metrics then counts, and stops cleanly on
// SIGTERM.
func TestRelayToKafka(t *testing.T) {
	k := relaytest.NewKafka(t, testenv.KafkaBrokers(t))
	topic := testenv.Name(t, "t")
	k.CreateTopic(t, topic, 1, nil)
	pool, schema := testenv.SchemaPool(t)
	ob, err := outbox.New(pool, outbox.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	addr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	done := make(chan error, 1)
	go func() {
		done <- run([]string{"-postgres", testenv.PostgresURL(t), "-schema", schema, "-kafka", strings.Join(k.Brokers, ","),
			"-migrate", "-poll", "5ms", "-metrics", addr}, &out)
	}()
	ctx := testenv.Context(t, time.Minute)
	testenv.WaitUntilProgress(t, time.Minute, "the command migrated the outbox", func() (bool, string) { return ob.Check(ctx) == nil, "" })
	base := "http://" + addr
	testenv.WaitUntilProgress(t, time.Minute, "/metrics to answer", func() (bool, string) {
		_, _, code := outboxMetric(t, base, "idem_outbox_published_total")
		return code == http.StatusOK, fmt.Sprint(code)
	})
	for _, name := range []string{"idem_outbox_published_total", "idem_outbox_failed_rounds_total", "idem_outbox_republished_total", "idem_outbox_pending"} {
		if v, ok, _ := outboxMetric(t, base, name); !ok || v != 0 {
			t.Errorf("at start, %s: listed %v, %v; want 0", name, ok, v)
		}
	}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var msgs []outbox.Message
		for i := range 10 {
			msgs = append(msgs, outbox.Message{Topic: topic, Key: []byte("k"), Value: []byte(fmt.Sprintf("k %d", i))})
		}
		return ob.EnqueueFor(ctx, tx, dedup.Key{Scope: "s", ID: "1"}, msgs...)
	}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitUntilProgress(t, time.Minute, "the outbox drained", func() (bool, string) { return relaytest.Pending(t, pool, ob) == 0, "" })
	var got []relaytest.Delivered
	for _, m := range k.ReadAll(t, topic) {
		got = append(got, relaytest.Delivered{ID: kafkatest.Header(m, outbox.HeaderID), Key: string(m.Key), Value: string(m.Value)})
	}
	relaytest.CheckKeyOrder(t, got, 10)
	testenv.WaitUntilProgress(t, time.Minute, "/metrics to count 10 published", func() (bool, string) {
		v, _, _ := outboxMetric(t, base, "idem_outbox_published_total")
		return v == 10, fmt.Sprint(v)
	})
	if resp, err := http.Get(base + "/healthz"); err != nil || resp.StatusCode != http.StatusOK {
		t.Errorf("/healthz: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	if err := syscall.Kill(syscall.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run: %v\n%s", err, out.String())
		}
	case <-time.After(time.Minute):
		t.Fatalf("no stop a minute after SIGTERM:\n%s", out.String())
	}
	if !strings.Contains(out.String(), "published=10") {
		t.Fatalf("the command's log does not say it published 10:\n%s", out.String())
	}
}
