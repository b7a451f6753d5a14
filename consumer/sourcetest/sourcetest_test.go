package sourcetest

import (
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestMemSource runs the suite against the in-memory broker: with Kafka's
// semantics, and with RocketMQ's retry topic.
func TestMemSource(t *testing.T) {
	t.Run("Kafka", func(t *testing.T) {
		Run(t, Features{OrderedLanes: true, FencedAcks: true, DeadLetters: true}, memTopic(false, sound))
	})
	t.Run("RetryTopic", func(t *testing.T) {
		Run(t, Features{OrderedLanes: true, RedeliversReleased: true, FencedAcks: true, DeadLetters: true}, memTopic(true, sound))
	})
}

const mutantEnv = "IDEM_SOURCETEST_MUTANT"

// TestSuiteCatchesBrokenSources runs the suite's tests against sources
// that break the contract, each in a process of its own (a failing test
// cannot be run inside a passing one), and requires the test that checks
// the broken part to fail.
func TestSuiteCatchesBrokenSources(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the test binary again for every broken source")
	}
	for _, c := range []struct {
		mut   mutant
		retry bool
		test  string
	}{
		{commitOnDeliver, false, "UnackedRedelivered"},
		{noDrain, false, "StopDrains"},
		{dropAcks, false, "AckedNotRedelivered"},
		{unfenced, false, "NoAckFromEarlierAssignment"},
		{newIDs, false, "UnackedRedelivered"},
		{newIDs, true, "ReleaseRedelivers"},
		{noMetadata, false, "DeadLetterShape"},
		{keepOldMetadata, false, "DeadLetterShape"},
		{reorder, false, "Delivery"},
	} {
		name := string(c.mut) + "/" + c.test
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			retry := ""
			if c.retry {
				retry = "retry"
			}
			cmd := exec.Command(os.Args[0], "-test.run=^TestMutant$/^"+c.test+"$", "-test.v", "-test.count=1")
			cmd.Env = append(os.Environ(), mutantEnv+"="+string(c.mut)+","+retry)
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("the suite passed a source that is %s:\n%s", c.mut, out)
			}
			if !strings.Contains(string(out), "--- FAIL: TestMutant/"+c.test) {
				t.Fatalf("the suite failed otherwise than in %s:\n%s", c.test, out)
			}
		})
	}
}

// TestMutant is the child of TestSuiteCatchesBrokenSources.
func TestMutant(t *testing.T) {
	spec := os.Getenv(mutantEnv)
	if spec == "" {
		t.Skip("run by TestSuiteCatchesBrokenSources")
	}
	mut, retry, _ := strings.Cut(spec, ",")
	wait = 5 * time.Second // the in-memory source is instant: a wait this long means never
	Run(t, Features{OrderedLanes: true, RedeliversReleased: retry != "", FencedAcks: true, DeadLetters: true},
		memTopic(retry != "", mutant(mut)))
}
