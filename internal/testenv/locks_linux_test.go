package testenv

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestServicesDoNotHoldTheTestsLocks: a service started by
// scripts/testenv.sh up must not inherit the tests' lock that up holds
// while it decides (scripts/testenv/service_lib.sh): a server holding it
// shared keeps every exclusive test (KafkaExclusive, MySQLExclusive,
// RedisExclusive, RocketMQClusterExclusive) waiting for as long as the
// server runs.
func TestServicesDoNotHoldTheTestsLocks(t *testing.T) {
	state := os.Getenv("IDEM_TESTENV_DIR") // the scripts' state, as they default it
	if state == "" {
		state = "/tmp/idem-testenv"
	}
	checked := 0
	for _, pf := range []string{"kafka/kafka.pid", "mariadb/mariadbd.pid", "redis/redis.pid",
		"rocketmq-cluster/run/namesrv.pid", "rocketmq-cluster/run/broker1.pid", "rocketmq-cluster/run/broker2.pid"} {
		b, err := os.ReadFile(filepath.Join(state, pf))
		if err != nil {
			continue // not started on this machine
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			t.Fatalf("%s: %v", pf, err)
		}
		fds, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/fd")
		if err != nil {
			continue // not running
		}
		checked++
		for _, fd := range fds {
			target, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/fd/" + fd.Name())
			if err == nil && strings.HasPrefix(filepath.Base(target), "idem-") && strings.HasSuffix(target, "-tests.lock") {
				t.Errorf("%s (pid %d) holds %s on fd %s: exclusive tests would wait for it", filepath.Dir(pf), pid, target, fd.Name())
			}
		}
	}
	if checked == 0 && os.Getenv("CI") != "" {
		t.Fatal("no test service is running: start them with scripts/testenv.sh up")
	}
}
