package twohop_test

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/idemkit/idem/adapters/rocketmq"
	"github.com/idemkit/idem/internal/testenv"
)

func TestMain(m *testing.M) {
	testenv.ChildMain(childEnv, (*childSpec).run)
	if code, rerun := testenv.RerunWithRocketMQRaceSuppressions(); rerun {
		os.Exit(code)
	}
	rocketmq.SetClientLogger(slog.New(slog.NewTextHandler(io.Discard, nil)), slog.LevelError)
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(testenv.RocketMQClientLeaks...); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}
