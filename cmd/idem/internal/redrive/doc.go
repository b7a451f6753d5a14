// Package redrive sends dead letters back to their topic: `idem redrive`,
// on Kafka or RocketMQ.
//
//	plan, res, err := redrive.Run(ctx, redrive.RocketMQ{NameServers: ns}, redrive.Config{
//		Admin: store.Admin(), Topic: "payments_DLQ",
//	})
//
// A redrive is a plan, shown and then executed as shown. One planner
// (Prepare) lists each letter from where the last redrive of the group
// stopped, by its position, with a verdict (Plan, Entry): send it back;
// pass it by as a duplicate, when its key has a done row (it was applied:
// a copy would be skipped as a duplicate or refused as a mismatch); or
// refuse it — when it names no original topic or partition, carries no
// key (dead-lettered before its key was known), was redriven
// Config.MaxRedrives times already, lost its value (too large), or its key
// has a failed row that is not released (Config.Release releases it on
// the way) — and then its queue stops there (VerdictStop), unless
// Config.Skip passes it by (VerdictSkip). A dry run prints the plan; Run
// executes the plan it made; Execute executes a plan made before (a dry
// run's, changed by the operator with Plan.SkipLetter and Plan.Hold), the
// letters it lists and no other, after making it again and refusing it
// with a *StaleError if what it says of those letters changed. A plan's
// JSON is stable and Plan.Digest names it, for a record of what was done.
//
// A letter that is sent goes back with its lineage:
// the message's own headers, the letter's idem-original-* coordinates,
// message ID and key, idem-redrive-count (one more than the letter's) and
// idem-redriven-from (the letter's position); the letter's reason,
// attempts and lane are left behind. A consumer deduplicates the copy by
// the identity its original was first delivered with (see source.Origin).
//
// What is guaranteed, on both:
//
//   - Bounded: a run reads each queue from the group's committed offset to
//     its end as it was when the run started, at most Config.Max letters;
//     letters written meanwhile wait for the next run.
//   - Resumable: the group's offset is committed past a letter only after
//     its copy was sent (or it was passed by), and a queue stops at a
//     refused letter, so the next run starts with it. A run cut off
//     between a send and its commit sends the letter again: the consumer
//     takes the second copy for a duplicate of the first, and once the
//     first was applied the planner passes the letter by as a duplicate.
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
// (source.Description.ProducerChosenIDs), keyed by the original's message ID; the
// copy keeps the letter's KEYS and TAGS. RocketMQ's own dead-letter queue
// %DLQ%<group> (rocketmq.DeadLetterBroker) is refused with
// ErrBrokerDeadLetterQueue: its messages carry no idem key or lineage.
// RocketMQ with ACL is not supported (the offset requests are unsigned).
package redrive
