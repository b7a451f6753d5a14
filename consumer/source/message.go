package source

import (
	"strconv"
	"time"

	"github.com/idemkit/idem/consumer/internal/envelope"
	"github.com/idemkit/idem/dedup"
)

func init() {
	envelope.SetIdentity = func(m any, k dedup.Key, fp dedup.Fingerprint) {
		msg := m.(*Message)
		msg.dedupKey, msg.dedupFingerprint = k, fp
	}
	envelope.SetOrigin = func(m any, o any) {
		msg := m.(*Message)
		msg.origin, msg.hasOrigin = Origin{}, o != nil
		if o != nil {
			msg.origin = o.(Origin)
		}
	}
}

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
	// fetched; 0 when the source does not know. With consumer.Config.Offsets a
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

	// dedupKey and dedupFingerprint are the identity the consumer claimed
	// the message with; see DedupKey and DedupFingerprint.
	dedupKey         dedup.Key
	dedupFingerprint dedup.Fingerprint
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

// DedupFingerprint returns the fingerprint the consumer derived for m with
// its key (consumer.Config.Fingerprint) — what "the same request" is under
// DedupKey — and whether there is one. Like the key it is decided at the
// message's first delivery and carried by every copy: a retry copy and a
// redriven letter give their original's. Work done for the message outside
// the store's database keeps it, so that a later message under the same key
// with another payload is not taken for this one (package effect). A
// message the consumer has not keyed, or keyed by its position alone
// (consumer.Config.Offsets without a Key), has none.
func (m *Message) DedupFingerprint() (dedup.Fingerprint, bool) {
	return m.dedupFingerprint, !m.dedupFingerprint.IsZero()
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
	return m.Topic + "/" + strconv.Itoa(int(m.Partition)) + "/" + strconv.FormatInt(m.Offset, 10)
}

// Ref names the message wherever idem shows one — its logs, the source of
// its dedup row (`idem show`, `idem failed`) — in one form: its lane and
// offset, then its broker message ID in parentheses where that is not the
// same thing.
//
//	Kafka     payments/0/120                                 (the ID is the position)
//	RocketMQ  payments/broker-a/0/120 (AC110001000078308DB1B2D2D6F80000)
//
// A dead letter carries the same parts in its wire.MetaLane,
// wire.MetaOffset and wire.MetaMessageID headers. A message without a Lane is named by its Coordinates.
func (m *Message) Ref() string {
	pos := m.Coordinates()
	if m.Lane != "" {
		pos = m.Lane + "/" + strconv.FormatInt(m.Offset, 10)
	}
	if m.ID == "" || m.ID == pos || m.ID == m.Coordinates() {
		return pos
	}
	return pos + " (" + m.ID + ")"
}

// Origin is the identity a redriven copy or a retry copy was first
// delivered with, read from its lineage headers (see package wire, and
// consumer's lineage rules).
type Origin struct {
	Topic     string
	Partition int32
	Offset    int64
	// ID is the original's Message.ID; empty when the source gave it none.
	ID string
	// Redrives is how often the message was redriven (wire.MetaRedriveCount).
	Redrives int
	// Retry: the copy came back from a retry destination (NonBlocking),
	// on a retry topic of the original's (Description.RetryOf).
	Retry bool
	// Lane is the original's lane (Message.Lane: topic/partition on Kafka,
	// topic/broker/queueId on RocketMQ), from a retry copy's wire.MetaLane;
	// empty when the copy does not say (a redriven copy, an older copy).
	Lane string
}

// HeldLane is the lane KeyOrdered holds the original's key by, and that
// its retry copies carry (wire.Letter.RetryRecord): its Lane, or
// topic/partition when that is not known (a redriven copy, whose dead
// letter named no lane of its original).
func (o Origin) HeldLane() string {
	if o.Lane != "" {
		return o.Lane
	}
	return o.Topic + "/" + strconv.FormatInt(int64(o.Partition), 10)
}

// Coordinates returns where the original came from: topic/partition/offset.
func (o Origin) Coordinates() string {
	return o.Topic + "/" + strconv.Itoa(int(o.Partition)) + "/" + strconv.FormatInt(o.Offset, 10)
}

// Origin returns the identity m was first delivered with, when m is a
// redriven or retry copy whose lineage the consumer honours; the consumer
// reads it before deriving m's key. False for any other message, and for a
// message the consumer has not seen.
func (m *Message) Origin() (Origin, bool) {
	return m.origin, m.hasOrigin
}
