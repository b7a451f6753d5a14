package consumer

import (
	"log/slog"

	"github.com/idemkit/idem/consumer/source"
	"github.com/idemkit/idem/dedup"
)

// Message is the broker-neutral envelope a Source delivers; it is defined
// in package source, the adapters' contract, and named here so that a
// handler reads consumer.Message.
type Message = source.Message

// Header is one message header or user property (source.Header).
type Header = source.Header

func itoa(n int64) string {
	if n == 0 {
		return "0"
	}
	var b [20]byte
	i := len(b)
	neg := n < 0
	if neg {
		n = -n
	}
	for n > 0 {
		i--
		b[i] = byte('0' + n%10)
		n /= 10
	}
	if neg {
		i--
		b[i] = '-'
	}
	return string(b[i:])
}

// refAttrs name a message in a log line as everywhere else: message is its
// Ref, scope and key its dedup key as `idem show --scope SCOPE KEY` takes
// it — left out when no key was derived.
func refAttrs(m *Message, k dedup.Key) []any {
	if k == (dedup.Key{}) {
		return []any{slog.String("message", m.Ref())}
	}
	return []any{slog.String("message", m.Ref()), slog.String("scope", k.Scope), slog.String("key", k.ID)}
}
