// Package rmqprops knows the message property names RocketMQ reserves for
// itself. Every other property is a user's: adapters/rocketmq delivers it
// as a consumer.Header, and outbox/rocketmqpub writes a header as one.
package rmqprops

// System reports whether RocketMQ (broker, Java and Go clients, 5.3)
// reserves the property name: KEYS, TAGS, UNIQ_KEY, the timer and
// transaction properties, and the like. The names are matched as they are;
// prefixes (the client's "__RMQ.TRANSIENT." ones) are the caller's rule.
func System(name string) bool { return system[name] }

var system = map[string]bool{
	"KEYS": true, "TAGS": true, "WAIT": true, "DELAY": true, "RETRY_TOPIC": true,
	"REAL_TOPIC": true, "REAL_QID": true, "TRAN_MSG": true, "PGROUP": true,
	"MIN_OFFSET": true, "MAX_OFFSET": true, "BUYER_ID": true, "ORIGIN_MESSAGE_ID": true,
	"TRANSFER_FLAG": true, "CORRECTION_FLAG": true, "MQ2_FLAG": true, "RECONSUME_TIME": true,
	"MSG_REGION": true, "TRACE_ON": true, "UNIQ_KEY": true, "EXTEND_UNIQ_INFO": true,
	"MAX_RECONSUME_TIMES": true, "CONSUME_START_TIME": true, "INNER_NUM": true,
	"INNER_BASE": true, "CHECK_IMMUNITY_TIME_IN_SECONDS": true,
	"TRAN_PREPARED_QUEUE_OFFSET": true, "__transactionId__": true,
	"TRANSACTION_CHECK_TIMES": true, "INSTANCE_ID": true, "CORRELATION_ID": true,
	"REPLY_TO_CLIENT": true, "TTL": true, "ARRIVE_TIME": true, "PUSH_REPLY_TIME": true,
	"CLUSTER": true, "MSG_TYPE": true, "POP_CK": true, "POP_CK_OFFSET": true,
	"1ST_POP_TIME": true, "__SHARDINGKEY": true, "SHARDING_KEY": true,
	"PROPERTY_FORWARD_QUEUE_ID": true, "REDIRECT": true, "INNER_MULTI_DISPATCH": true,
	"INNER_MULTI_QUEUE_OFFSET": true, "TRACE_CONTEXT": true, "TIMER_DELAY_SEC": true,
	"TIMER_DELIVER_MS": true, "__BORNHOST": true, "BORN_TIMESTAMP": true,
	"TIMER_ENQUEUE_MS": true, "TIMER_DEQUEUE_MS": true, "TIMER_ROLL_TIMES": true,
	"TIMER_OUT_MS": true, "TIMER_DEL_UNIQKEY": true, "TIMER_DELAY_LEVEL": true,
	"TIMER_DELAY_MS": true, "__CRC32#": true, "DLQ_ORIGIN_TOPIC": true,
	"DLQ_ORIGIN_MESSAGE_ID": true, "bname": true,
}
