// Package consumer turns at-least-once delivery into effectively-once effects.
//
// A [source.Source] (the Kafka or RocketMQ adapter, or consumertest's fake) delivers
// [Message]s; package consumer/source is that contract, and package
// consumer/wire the format of the dead letters and retry copies the
// adapters write. The [Consumer] runs one ordered lane per partition or queue; a
// lane takes up to Config.BatchSize messages into one transaction of the
// [dedup.Store]: one set-based claim of their keys, the [Handler] for the keys
// that are new, one COMMIT. Only after the COMMIT does the Source acknowledge
// the messages (Kafka offset commit, RocketMQ ConsumeSuccess).
//
// The guarantee: a handler's effects inside the store's transaction happen once
// per key, whatever the broker redelivers, and no message is acknowledged
// before its effects or its dead-letter record are durable. Duplicates are
// skipped and counted.
//
// The limits: effects outside the transaction (HTTP calls, e-mails) can repeat;
// a key catches only the duplicates it can see (a Kafka offset catches
// redeliveries, a business key also catches producer retries and upstream
// re-sends); dedup rows live as long as the store's retention.
//
// Offsets in the store (Config.Offsets, a [dedup.OffsetStore]): for sources
// that deliver each partition in offset order (Kafka), a lane's transaction
// moves its partition's next offset forward by compare-and-set instead of
// claiming a key per message, and what lies below the next offset is a
// redelivery. Config.Key, when set beside it, claims business keys for the
// rest. A stored offset past a message's LogEnd (the topic was created
// again) stops the consumer with [dedup.ErrOffsetsAhead].
//
// Lineage: a dead letter sent back by `idem redrive` carries the identity
// it was first delivered with (the idem-original-* headers and
// idem-redrive-count, see [source.Origin]). [ByMessageID] keys such a copy by the
// original's message ID, and with Config.Offsets alone the copy is claimed
// in the key table under the original's identity, so a letter redriven
// twice, or written twice, is applied once, and `idem redrive` finds the
// done row it looks for. Lineage that could make a message not seen yet a
// duplicate (a later offset, another partition: headers are the producer's
// to write) is not honoured; see [source.Origin] and [source.Description].
//
// Failures: errors wrapped with [Permanent] (and decode errors, constraint
// violations, fingerprint mismatches, bad keys) are dead-lettered at once,
// their key recorded as failed; errors wrapped with [Reject] are
// dead-lettered at once with their key left free, for the next message
// with it to be judged on its own; everything else is retried with exponential backoff and jitter, bounded by
// Config.Retry, and then handled by Config.OnExhausted. A failing message in a
// batch is isolated without savepoints: the batch is split and the messages
// before it commit on their own. Those retries hold the message's lane
// ([Blocking], the default); with [NonBlocking] in Config.Retries the
// message gets a few attempts in its lane and then goes to a retry
// destination ([RetrySink]: Kafka retry topics, RocketMQ timer messages on a retry topic), keyed as its original when
// it comes back, and the lane goes on — at the cost of its order.
//
// Dead letters count incidents: every letter carries its [Cause] (the
// idem-cause header: bad_input, validate, rejected, fingerprint_mismatch,
// permanent, exhausted, failed_before, in_doubt, stale, parked_too_long) and its dedup key whenever one was derived. A
// message whose key failed for good before is dead-lettered as
// failed_before, a repeat of the incident its first letter (permanent)
// reported and `idem failed` lists, never as a new one.
//
// Operating: [Consumer.Stats] counts what the lanes did; an [Observer]
// (Config.Observer, consumer/otelconsumer for OpenTelemetry) sees the same
// events one by one, and the dead letters being written when it is a
// [DeadLetterObserver]; [Consumer.Health] is what a readiness or liveness
// probe looks at. Logs, dedup rows and letters name a message alike
// ([Message.Ref]).
package consumer
