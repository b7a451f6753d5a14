package rocketmq

import (
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/internal/rmqprops"
)

// IsSystemProperty reports whether RocketMQ (broker, Java and Go clients,
// 5.3) reserves the property name — KEYS, TAGS, UNIQ_KEY, … — or its client
// marks it transient (__RMQ.TRANSIENT.*). Every other property is a user
// property: a consumer.Header of the delivered message, and what a dead
// letter's metadata (consumer.Meta*) is written as.
func IsSystemProperty(name string) bool {
	return rmqprops.System(name) || strings.HasPrefix(name, "__RMQ.TRANSIENT.")
}

// laneOf names the ordered lane of a message queue: topic/broker/queue. A
// message redelivered through the group's retry topic arrives on a queue of
// %RETRY%<group>, a lane of its own.
func laneOf(mq *primitive.MessageQueue) string {
	if mq == nil {
		return ""
	}
	return mq.Topic + "/" + mq.BrokerName + "/" + strconv.Itoa(mq.QueueId)
}

// messageID is the ID of a message that stays the same when the message
// comes back through %RETRY%<group>:
//
//   - its UNIQ_KEY, which producers set (the 5.x broker adds one to a
//     single message sent without it) and every copy keeps;
//   - else its ORIGIN_MESSAGE_ID: a copy stored by the broker's send-back
//     (CONSUMER_SEND_MSG_BACK) of a message without UNIQ_KEY has none, and
//     ORIGIN_MESSAGE_ID is the ID of the message first sent back, which
//     for a message without UNIQ_KEY is its OffsetMsgId;
//   - else its OffsetMsgId: a first delivery without UNIQ_KEY (the inner
//     messages of a batch sent by rocketmq-client-go, which sets none on
//     them). The OffsetMsgId names the stored copy (broker address and
//     commit-log offset): it is what the copies' ORIGIN_MESSAGE_ID holds.
//
// "" when the message has none of them (the client always computes an
// OffsetMsgId, so only a message it did not decode): consumer.ByMessageID
// then refuses it and the consumer dead-letters it, rather than keying it by
// something the next copy would not share.
func messageID(props map[string]string, mx *primitive.MessageExt) string {
	if id := props[primitive.PropertyUniqueClientMessageIdKeyIndex]; id != "" {
		return id
	}
	if id := props[primitive.PropertyOriginMessageId]; id != "" {
		return id
	}
	return mx.OffsetMsgId
}

// pinID gives a message delivered without UNIQ_KEY its ID as UNIQ_KEY, in
// the copy the client holds. When the broker refuses the send-back of a
// message given back, the client sends that copy, properties and all, to
// %RETRY%<group> as an ordinary message instead, and the 5.x broker gives an
// ordinary message without UNIQ_KEY a new one, which would win over
// ORIGIN_MESSAGE_ID in messageID. The broker's own send-back copies the
// stored message and does not see this property. The property map is
// guarded by the message's lock, and MsgId is left alone.
func pinID(props map[string]string, mx *primitive.MessageExt, id string) {
	if id != "" && props[primitive.PropertyUniqueClientMessageIdKeyIndex] == "" {
		mx.WithProperty(primitive.PropertyUniqueClientMessageIdKeyIndex, id)
	}
}

// toMessage converts what the client delivered into the consumer's envelope
// (and pins the ID on the client's copy, see pinID). Topic is the original
// topic also for a redelivery through the retry topic (the client restores
// it); Partition and Offset are those of the queue the message was pulled
// from.
func toMessage(mx *primitive.MessageExt, lane string) *consumer.Message {
	props := mx.GetProperties()
	id := messageID(props, mx)
	pinID(props, mx, id)
	var headers []consumer.Header
	for k, v := range props {
		if !IsSystemProperty(k) {
			headers = append(headers, consumer.Header{Key: k, Value: []byte(v)})
		}
	}
	sort.Slice(headers, func(i, j int) bool { return headers[i].Key < headers[j].Key })
	m := &consumer.Message{
		Topic:   mx.Topic,
		Offset:  mx.QueueOffset,
		ID:      id,
		Value:   mx.Body,
		Headers: headers,
		Attempt: int(mx.ReconsumeTimes) + 1,
		Lane:    lane,
		Raw:     mx,
	}
	if mx.Queue != nil {
		m.Partition = int32(mx.Queue.QueueId)
	}
	if keys := props[primitive.PropertyKeys]; keys != "" {
		m.Key = []byte(keys)
	}
	if mx.BornTimestamp > 0 {
		m.Time = time.UnixMilli(mx.BornTimestamp)
	}
	return m
}
