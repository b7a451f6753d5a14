package faults_test

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"go.uber.org/goleak"

	"github.com/idemkit/idem/adapters/rocketmq"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(runChild())
	}
	if raceEnabled && os.Getenv(suppressedEnv) == "" {
		os.Exit(withRaceSuppressions())
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
// itself, later than a test run. The list is adapters/rocketmq's.
var leakOptions = []goleak.Option{
	goleak.IgnoreAnyFunction("github.com/apache/rocketmq-client-go/v2/consumer.(*pushConsumer).Start.func1.2"),
	goleak.IgnoreAnyFunction("github.com/apache/rocketmq-client-go/v2/consumer.(*statsItemSet).init.func4"),
	goleak.IgnoreAnyFunction("github.com/apache/rocketmq-client-go/v2/consumer.(*statsItemSet).init.func5"),
	goleak.IgnoreAnyFunction("github.com/apache/rocketmq-client-go/v2/consumer.(*statsItemSet).init.func6"),
	goleak.IgnoreAnyFunction("github.com/apache/rocketmq-client-go/v2/internal.(*rmqClient).Start.func1.1"),
	goleak.IgnoreAnyFunction("github.com/apache/rocketmq-client-go/v2/internal.(*rmqClient).Start.func1.3"),
	goleak.IgnoreAnyFunction("github.com/apache/rocketmq-client-go/v2/internal.(*rmqClient).Start.func1.4"),
	goleak.IgnoreAnyFunction("github.com/apache/rocketmq-client-go/v2/consumer.(*pushConsumer).pullMessage.func1"),
	goleak.IgnoreTopFunction("github.com/apache/rocketmq-client-go/v2/internal/remote.(*ResponseFuture).waitResponse"),
	goleak.IgnoreAnyFunction("github.com/apache/rocketmq-client-go/v2/internal/remote.(*remotingClient).receiveResponse"),
	goleak.IgnoreTopFunction("github.com/patrickmn/go-cache.(*janitor).Run"),
}

// clientRaces are data races inside rocketmq-client-go (adapters/rocketmq
// documents each), as race detector suppressions for the parent and the
// children. race_top matches only the frame that made the racing access, so
// a race in idem's own code is never hidden.
const clientRaces = `
race_top:^github.com/emirpasic/gods/
race_top:^github.com/apache/rocketmq-client-go/v2/internal.(*rmqClient).Shutdown.func1$
race_top:^github.com/apache/rocketmq-client-go/v2/consumer.(*pushConsumer).pullMessage$
`

const suppressedEnv = "IDEM_FAULTS_RACE_SUPPRESSED"

// withRaceSuppressions runs this test binary again with the client's known
// races suppressed (GORACE is read when a process starts) and returns its
// exit code. The children inherit GORACE.
func withRaceSuppressions() int {
	f, err := os.CreateTemp("", "idem-faults-race-*.supp")
	if err == nil {
		_, err = f.WriteString(clientRaces)
		err = errors.Join(err, f.Close())
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "race suppressions:", err)
		return 2
	}
	defer os.Remove(f.Name())
	cmd := exec.Command(os.Args[0], os.Args[1:]...)
	cmd.Env = append(os.Environ(), suppressedEnv+"=1",
		"GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" suppressions="+f.Name()))
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // dies with go test's timeout kill
	if err := cmd.Run(); err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			return exit.ExitCode()
		}
		fmt.Fprintln(os.Stderr, "run tests:", err)
		return 2
	}
	return 0
}
