package consumer

import (
	"log/slog"
	"time"

	"github.com/idemkit/idem/dedup"
)

// Message is the broker-neutral envelope a Source delivers.
type Message struct {
	Topic     string
	Partition int32 // Kafka partition or RocketMQ queue ID
	Offset    int64 // Kafka offset or RocketMQ queue offset
	// ID is the broker's message ID: topic/partition/offset for Kafka; for
	// RocketMQ the unique message ID (UNIQ_KEY), else the ORIGIN_MESSAGE_ID
	// of a copy from the retry topic, else the store offset ID — one ID the
	// copies of a message share. Empty when the broker gives none.
	ID      string
	Key     []byte // Kafka record key; RocketMQ Keys
	Value   []byte
	Headers []Header // Kafka headers; RocketMQ user properties
	Time    time.Time
	// LogEnd is the end of the partition's log (Kafka's high watermark:
	// the offset after its last committed record) when the message was
	// fetched; 0 when the source does not know. With Config.Offsets a
	// stored next offset past it means the log was replaced (the topic
	// created again): see dedup.ErrOffsetsAhead.
	LogEnd int64
	// Attempt is the delivery attempt as the broker counts it, starting at 1
	// (RocketMQ: reconsume times + 1). 1 when the broker does not count.
	Attempt int
	// Lane names the ordered lane: messages of one lane are handled one batch
	// at a time, in delivery order. Sources set it to the partition or queue.
	Lane string
	// DeliveredAt is when the source handed the message to the consumer; the
	// consumer sets it. A Source must not deliver one *Message again while
	// it is in flight.
	DeliveredAt time.Time
	// Raw is the underlying broker message (*kafka.Message,
	// *primitive.MessageExt), for handlers that need more.
	Raw any

	// dedupKey is the key the consumer claimed for the message; see DedupKey.
	dedupKey dedup.Key
	// origin is the identity a redriven copy was first delivered with,
	// when hasOrigin; see Origin.
	origin    Origin
	hasOrigin bool
}

// DedupKey returns the dedup key the consumer derived for m — its scope (the
// consumer's Name, plus the tenant) and ID — and whether there is one. A
// handler and a BatchHandler see it on every message they are given: their
// effects commit with that key's row. Work that flows on from the message
// (an outbox message, see package outbox) takes its identity from it, so
// that every re-run of the handler produces the same identities. A message
// the consumer has not keyed (one built by hand) has none.
func (m *Message) DedupKey() (dedup.Key, bool) {
	return m.dedupKey, m.dedupKey != (dedup.Key{})
}

// Header is one message header or user property.
type Header struct {
	Key   string
	Value []byte
}

// Header returns the value of the first header named key.
func (m *Message) Header(key string) ([]byte, bool) {
	for i := range m.Headers {
		if m.Headers[i].Key == key {
			return m.Headers[i].Value, true
		}
	}
	return nil, false
}

// Coordinates returns where the message came from: topic/partition/offset
// (a RocketMQ queue ID is unique only within its broker: see Ref).
func (m *Message) Coordinates() string {
	return m.Topic + "/" + itoa(int64(m.Partition)) + "/" + itoa(m.Offset)
}

// Ref names the message wherever idem shows one — its logs, the source of
// its dedup row (`idem show`, `idem failed`) — in one form: its lane and
// offset, then its broker message ID in parentheses where that is not the
// same thing.
//
//	Kafka     payments/0/120                                 (the ID is the position)
//	RocketMQ  payments/broker-a/0/120 (AC110001000078308DB1B2D2D6F80000)
//
// A dead letter carries the same parts in MetaLane, MetaOffset and
// MetaMessageID. A message without a Lane is named by its Coordinates.
func (m *Message) Ref() string {
	pos := m.Coordinates()
	if m.Lane != "" {
		pos = m.Lane + "/" + itoa(m.Offset)
	}
	if m.ID == "" || m.ID == pos || m.ID == m.Coordinates() {
		return pos
	}
	return pos + " (" + m.ID + ")"
}

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
