package twohop_test

import (
	"log/slog"
	"testing"

	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/internal/testenv/rmqtest"
)

func TestMain(m *testing.M) {
	testenv.ChildMain(childEnv, (*childSpec).run)
	rmqtest.Main(m, slog.New(slog.DiscardHandler), slog.LevelError)
}
