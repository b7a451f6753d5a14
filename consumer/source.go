package consumer

// SourceInfo is what a Source says of itself (source.Description), for telemetry and health:
// the messaging system and the broker's consumer group. Consumer.SourceInfo
// returns it; consumer/otelconsumer takes messaging.system and
// messaging.consumer.group.name from it.
type SourceInfo struct {
	System string // messaging.system: "kafka", "rocketmq"; empty when unknown
	Group  string // the broker's consumer group; empty when it has none
}

// assigned reports whether m belongs to an assignment the source still
// holds; true when the source cannot tell.
func (c *Consumer[TTx]) assigned(m *Message) bool {
	return c.desc.Assigned == nil || c.desc.Assigned(m)
}
