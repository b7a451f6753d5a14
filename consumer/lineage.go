package consumer

import (
	"log/slog"
	"strconv"
)

// Lineage: a message that comes back keeps the identity it was first
// delivered with. A broker's redelivery has it already (the same offset,
// the same RocketMQ message ID). A copy sent back by `idem redrive` does
// not: it lies at a new offset, and Kafka's message ID is its position. So
// the redrive writes the original's identity on the copy (the
// Meta*Original* headers of its dead letter, and MetaRedriveCount), and
// the consumer reads it back here, before the key is derived:
//
//   - ByMessageID (and FallBackToMessageID) key the copy by the
//     original's message ID;
//   - with Config.Offsets alone, the copy is claimed in the key table
//     under the original's identity (its message ID, or its coordinates),
//     the key its dead letter carries (Letter.Record), since the stored
//     offset cannot tell that a message at a new offset is an old one;
//   - a dead letter of the copy keeps the original's coordinates, so that
//     it is redriven, and deduplicated, as the original again.
//
// `idem redrive` then finds the original identity's done row and refuses
// a letter whose payment was applied, however many copies of the letter
// there are and however many times it is redriven.
//
// Headers are the producer's to set: anyone who can produce to the topic
// can write lineage. Honouring it must never make a genuine message that
// has not been seen yet a duplicate, which a copy naming a later message
// would. So lineage counts only when
//
//   - MetaRedriveCount is a positive count: the message says it is a
//     redriven copy (a dead letter itself, carrying Meta*Original* without
//     it, is not one);
//   - MetaTopic is the message's own topic (a copy sent elsewhere with
//     `idem redrive --to` is a new message there);
//   - and, on a source whose message IDs are positions the broker assigns
//     (Kafka: topic/partition/offset), the original lies in the copy's own
//     partition at an earlier offset, and its message ID is that position:
//     a lane delivers a partition in offset order, so the original was
//     delivered, and settled, before the copy arrived. A copy naming a
//     later offset or another partition is keyed as a message of its own,
//     and logged. (With Config.KeyLanes the original may still be in
//     flight in another key lane; a copy that takes its key first makes it
//     a duplicate when the payloads match, and a mismatch, dead-lettered,
//     when they do not: never silently skipped unless identical.)
//   - On a source whose message IDs the producer chooses (ProducerChosenIDs:
//     RocketMQ's UNIQ_KEY, which a producer may set to anything), the
//     original's message ID counts wherever the copy lies — a copy that came
//     back through RocketMQ's retry topic is in another queue — since naming
//     another message by its ID is what any producer can do there already.

// Origin is the identity a redriven copy was first delivered with, read
// from its lineage headers (see MetaRedriveCount).
type Origin struct {
	Topic     string
	Partition int32
	Offset    int64
	// ID is the original's Message.ID; empty when the source gave it none.
	ID string
	// Redrives is how often the message was redriven (MetaRedriveCount).
	Redrives int
	// Retry: the copy came back from a retry destination (NonBlocking),
	// on a retry topic of the original's (RetryReader).
	Retry bool
	// Lane is the original's lane (Message.Lane: topic/partition on Kafka,
	// topic/broker/queueId on RocketMQ), from a retry copy's MetaLane;
	// empty when the copy does not say (a redriven copy, an older copy).
	Lane string
}

// RetryReader is a Source that reads retry copies (NonBlocking) beside
// its topics: RetryOf says whether topic is a retry topic of one of them,
// and which. A copy on a retry topic is deduplicated by the identity its
// lineage headers name (see Origin), wherever that lies; a Source that
// does not implement it reads no retry copies, and a message with retry
// headers is keyed as a message of its own. Anyone who can produce to a
// retry topic can name any message of its original topic there: allow only
// the consumer to write to it.
type RetryReader interface {
	RetryOf(topic string) (original string, ok bool)
}

// Coordinates returns where the original came from: topic/partition/offset.
func (o Origin) Coordinates() string {
	return o.Topic + "/" + itoa(int64(o.Partition)) + "/" + itoa(o.Offset)
}

// ProducerChosenIDs is a Source that says whether its Message.ID is chosen
// by the producer rather than assigned by the broker. RocketMQ's is (a
// producer may set UNIQ_KEY); Kafka's is not (its ID is the message's
// position). The consumer then honours a redriven copy's original message
// ID wherever the copy lies (see Origin). A Source that does not implement
// it is taken to assign IDs by position, the safe side: lineage is honoured
// only when it points at an earlier offset of the copy's own partition.
type ProducerChosenIDs interface {
	ProducerChosenIDs() bool
}

// Origin returns the identity m was first delivered with, when m is a
// redriven copy whose lineage the consumer honours; the consumer reads it
// before deriving m's key. False for any other message, and for a message
// the consumer has not seen.
func (m *Message) Origin() (Origin, bool) {
	return m.origin, m.hasOrigin
}

// identity is the message ID m is deduplicated by: its original's, for a
// redriven copy, else its own.
func (m *Message) identity() string {
	if m.hasOrigin {
		return m.origin.ID
	}
	return m.ID
}

// readOrigin decides whether m carries lineage the consumer honours, and
// records it on m (see Message.Origin).
func (c *Consumer[TTx]) readOrigin(m *Message) {
	o, why := lineageOf(m, c.producerIDs, c.retryOf)
	m.origin, m.hasOrigin = o, why == ""
	if why != "" && why != noLineage && why != otherTopic {
		c.cfg.Logger.Warn("idem: lineage headers not honoured; the message is keyed as a message of its own",
			slog.String("message", m.Ref()), slog.String("why", why))
	}
}

const (
	noLineage  = "no lineage"
	otherTopic = "the original was on another topic"
)

// lineageOf reads m's lineage: its origin, or why it does not count.
func lineageOf(m *Message, producerIDs bool, retryOf RetryReader) (Origin, string) {
	if _, ok := m.Header(MetaRetryAttempt); ok && retryOf != nil {
		if orig, ok := retryOf.RetryOf(m.Topic); ok {
			return retryLineage(m, orig, producerIDs)
		}
	}
	count, ok := m.Header(MetaRedriveCount)
	if !ok {
		return Origin{}, noLineage
	}
	var o Origin
	var err error
	if o.Redrives, err = strconv.Atoi(string(count)); err != nil || o.Redrives < 1 {
		return Origin{}, MetaRedriveCount + " " + strconv.Quote(string(count)) + " is not a positive count"
	}
	topic, _ := m.Header(MetaTopic)
	part, _ := m.Header(MetaPartition)
	off, _ := m.Header(MetaOffset)
	id, _ := m.Header(MetaMessageID)
	o.Topic, o.ID = string(topic), string(id)
	p, perr := strconv.ParseInt(string(part), 10, 32)
	o.Partition = int32(p)
	o.Offset, err = strconv.ParseInt(string(off), 10, 64)
	switch {
	case o.Topic == "" || perr != nil || err != nil || o.Offset < 0:
		return Origin{}, "incomplete lineage: " + MetaTopic + ", " + MetaPartition + " or " + MetaOffset + " missing or malformed"
	case o.Topic != m.Topic:
		return Origin{}, otherTopic
	case producerIDs && o.ID == "":
		return Origin{}, "no " + MetaMessageID
	case producerIDs:
		return o, ""
	case o.Partition != m.Partition:
		return Origin{}, "the original is on partition " + itoa(int64(o.Partition)) + ", the copy on " + itoa(int64(m.Partition))
	case o.Offset >= m.Offset:
		return Origin{}, "the original's offset " + itoa(o.Offset) + " is not before the copy's: a redriven copy lies after its original"
	case m.ID != "" && m.ID != m.Coordinates():
		return Origin{}, "the source's message IDs are not positions (topic/partition/offset), so the original's cannot be checked"
	case m.ID != "" && o.ID != o.Coordinates():
		return Origin{}, MetaMessageID + " " + strconv.Quote(o.ID) + " is not the position " + o.Coordinates() + " the lineage names"
	case m.ID == "" && o.ID != "":
		return Origin{}, MetaMessageID + " is set, but the source gives no message IDs"
	}
	return o, ""
}

// retryLineage reads the lineage of a copy on a retry topic of topic
// orig. The original lies on another topic, so its position cannot be
// checked against the copy's: the retry topic is trusted to hold what the
// consumer wrote there (see RetryReader).
func retryLineage(m *Message, orig string, producerIDs bool) (Origin, string) {
	var o Origin
	o.Retry = true
	if v, ok := m.Header(MetaRedriveCount); ok {
		o.Redrives, _ = strconv.Atoi(string(v))
	}
	n, _ := m.Header(MetaRetryAttempt)
	topic, _ := m.Header(MetaTopic)
	part, _ := m.Header(MetaPartition)
	off, _ := m.Header(MetaOffset)
	id, _ := m.Header(MetaMessageID)
	lane, _ := m.Header(MetaLane)
	o.Topic, o.ID, o.Lane = string(topic), string(id), string(lane)
	attempt, aerr := strconv.Atoi(string(n))
	p, perr := strconv.ParseInt(string(part), 10, 32)
	o.Partition = int32(p)
	var err error
	o.Offset, err = strconv.ParseInt(string(off), 10, 64)
	switch {
	case aerr != nil || attempt < 1:
		return Origin{}, MetaRetryAttempt + " " + strconv.Quote(string(n)) + " is not a positive count"
	case o.Topic == "" || perr != nil || err != nil || o.Offset < 0:
		return Origin{}, "incomplete lineage: " + MetaTopic + ", " + MetaPartition + " or " + MetaOffset + " missing or malformed"
	case o.Topic != orig:
		return Origin{}, "a retry copy on " + m.Topic + " names an original on " + o.Topic + ", not " + orig
	case producerIDs && o.ID == "":
		return Origin{}, "no " + MetaMessageID
	case !producerIDs && o.ID != "" && o.ID != o.Coordinates():
		return Origin{}, MetaMessageID + " " + strconv.Quote(o.ID) + " is not the position " + o.Coordinates() + " the lineage names"
	}
	return o, ""
}
