package consumer

import (
	"log/slog"
	"strconv"

	"github.com/idemkit/idem/consumer/internal/envelope"
	"github.com/idemkit/idem/consumer/source"
	"github.com/idemkit/idem/consumer/wire"
)

// Lineage: a message that comes back keeps the identity it was first
// delivered with. A broker's redelivery has it already (the same offset,
// the same RocketMQ message ID). A copy sent back by `idem redrive` does
// not: it lies at a new offset, and Kafka's message ID is its position. So
// the redrive writes the original's identity on the copy (the
// wire.Meta*Original* headers of its dead letter, and wire.MetaRedriveCount), and
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
//   - wire.MetaRedriveCount is a positive count: the message says it is a
//     redriven copy (a dead letter itself, carrying wire.Meta*Original* without
//     it, is not one);
//   - wire.MetaTopic is the message's own topic (a copy sent elsewhere with
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
//   - On a source whose message IDs the producer chooses (source.Description.ProducerChosenIDs:
//     RocketMQ's UNIQ_KEY, which a producer may set to anything), the
//     original's message ID counts wherever the copy lies — a copy that came
//     back through RocketMQ's retry topic is in another queue — since naming
//     another message by its ID is what any producer can do there already.

// identity is the message ID m is deduplicated by: its original's, for a
// redriven copy, else its own.
func identity(m *Message) string {
	if o, ok := m.Origin(); ok {
		return o.ID
	}
	return m.ID
}

// readOrigin decides whether m carries lineage the consumer honours, and
// records it on m (see Message.Origin).
func (c *Consumer[TTx]) readOrigin(m *Message) {
	o, why := lineageOf(m, c.desc.ProducerChosenIDs, c.desc.RetryOf)
	if why == "" {
		envelope.SetOrigin(m, o)
	} else {
		envelope.SetOrigin(m, nil)
	}
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
func lineageOf(m *Message, producerIDs bool, retryOf func(topic string) (string, bool)) (source.Origin, string) {
	if _, ok := m.Header(wire.MetaRetryAttempt); ok && retryOf != nil {
		if orig, ok := retryOf(m.Topic); ok {
			return retryLineage(m, orig, producerIDs)
		}
	}
	count, ok := m.Header(wire.MetaRedriveCount)
	if !ok {
		return source.Origin{}, noLineage
	}
	var o source.Origin
	var err error
	if o.Redrives, err = strconv.Atoi(string(count)); err != nil || o.Redrives < 1 {
		return source.Origin{}, wire.MetaRedriveCount + " " + strconv.Quote(string(count)) + " is not a positive count"
	}
	topic, _ := m.Header(wire.MetaTopic)
	part, _ := m.Header(wire.MetaPartition)
	off, _ := m.Header(wire.MetaOffset)
	id, _ := m.Header(wire.MetaMessageID)
	o.Topic, o.ID = string(topic), string(id)
	p, perr := strconv.ParseInt(string(part), 10, 32)
	o.Partition = int32(p)
	o.Offset, err = strconv.ParseInt(string(off), 10, 64)
	switch {
	case o.Topic == "" || perr != nil || err != nil || o.Offset < 0:
		return source.Origin{}, "incomplete lineage: " + wire.MetaTopic + ", " + wire.MetaPartition + " or " + wire.MetaOffset + " missing or malformed"
	case o.Topic != m.Topic:
		return source.Origin{}, otherTopic
	case producerIDs && o.ID == "":
		return source.Origin{}, "no " + wire.MetaMessageID
	case producerIDs:
		return o, ""
	case o.Partition != m.Partition:
		return source.Origin{}, "the original is on partition " + itoa(int64(o.Partition)) + ", the copy on " + itoa(int64(m.Partition))
	case o.Offset >= m.Offset:
		return source.Origin{}, "the original's offset " + itoa(o.Offset) + " is not before the copy's: a redriven copy lies after its original"
	case m.ID != "" && m.ID != m.Coordinates():
		return source.Origin{}, "the source's message IDs are not positions (topic/partition/offset), so the original's cannot be checked"
	case m.ID != "" && o.ID != o.Coordinates():
		return source.Origin{}, wire.MetaMessageID + " " + strconv.Quote(o.ID) + " is not the position " + o.Coordinates() + " the lineage names"
	case m.ID == "" && o.ID != "":
		return source.Origin{}, wire.MetaMessageID + " is set, but the source gives no message IDs"
	}
	return o, ""
}

// retryLineage reads the lineage of a copy on a retry topic of topic
// orig. The original lies on another topic, so its position cannot be
// checked against the copy's: the retry topic is trusted to hold what the
// consumer wrote there (see source.Description.RetryOf).
func retryLineage(m *Message, orig string, producerIDs bool) (source.Origin, string) {
	var o source.Origin
	o.Retry = true
	if v, ok := m.Header(wire.MetaRedriveCount); ok {
		o.Redrives, _ = strconv.Atoi(string(v))
	}
	n, _ := m.Header(wire.MetaRetryAttempt)
	topic, _ := m.Header(wire.MetaTopic)
	part, _ := m.Header(wire.MetaPartition)
	off, _ := m.Header(wire.MetaOffset)
	id, _ := m.Header(wire.MetaMessageID)
	lane, _ := m.Header(wire.MetaLane)
	o.Topic, o.ID, o.Lane = string(topic), string(id), string(lane)
	attempt, aerr := strconv.Atoi(string(n))
	p, perr := strconv.ParseInt(string(part), 10, 32)
	o.Partition = int32(p)
	var err error
	o.Offset, err = strconv.ParseInt(string(off), 10, 64)
	switch {
	case aerr != nil || attempt < 1:
		return source.Origin{}, wire.MetaRetryAttempt + " " + strconv.Quote(string(n)) + " is not a positive count"
	case o.Topic == "" || perr != nil || err != nil || o.Offset < 0:
		return source.Origin{}, "incomplete lineage: " + wire.MetaTopic + ", " + wire.MetaPartition + " or " + wire.MetaOffset + " missing or malformed"
	case o.Topic != orig:
		return source.Origin{}, "a retry copy on " + m.Topic + " names an original on " + o.Topic + ", not " + orig
	case producerIDs && o.ID == "":
		return source.Origin{}, "no " + wire.MetaMessageID
	case !producerIDs && o.ID != "" && o.ID != o.Coordinates():
		return source.Origin{}, wire.MetaMessageID + " " + strconv.Quote(o.ID) + " is not the position " + o.Coordinates() + " the lineage names"
	}
	return o, ""
}
