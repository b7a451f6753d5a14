package main

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/idemkit/idem/internal/testenv"
)

var quiet = slog.New(slog.DiscardHandler)

func check(t *testing.T, sum Summary, report any) {
	t.Helper()
	t.Logf("%+v %v", sum, report)
	if !sum.Reconciled || sum.DoubleApplied != 0 || sum.Applied != int64(sum.Unique) {
		t.Fatalf("not reconciled: %+v: %v", sum, report)
	}
	if sum.DuplicatesSkipped == 0 || sum.DeadLettered == 0 || sum.Redelivered == 0 {
		t.Fatalf("the stream had no duplicates, no bad messages or no redelivery: %+v", sum)
	}
	if sum.Produced != sum.Unique+sum.GatewayRetries+3*sum.ChannelResends+sum.Bad+sum.Conflicting {
		t.Errorf("produced %d is not the sum of its parts: %+v", sum.Produced, sum)
	}
	if got := sum.Applied + sum.DuplicatesSkipped + sum.DeadLetterWrites + sum.Released; got != sum.Delivered {
		t.Errorf("delivered %d, applied + duplicates + dead-lettered + released = %d", sum.Delivered, got)
	}
	if got := int64(sum.Produced) + sum.Redelivered + sum.Rebalanced; got != sum.Delivered {
		t.Errorf("delivered %d, produced + redelivered + rebalanced = %d", sum.Delivered, got)
	}
}

// TestQuickstartZeroSetup runs the quickstart as `go run ./examples/quickstart`
// does: in-process Kafka, SQLite. Twice with one seed: the counts must be
// the same, unless a group rebalance redelivered more in one of the runs.
func TestQuickstartZeroSetup(t *testing.T) {
	var sums []Summary
	for range 2 {
		sum, report, err := run(context.Background(), "", "", 600, 3, quiet, io.Discard, nil)
		if err != nil {
			t.Fatal(err)
		}
		check(t, sum, report)
		sums = append(sums, sum)
	}
	switch a, b := sums[0], sums[1]; {
	case a.Rebalanced != 0 || b.Rebalanced != 0:
		t.Logf("a group rebalance redelivered messages (%d, %d): counts not compared", a.Rebalanced, b.Rebalanced)
	case a != b:
		t.Errorf("one seed, two outcomes:\n%+v\n%+v", a, b)
	}
}

// TestQuickstartRealServices runs it against the test environment's Kafka
// and Postgres.
func TestQuickstartRealServices(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	pg := testenv.PostgresURL(t)
	sum, report, err := run(context.Background(), brokers[0], pg, 600, 4, quiet, io.Discard, nil)
	if err != nil {
		t.Fatal(err)
	}
	check(t, sum, report)
}

// TestQuickstartMetrics runs the quickstart as -metrics does: it prints
// where /metrics is served, and what a scrape reads there adds up to the
// summary's counts.
func TestQuickstartMetrics(t *testing.T) {
	var where strings.Builder
	obs, stop, err := serveMetrics("127.0.0.1:0", &where)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	url := strings.Fields(strings.TrimPrefix(where.String(), "metrics: "))[0]
	if !strings.HasPrefix(where.String(), "metrics: http://127.0.0.1:") || !strings.HasSuffix(url, "/metrics") {
		t.Fatalf("the quickstart says %q", where.String())
	}
	sum, report, err := run(context.Background(), "", "", 300, 5, quiet, io.Discard, obs)
	if err != nil {
		t.Fatal(err)
	}
	check(t, sum, report)
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	counter := func(name string) int64 {
		var n float64
		for _, m := range fams[name].GetMetric() {
			n += m.GetCounter().GetValue()
		}
		return int64(n)
	}
	for name, want := range map[string]int64{
		"messaging_client_consumed_messages_total": sum.Delivered,
		"idem_consumer_applied_total":              sum.Applied,
		"idem_consumer_duplicates_total":           sum.DuplicatesSkipped,
		"idem_consumer_dead_letters_total":         sum.DeadLetterWrites,
	} {
		if got := counter(name); got != want {
			t.Errorf("%s = %d, the summary says %d", name, got, want)
		}
	}
	var ages uint64
	for _, m := range fams["idem_consumer_duplicate_age_seconds"].GetMetric() {
		ages += m.GetHistogram().GetSampleCount()
	}
	if int64(ages) != sum.DuplicatesSkipped {
		t.Errorf("%d duplicate ages, %d duplicates", ages, sum.DuplicatesSkipped)
	}
}
