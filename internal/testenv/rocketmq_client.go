package testenv

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"

	"go.uber.org/goleak"
)

// RocketMQClientLeaks ignore the goroutines rocketmq-client-go leaves behind
// after Shutdown. Each ends by itself, but later than a test run, because it
// sleeps or waits before it looks at the client's done channel.
var RocketMQClientLeaks = []goleak.Option{
	// push consumer: the expired-message cleaner sleeps ConsumeTimeout (15
	// min) first.
	goleak.IgnoreAnyFunction("github.com/apache/rocketmq-client-go/v2/consumer.(*pushConsumer).Start.func1.2"),
	// statistics: samplers sleep until the next minute, hour and month.
	goleak.IgnoreAnyFunction("github.com/apache/rocketmq-client-go/v2/consumer.(*statsItemSet).init.func4"),
	goleak.IgnoreAnyFunction("github.com/apache/rocketmq-client-go/v2/consumer.(*statsItemSet).init.func5"),
	goleak.IgnoreAnyFunction("github.com/apache/rocketmq-client-go/v2/consumer.(*statsItemSet).init.func6"),
	// client: the name server updater (10s), the heartbeat (1s) and the
	// offset persister (10s) sleep first.
	goleak.IgnoreAnyFunction("github.com/apache/rocketmq-client-go/v2/internal.(*rmqClient).Start.func1.1"),
	goleak.IgnoreAnyFunction("github.com/apache/rocketmq-client-go/v2/internal.(*rmqClient).Start.func1.3"),
	goleak.IgnoreAnyFunction("github.com/apache/rocketmq-client-go/v2/internal.(*rmqClient).Start.func1.4"),
	// The per-queue consume loop ends at its next look at the done channel,
	// after the step it is in: waiting up to 5s for messages
	// (processQueue.takeMessages, orderly), an orderly queue's suspend
	// (Config.SuspendTime) or lock retry (up to 3s).
	goleak.IgnoreAnyFunction("github.com/apache/rocketmq-client-go/v2/consumer.(*pushConsumer).pullMessage.func1"),
	// A pull in flight at Shutdown waits for its 30s timeout: Shutdown
	// closes the connections but does not fail the requests waiting on them.
	goleak.IgnoreTopFunction("github.com/apache/rocketmq-client-go/v2/internal/remote.(*ResponseFuture).waitResponse"),
	// Those stragglers (pulls, heartbeats) reconnect after Shutdown, and the
	// new connection's reader waits for the 120s read timeout.
	goleak.IgnoreAnyFunction("github.com/apache/rocketmq-client-go/v2/internal/remote.(*remotingClient).receiveResponse"),
	// Start ends with "go RebalanceImmediately()" (consumer/push_consumer.go
	// at the pinned commit): a rebalance that asks the broker for the group's
	// members and offsets. Shut down right after Start, that goroutine still
	// waits on its request, which ends at its timeout (3s); seen in 1 of
	// about 5 runs of a relay test that starts and stops a consumer quickly.
	goleak.IgnoreAnyFunction("github.com/apache/rocketmq-client-go/v2/internal.(*rmqClient).RebalanceImmediately"),
	// A broker's notice that the group's members changed (another test's
	// consumer left) runs RebalanceIfNotPaused on a goroutine of its own
	// (GetOrNewRocketMQClient's handler of NOTIFY_CONSUMER_IDS_CHANGED); it
	// waits for the lock that rebalance holds, and ends with it. Seen once
	// in outbox/rocketmqpub in a make test (2026-12-06).
	goleak.IgnoreAnyFunction("github.com/apache/rocketmq-client-go/v2/internal.(*rmqClient).RebalanceIfNotPaused"),
	// The client's request cache has a process-wide janitor (package var).
	goleak.IgnoreTopFunction("github.com/patrickmn/go-cache.(*janitor).Run"),
}

// rocketMQClientRaces are data races inside rocketmq-client-go, as race
// detector suppressions. race_top matches only the frame that made the racing
// access, so a race in idem's own code is never hidden: idem neither uses
// gods nor runs inside these functions. The one race line names a closure
// of the client's that calls nothing of idem's, so it cannot hide idem's
// races either.
const rocketMQClientRaces = `
# processQueue.takeMessages and Min/Max read the message cache (a gods
# tree) without the lock putMessage writes it under (orderly mode;
# rocketmq-client-go issue #1213, unfixed).
race_top:^github.com/emirpasic/gods/
# rmqClient.Shutdown sets c.close without synchronisation while InvokeSync
# reads it (a rebalance or offset fetch running during Shutdown).
race_top:^github.com/apache/rocketmq-client-go/v2/internal.(*rmqClient).Shutdown.func1$
# The flow-control counters queueFlowControlTimes and
# queueMaxSpanFlowControlTimes are plain ints shared by all pull goroutines.
race_top:^github.com/apache/rocketmq-client-go/v2/consumer.(*pushConsumer).pullMessage$
# defaultConsumer.shutdown closes each process queue's msgCh (under the
# queue's mutex) while a pull that has just returned messages may be sending
# to it in processQueue.putMessage (outside the mutex): issue #1051, whose
# fix (PR #1052) was closed unmerged. Flagged once at a consumer's Shutdown.
# The racing accesses are the runtime's close and send, which race_top cannot
# name; race matches the closure that closes, in the closing stack, and it
# runs only the client's code. (No "$": where shutdown is inlined, the
# closure's name grows, "...Shutdown.func1.(*defaultConsumer).shutdown.func2".)
# The same window can panic "send on closed channel" in the pull goroutine,
# which no suppression helps: see "Known client defects" in
# adapters/rocketmq's doc.
race:^github.com/apache/rocketmq-client-go/v2/consumer.*(*defaultConsumer).shutdown.func
`

// RocketMQBrokerLossRace suppresses, for a package that kills a broker of a
// RocketMQ cluster (internal/testenv/faults), a race of the client's:
// namesrvs.cleanOfflineBroker (every 30 s, the heartbeat goroutine) deletes
// a broker that left every route from BrokerData.BrokerAddresses, a plain
// map, under a lock FindBrokerAddrByName (a send, a pull) does not take.
// The racing access is the runtime's map delete, so race_top cannot name
// it; race matches the frame anywhere in either stack, and
// cleanOfflineBroker also logs through idem's log bridge (adapters/rocketmq)
// — so it is passed only where a broker of a cluster is killed, not to
// every package that runs the client.
const RocketMQBrokerLossRace = "race:^github.com/apache/rocketmq-client-go/v2/internal.(*namesrvs).cleanOfflineBroker"

const rocketMQSuppressedEnv = "IDEM_ROCKETMQ_RACE_SUPPRESSED"

// RerunWithRocketMQRaceSuppressions, called first in TestMain of a package
// that runs rocketmq-client-go under -race, runs the test binary again with
// the client's known races suppressed (GORACE is read when a process starts,
// so a binary cannot suppress them in itself) and returns its exit code and
// true; the caller exits with it. In the re-run (and without -race) it
// returns false. Child processes inherit GORACE. extra are more
// suppression lines (RocketMQBrokerLossRace).
func RerunWithRocketMQRaceSuppressions(extra ...string) (int, bool) {
	if !raceEnabled || os.Getenv(rocketMQSuppressedEnv) != "" {
		return 0, false
	}
	f, err := os.CreateTemp("", "idem-rocketmq-race-*.supp")
	if err == nil {
		_, err = f.WriteString(rocketMQClientRaces + strings.Join(extra, "\n") + "\n")
		err = errors.Join(err, f.Close())
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "race suppressions:", err)
		return 2, true
	}
	defer os.Remove(f.Name())
	cmd := exec.Command(os.Args[0], os.Args[1:]...)
	cmd.Env = append(os.Environ(), rocketMQSuppressedEnv+"=1",
		"GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" suppressions="+f.Name()))
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	DieWithParent(cmd) // dies with go test's timeout kill
	if err := cmd.Run(); err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			return exit.ExitCode(), true
		}
		fmt.Fprintln(os.Stderr, "run tests:", err)
		return 2, true
	}
	return 0, true
}
