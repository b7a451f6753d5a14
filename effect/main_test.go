package effect_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package when a test leaves a goroutine behind: a
// held call, the simulator's server, a consumer.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
