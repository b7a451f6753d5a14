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
	v := Require(t, "IDEM_TEST_ROCKETMQ_NAMESRV", "rocketmq")
	var addrs []string
	for _, a := range strings.FieldsFunc(v, func(r rune) bool { return r == ',' || r == ';' }) {
		if a = strings.TrimSpace(a); a != "" {
			addrs = append(addrs, a)
		}
	}
	if len(addrs) == 0 {
		t.Fatalf("IDEM_TEST_ROCKETMQ_NAMESRV=%q names no name server", v)
	}
	return addrs
}
