package testenv

import (
	"strings"
	"testing"
)

// KafkaBrokers returns the brokers in IDEM_TEST_KAFKA_BROKERS (comma
// separated host:port), or skips (fails under CI) when it is unset. The test
// shares the broker with other tests until it ends; see KafkaExclusive.
func KafkaBrokers(t testing.TB) []string {
	t.Helper()
	brokers := kafkaBrokers(t)
	lockService(t, "kafka", false)
	return brokers
}

// KafkaExclusive is KafkaBrokers for a test that kills or restarts the
// broker: it waits until no other test (in any package's test process) uses
// the broker, and keeps the others out until it ends. Do not call both in
// one test.
func KafkaExclusive(t testing.TB) []string {
	t.Helper()
	brokers := kafkaBrokers(t)
	lockService(t, "kafka", true)
	return brokers
}

func kafkaBrokers(t testing.TB) []string {
	t.Helper()
	return splitBrokers(t, "IDEM_TEST_KAFKA_BROKERS", "kafka")
}

// splitBrokers returns the comma-separated host:port list in the
// environment variable name (see Require).
func splitBrokers(t testing.TB, name, service string) []string {
	t.Helper()
	v := Require(t, name, service)
	var brokers []string
	for _, b := range strings.Split(v, ",") {
		if b = strings.TrimSpace(b); b != "" {
			brokers = append(brokers, b)
		}
	}
	if len(brokers) == 0 {
		t.Fatalf("%s=%q names no broker", name, v)
	}
	return brokers
}

// KafkaClusterExclusive returns the brokers of the three-node cluster in
// IDEM_TEST_KAFKA_CLUSTER (scripts/testenv/kafka-cluster.sh), or skips
// (fails under CI) when it is unset. The failover tests kill its nodes, so
// the test has the cluster to itself until it ends: it waits until no
// other test (in any package's test process) uses it, and scripts/testenv.sh
// up waits for it (scripts/testenv/service_lib.sh).
func KafkaClusterExclusive(t testing.TB) []string {
	t.Helper()
	brokers := splitBrokers(t, "IDEM_TEST_KAFKA_CLUSTER", "kafka-cluster")
	lockService(t, "kafka-cluster", true)
	return brokers
}
