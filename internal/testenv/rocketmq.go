package testenv

import (
	"strings"
	"testing"
)

// RocketMQNamesrv returns the name servers in IDEM_TEST_ROCKETMQ_NAMESRV
// (host:port, separated by commas or semicolons), or skips (fails under CI)
// when it is unset.
func RocketMQNamesrv(t testing.TB) []string {
	t.Helper()
	return nameServers(t, "IDEM_TEST_ROCKETMQ_NAMESRV", "rocketmq")
}

// RocketMQClusterExclusive returns the name server of the two-broker
// cluster in IDEM_TEST_ROCKETMQ_CLUSTER (scripts/testenv/rocketmq-cluster.sh),
// or skips (fails under CI) when it is unset. The failover tests kill its
// brokers, so the test has the cluster to itself until it ends: it waits
// until no other test (in any package's test process) uses it, and
// scripts/testenv.sh up waits for it (scripts/testenv/service_lib.sh).
func RocketMQClusterExclusive(t testing.TB) []string {
	t.Helper()
	addrs := nameServers(t, "IDEM_TEST_ROCKETMQ_CLUSTER", "rocketmq-cluster")
	lockService(t, "rocketmq-cluster", true)
	return addrs
}

// nameServers returns the name servers in the environment variable name
// (host:port, separated by commas or semicolons; see Require).
func nameServers(t testing.TB, name, service string) []string {
	t.Helper()
	v := Require(t, name, service)
	var addrs []string
	for _, a := range strings.FieldsFunc(v, func(r rune) bool { return r == ',' || r == ';' }) {
		if a = strings.TrimSpace(a); a != "" {
			addrs = append(addrs, a)
		}
	}
	if len(addrs) == 0 {
		t.Fatalf("%s=%q names no name server", name, v)
	}
	return addrs
}
