// Package otelconsumer makes OpenTelemetry metrics and traces of a
// consumer's events. A *Telemetry is a consumer.Observer: the engine tells it
// what happened (a batch, a transaction with its claim and commit, a message
// applied, skipped as a duplicate or dead-lettered, a retry, an
// acknowledgement) and it records views of that — the same events
// consumer.Stats counts.
//
//	tel, err := otelconsumer.New(otelconsumer.Config{})
//	c, err := consumer.New(consumer.Config[pgx.Tx]{
//		...
//		Source:     src,
//		Observer:   tel,
//		DeadLetter: src, // written under a dead-letter span, with its trace context
//	})
//	reg, err := tel.Observe(c, time.Minute) // every counter from zero, the health gauges
//
// The messaging system and the consumer group come from the Source
// (consumer.SourceInfo: the Kafka and RocketMQ sources say theirs); Config
// overrides them. The consumer writes its dead letters through the
// Telemetry (a consumer.DeadLetterObserver): no wrapper is needed. Package
// observe serves it all as /metrics, with /healthz beside it.
//
// Metrics, with messaging.system, messaging.destination.name,
// messaging.destination.partition.id, messaging.consumer.group.name and
// idem.consumer.name on every point. The partition ID is unique within the
// topic, as the messaging conventions ask: a Kafka partition's number, a
// RocketMQ queue's broker and ID ("broker-a/0"; see PartitionID).
//
//	messaging.client.consumed.messages   counter    messages the lanes took from the source
//	messaging.process.duration           histogram  s, one batch; error.type released or ack_failed
//	idem.consumer.applied                counter    = Stats.Applied
//	idem.consumer.duplicates             counter    = Stats.Duplicates
//	idem.consumer.stale                  counter    = Stats.Stale
//	idem.consumer.duplicate.age          histogram  s, the buckets of Stats.DuplicateAge
//	idem.consumer.dead_letters           counter    = Stats.DeadLettered, by idem.dead_letter.cause (consumer.Cause; failed_before is a repeat)
//	idem.consumer.released               counter    = Stats.Released
//	idem.consumer.retries                counter    = Stats.Retries, by error.type (the failure's class)
//	idem.consumer.retry.sent             counter    copies written to retry (NonBlocking), by idem.retry.delay
//	idem.consumer.retry.returned         counter    retry copies come back and settled, by the idem.retry.delay of their trip
//	idem.consumer.conflicts              counter    transactions that collided with another
//	idem.consumer.transactions           counter    by idem.transaction.outcome (error.type on rollback); commits = Stats.Commits
//	idem.consumer.transaction.size       histogram  messages claimed in one transaction
//	idem.consumer.claim.duration         histogram  s, the store's claim statement
//	idem.consumer.commit.duration        histogram  s, COMMIT
//	idem.consumer.fetch_to_ack.duration  histogram  s, from the source's delivery to the acknowledgement
//
// Traces, following the messaging conventions: one CONSUMER span per batch,
// "process <topic>", with a link to each message's producer context (W3C
// traceparent in its headers), messaging.batch.message_count (or, for one
// message, its ID and offset), and an event per dead letter and retry. Under
// it one span per transaction, with the claim and the COMMIT as CLIENT
// child spans; the handler runs under the transaction's span, so a database
// tracer's spans (otelpgx) nest there. Each dead letter is written under a
// PRODUCER span whose traceparent replaces the producer's in the letter.
// A batch span links rather than parents, as the conventions say for batch
// processing, and does so even for a batch of one.
//
// Observe adds the gauges read from consumer.Health (in flight, progress
// age, lanes stopped and stalled, a lane's waiting messages) and puts every
// counter at zero, so that a scrape right after start lists them all.
//
// With no SDK installed (otel's global no-op providers) every method returns
// at once: BenchmarkTelemetry measures the cost either way. Use one
// Telemetry per consumer.
package otelconsumer
