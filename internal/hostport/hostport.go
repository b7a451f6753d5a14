// Package hostport checks the broker address lists of the Kafka adapter's
// and the outbox publishers' Configs.
package hostport

import "net"

// CheckList calls add when list, the Config field named field ("Brokers"),
// is empty, and for each address of it that is not host:port.
func CheckList(field string, list []string, add func(format string, args ...any)) {
	if len(list) == 0 {
		add("%s is empty", field)
	}
	for i, a := range list {
		if _, _, err := net.SplitHostPort(a); err != nil {
			add("%s[%d] %q: want host:port: %v", field, i, a, err)
		}
	}
}
