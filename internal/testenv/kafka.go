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
	lockKafka(t, false)
	return brokers
}

// KafkaExclusive is KafkaBrokers for a test that kills or restarts the
// broker: it waits until no other test (in any package's test process) uses
// the broker, and keeps the others out until it ends. Do not call both in
// one test.
func KafkaExclusive(t testing.TB) []string {
	t.Helper()
	brokers := kafkaBrokers(t)
	lockKafka(t, true)
	return brokers
}

func kafkaBrokers(t testing.TB) []string {
	t.Helper()
	v := Require(t, "IDEM_TEST_KAFKA_BROKERS", "kafka")
	var brokers []string
	for _, b := range strings.Split(v, ",") {
		if b = strings.TrimSpace(b); b != "" {
			brokers = append(brokers, b)
		}
	}
	if len(brokers) == 0 {
		t.Fatalf("IDEM_TEST_KAFKA_BROKERS=%q names no broker", v)
	}
	return brokers
}
