package rmqtest

import (
	"fmt"
	"log/slog"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/idemkit/idem/adapters/rocketmq"
	"github.com/idemkit/idem/internal/testenv"
)

// Main is the TestMain of a package whose tests use the RocketMQ client: it
// runs the tests again with the client's own races suppressed
// (testenv.RerunWithRocketMQRaceSuppressions), sends the client's logs from
// level up to log, runs them, closes what Shared connected, and fails the
// run on a leaked goroutine but those the client leaves behind after
// Shutdown (testenv.RocketMQClientLeaks). It exits.
func Main(m *testing.M, log *slog.Logger, level slog.Level) {
	if code, rerun := testenv.RerunWithRocketMQRaceSuppressions(); rerun {
		os.Exit(code)
	}
	rocketmq.SetClientLogger(log, level)
	code := m.Run()
	CloseShared()
	if code == 0 {
		if err := goleak.Find(testenv.RocketMQClientLeaks...); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}
