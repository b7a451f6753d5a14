package faults_test

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"testing"

	"go.uber.org/goleak"

	"github.com/idemkit/idem/adapters/rocketmq"
	"github.com/idemkit/idem/internal/testenv"
)

func TestMain(m *testing.M) {
	testenv.ChildMain(childEnv, (*childSpec).run)
	// Scenario 22 kills a broker of the RocketMQ cluster.
	if code, rerun := testenv.RerunWithRocketMQRaceSuppressions(testenv.RocketMQBrokerLossRace); rerun {
		os.Exit(code)
	}
	// The scenarios spend most of their time waiting for child processes,
	// brokers and group rebalances, not on the CPU: run more of them at
	// once than GOMAXPROCS (go test's default) unless -parallel was given.
	flag.Parse()
	parallelSet := false
	flag.Visit(func(f *flag.Flag) { parallelSet = parallelSet || f.Name == "test.parallel" })
	if !parallelSet {
		_ = flag.Set("test.parallel", "6")
	}
	// The RocketMQ client of the parent (producer, dead-letter reader) logs
	// errors only, and nowhere.
	rocketmq.SetClientLogger(slog.New(slog.NewTextHandler(io.Discard, nil)), slog.LevelError)
	code := m.Run()
	printSummary()
	closeShared()
	if code == 0 {
		if err := goleak.Find(leakOptions...); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: goroutines of the parent are not back to their baseline: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// leakOptions ignore the goroutines the RocketMQ client (the parent's
// producer and dead-letter reader) leaves behind after Shutdown; each ends by
// itself, later than a test run. The list is adapters/rocketmq's. And those
// Toxiproxy leaves blocked (toxiproxyLeaks, proxy_test.go).
var leakOptions = append(slices.Clip(testenv.RocketMQClientLeaks), toxiproxyLeaks...)
