package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	kafkago "github.com/segmentio/kafka-go"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/wire"
	"github.com/idemkit/idem/internal/testenv"
)

// duplicateAges is a consumer's /metrics with the duplicate-age histogram
// of consumer/otelconsumer, for the overview's chart.
const duplicateAges = `# HELP idem_consumer_duplicate_age_seconds How old a duplicate's key was when it arrived.
# TYPE idem_consumer_duplicate_age_seconds histogram
idem_consumer_duplicate_age_seconds_bucket{idem_consumer_name="pay",le="1"} 120
idem_consumer_duplicate_age_seconds_bucket{idem_consumer_name="pay",le="10"} 310
idem_consumer_duplicate_age_seconds_bucket{idem_consumer_name="pay",le="60"} 402
idem_consumer_duplicate_age_seconds_bucket{idem_consumer_name="pay",le="600"} 455
idem_consumer_duplicate_age_seconds_bucket{idem_consumer_name="pay",le="3600"} 478
idem_consumer_duplicate_age_seconds_bucket{idem_consumer_name="pay",le="21600"} 487
idem_consumer_duplicate_age_seconds_bucket{idem_consumer_name="pay",le="86400"} 490
idem_consumer_duplicate_age_seconds_bucket{idem_consumer_name="pay",le="+Inf"} 490
idem_consumer_duplicate_age_seconds_sum{idem_consumer_name="pay"} 123456
idem_consumer_duplicate_age_seconds_count{idem_consumer_name="pay"} 490
`

// TestConsoleInTheBrowser drives the console in a headless Chromium
// (IDEM_TEST_CHROMIUM, scripts/testenv/chromium.sh) against Postgres and
// Kafka: the overview with its chart; T03, a failed key, released through
// its dry run and confirmation; its dead letter redriven the same way,
// found once on the original topic with its lineage and applied; a second
// redrive of it (another group, from the start) passes it by as a
// duplicate, nothing sent.
// With IDEM_CONSOLE_SCREENSHOTS=DIR it saves the overview and the dead
// letters there (docs/images).
func TestConsoleInTheBrowser(t *testing.T) {
	chromium := testenv.Require(t, "IDEM_TEST_CHROMIUM", "chromium")
	f := newConsoleFixture(t)
	metrics := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		fmt.Fprint(w, duplicateAges)
	}))
	defer metrics.Close()
	f.console.metrics = metrics.URL
	srv := httptest.NewServer(f.h) // on 127.0.0.1
	defer srv.Close()
	if _, err := f.pool.Exec(context.Background(), `DELETE FROM blocked`); err != nil {
		t.Fatal(err)
	}

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chromium),
		chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.WindowSize(1200, 800),
		chromedp.Flag("disable-dev-shm-usage", true))
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelAlloc()
	browser, cancelBrowser := chromedp.NewContext(allocCtx)
	defer cancelBrowser()
	ctx, cancel := context.WithTimeout(browser, 3*time.Minute)
	defer cancel()
	shots := os.Getenv("IDEM_CONSOLE_SCREENSHOTS")
	if shots != "" {
		if err := os.MkdirAll(shots, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// The browser starts on ctx and lives as long; each step is bounded.
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start %s: %v", chromium, err)
	}
	do := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		stepCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if err := chromedp.Do(stepCtx, steps...); err != nil {
			dumpCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			html, _ := chromedp.Run(dumpCtx, chromedp.Evaluate[string](`document.documentElement.outerHTML`))
			t.Fatalf("%s: %v\nthe page:\n%s", what, err, html)
		}
	}
	screenshot := func(name string) {
		t.Helper()
		if shots == "" {
			return
		}
		png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
		if err != nil {
			t.Fatalf("screenshot %s: %v", name, err)
		}
		if err := os.WriteFile(filepath.Join(shots, name), png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	text := func(what, sel string) string {
		t.Helper()
		do(what, chromedp.WaitVisible(chromedp.CSS(sel)))
		s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		return s
	}

	// Without the token, nothing; the first visit with it trades it for a
	// session cookie and takes it out of the address bar.
	do("no token", chromedp.Navigate(srv.URL+"/"), chromedp.WaitVisible(chromedp.CSS(`body`)))
	if s := text("no token", "body"); !strings.Contains(s, "a token is required") {
		t.Errorf("the console without its token:\n%s", s)
	}
	// The overview: pay's rows, its chart, the retention advice.
	do("the overview", chromedp.Navigate(srv.URL+"/?token="+testConsoleToken), chromedp.WaitVisible(chromedp.CSS(`#scope-pay svg rect`)))
	if loc, err := chromedp.Run(ctx, chromedp.Location()); err != nil || loc != srv.URL+"/" {
		t.Errorf("the address after the first visit: %q, %v; want %s/, without the token", loc, err, srv.URL)
	}
	screenshot("console-overview.png")
	if s := text("the overview", "#scope-pay"); !strings.Contains(s, "failed") || !strings.Contains(s, "Retention:") || !strings.Contains(s, "490 seen") {
		t.Errorf("the overview's pay:\n%s", s)
	}

	// Release T03: the dry run, then the confirmation.
	do("release T03", chromedp.Navigate(srv.URL+"/failed"), chromedp.WaitVisible(chromedp.CSS(`#release-T03`)), chromedp.Click(chromedp.CSS(`#release-T03`)))
	if s := text("the release's dry run", "#dryrun"); !strings.Contains(s, "would release pay T03") {
		t.Errorf("the release's dry run:\n%s", s)
	}
	do("confirm the release", chromedp.Click(chromedp.CSS(`#confirm`)))
	if s := text("the release", "#result"); !strings.Contains(s, "released pay T03") {
		t.Errorf("the release:\n%s", s)
	}
	if rows, err := f.store.Admin().Find(context.Background(), "pay", "T03"); err != nil || len(rows) != 0 {
		t.Fatalf("T03 not released: %v %+v", err, rows)
	}

	// Redrive its letter.
	topicEnd := f.end(f.topic)
	do("the dead letters", chromedp.Navigate(srv.URL+"/letters"), chromedp.WaitVisible(chromedp.CSS(`#cause-permanent`)))
	screenshot("console-dead-letters.png")
	if s := text("the dead letters", "#cause-permanent"); !strings.Contains(s, "pay/T03") || !strings.Contains(s, "would_send") {
		t.Errorf("the dead letters:\n%s", s)
	}
	do("redrive", chromedp.Click(chromedp.CSS(`#redrive`)))
	if s := text("the redrive's dry run", "#dryrun"); !strings.Contains(s, "would_send") || !strings.Contains(s, "key pay/T03") {
		t.Errorf("the redrive's dry run:\n%s", s)
	}
	do("confirm the redrive", chromedp.Click(chromedp.CSS(`#confirm`)))
	if s := text("the redrive", "#result"); !strings.Contains(s, "1 sent") {
		t.Fatalf("the redrive:\n%s", s)
	}
	copies := redriven(t, f)
	if len(copies) != 1 {
		t.Fatalf("%d redriven copies on %s, want 1: %v", len(copies), f.topic, copies)
	}
	for k, want := range map[string]string{wire.MetaRedriveCount: "1", wire.MetaRedrivenFrom: f.dlq + "/0/0", wire.MetaKey: "T03", wire.MetaTopic: f.topic} {
		if got := copies[0][k]; got != want {
			t.Errorf("the copy's %s = %q, want %q", k, got, want)
		}
	}
	f.waitFor("the copy applied", func(s consumer.Stats) bool { return s.Applied == 5 })
	if rows, err := f.store.Admin().Find(context.Background(), "pay", "T03"); err != nil || len(rows) != 1 || rows[0].Outcome != "done" {
		t.Errorf("T03 after the redrive: %v %+v", err, rows)
	}
	if got := f.ledger(); got["T03"] != 1 {
		t.Errorf("ledger %v", got)
	}

	// A second redrive: the group has passed the letter; another group,
	// from the start, finds it applied: its plan passes it by as a
	// duplicate, and sends nothing.
	do("the dead letters again", chromedp.Navigate(srv.URL+"/letters"), chromedp.WaitVisible(chromedp.CSS(`#redrive`)))
	if s := text("the dead letters again", "main"); !strings.Contains(s, "0 letter(s)") {
		t.Errorf("the dead letters after the redrive:\n%s", s)
	}
	do("a second redrive", chromedp.SetValue(chromedp.CSS(`input[name=group]`), "again"), chromedp.Click(chromedp.CSS(`#redrive`)))
	s := text("the second redrive's dry run", "#dryrun")
	if !strings.Contains(s, "duplicate") || !strings.Contains(s, "applied") || strings.Contains(s, "would_send") {
		t.Errorf("the second redrive's dry run:\n%s", s)
	}
	if s := text("the second redrive's plan", "#plan"); !strings.Contains(s, "skip_duplicate") {
		t.Errorf("the second redrive's plan:\n%s", s)
	}
	if s := text("the second redrive's button", "#confirm"); !strings.Contains(s, "Pass 1 letter(s) by") {
		t.Errorf("the second redrive's button: %q", s)
	}
	do("confirm the second redrive", chromedp.Click(chromedp.CSS(`#confirm`)))
	if s := text("the second redrive", "#result"); !strings.Contains(s, "1 duplicate") {
		t.Errorf("the second redrive:\n%s", s)
	}
	if end := f.end(f.topic); end != topicEnd+1 {
		t.Errorf("%d messages sent, want 1", end-topicEnd)
	}
}

// redriven returns the headers of the messages on the original topic that
// carry a redrive count.
func redriven(t *testing.T, f *consoleFixture) []map[string]string {
	t.Helper()
	ctx := testenv.Context(t, time.Minute)
	cl := &kafkago.Client{Addr: kafkago.TCP(f.brokers...), Timeout: 10 * time.Second, Transport: f.tr}
	res, err := cl.ListOffsets(ctx, &kafkago.ListOffsetsRequest{Topics: map[string][]kafkago.OffsetRequest{
		f.topic: {kafkago.LastOffsetOf(0), kafkago.LastOffsetOf(1)}}})
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]string
	for _, po := range res.Topics[f.topic] {
		if po.Error != nil {
			t.Fatal(po.Error)
		}
		r := kafkago.NewReader(kafkago.ReaderConfig{Brokers: f.brokers, Topic: f.topic, Partition: po.Partition, MaxWait: 100 * time.Millisecond})
		if err := r.SetOffset(0); err != nil {
			t.Fatal(err)
		}
		for range po.LastOffset {
			m, err := r.ReadMessage(ctx)
			if err != nil {
				r.Close()
				t.Fatal(err)
			}
			h := map[string]string{}
			for _, kv := range m.Headers {
				h[kv.Key] = string(kv.Value)
			}
			if _, ok := h[wire.MetaRedriveCount]; ok {
				out = append(out, h)
			}
		}
		r.Close()
	}
	return out
}
