package main

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/idemkit/idem/internal/testenv"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func check(t *testing.T, sum Summary, report any) {
	t.Helper()
	t.Logf("%+v %v", sum, report)
	if !sum.Reconciled || sum.DoubleApplied != 0 || sum.Applied != int64(sum.Unique) {
		t.Fatalf("not reconciled: %+v: %v", sum, report)
	}
	if sum.DuplicatesSkipped == 0 || sum.DeadLettered == 0 {
		t.Fatalf("the stream had no duplicates or no bad messages: %+v", sum)
	}
}

// TestQuickstartZeroSetup runs the quickstart as `go run ./examples/quickstart`
// does: in-process Kafka, SQLite.
func TestQuickstartZeroSetup(t *testing.T) {
	sum, report, err := run(context.Background(), "", "", 600, 3, quiet, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	check(t, sum, report)
}

// TestQuickstartRealServices runs it against the test environment's Kafka
// and Postgres.
func TestQuickstartRealServices(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	pg := testenv.PostgresURL(t)
	sum, report, err := run(context.Background(), brokers[0], pg, 600, 4, quiet, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	check(t, sum, report)
}
