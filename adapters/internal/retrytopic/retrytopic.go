// Package retrytopic holds the rule of retry topics (consumer.NonBlocking)
// that the Kafka and RocketMQ adapters share: where a message's original
// lies, so that its retry copy and its dead letter go where the
// original's would, never to a retry topic's own.
package retrytopic

import "github.com/idemkit/idem/consumer"

// Original returns the topic and partition of m's original: its lineage's
// (consumer.Message.Origin) when the consumer honoured it; else, when m
// lies on a retry topic of retryOf (retry topic -> the topic it serves),
// a copy keyed as a message of its own since its lineage did not hold, the
// topic that retry topic serves and m's own partition; else m's own topic
// and partition.
func Original(m *consumer.Message, retryOf map[string]string) (topic string, partition int32) {
	if o, ok := m.Origin(); ok {
		return o.Topic, o.Partition
	}
	if orig, ok := retryOf[m.Topic]; ok {
		return orig, m.Partition
	}
	return m.Topic, m.Partition
}

// DeadLetterTopic names the topic of m's dead letter: topic (the Source's
// Config.DeadLetterTopic) when set, else the topic m's original lies in
// (Original) plus suffix. A retry copy's letter so goes with its
// original's letters, never to a dead-letter topic of a retry topic.
func DeadLetterTopic(m *consumer.Message, retryOf map[string]string, topic, suffix string) string {
	if topic != "" {
		return topic
	}
	orig, _ := Original(m, retryOf)
	return orig + suffix
}
