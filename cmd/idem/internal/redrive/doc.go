// Package redrive sends dead letters back to their topic: `idem redrive`,
// on Kafka or RocketMQ.
//
//	res, err := redrive.Run(ctx, redrive.RocketMQ{NameServers: ns}, redrive.Config{
//		Admin: store.Admin(), Topic: "payments_DLQ",
//	})
//
// The decision about a letter is the same on both brokers (Run): a letter
// is refused when it names no original topic or partition, carries no key
// (dead-lettered before its key was known), was redriven
// Config.MaxRedrives times already, or lost its value (too large); and when
// its key has a done row (it was applied: the copy would be a duplicate or
// a mismatch) or a failed row that is not released (Config.Release
// releases it on the way). Any other letter is sent back with its lineage:
// the message's own headers, the letter's idem-original-* coordinates,
// message ID and key, idem-redrive-count (one more than the letter's) and
// idem-redriven-from (the letter's position); the letter's reason,
// attempts and lane are left behind. A consumer deduplicates the copy by
// the identity its original was first delivered with (see consumer.Origin).
//
// What is guaranteed, on both:
//
//   - Bounded: a run reads each queue from the group's committed offset to
//     its end as it was when the run started, at most Config.Max letters;
//     letters written meanwhile wait for the next run.
//   - Resumable: the group's offset is committed past a letter only after
//     its copy was sent (or it was skipped), and a queue stops at a refused
//     letter, so the next run starts with it. A run cut off between a send
//     and its commit sends the letter again: the consumer takes the second
//     copy for a duplicate of the first, and once the first was applied
//     Run refuses the letter by the done row.
//   - A wrong address is named: an address that answers like the other
//     broker (a RocketMQ name server given as Kafka's, a Kafka broker given
//     as a name server) is a *WrongBrokerError.
//
// Where they differ: Kafka sends a copy to its original partition (modulo
// the topic's partitions) and commits the group's offsets outside any group
// generation. RocketMQ commits the group's consumer offset of each queue on
// its broker and awaits the answer (internal/rmqremoting; no consumer of
// the group runs), reads with pulls from the committed offset, and sends a
// copy to its original queue when the topic still has it on that broker,
// else to any queue: the RocketMQ Source honours lineage in any queue
// (consumer.ProducerChosenIDs), keyed by the original's message ID; the
// copy keeps the letter's KEYS and TAGS. RocketMQ's own dead-letter queue
// %DLQ%<group> (rocketmq.DeadLetterBroker) is refused with
// ErrBrokerDeadLetterQueue: its messages carry no idem key or lineage.
// RocketMQ with ACL is not supported (the offset requests are unsigned).
package redrive
