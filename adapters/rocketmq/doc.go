// Package rocketmq is idem's RocketMQ adapter: a source.Source over the
// push consumer of apache/rocketmq-client-go/v2 that is also the
// consumer.DeadLetter for its messages and, with Config.RetryDelays, the
// consumer.RetrySink of consumer.NonBlocking retries.
//
//	rocketmq.SetClientLogger(logger, slog.LevelWarn) // once: the client library's logs
//	src, err := rocketmq.New(rocketmq.Config{
//		NameServers: []string{"127.0.0.1:9876"},
//		Group:       "payments-ledger",
//		Topics:      []string{"payments"},
//	})
//	c, err := consumer.New(consumer.Config[pgx.Tx]{
//		Name: "payments-ledger", Source: src, DeadLetter: src, Store: store, Handler: h,
//		Key: consumer.ByJSONField("txn_id"), DrainTimeout: 30 * time.Second,
//	})
//	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
//	defer stop()
//	err = c.Run(ctx) // SIGTERM: drains, acknowledges what is in flight, returns
//
// # How it consumes
//
// The push consumer pulls from the queues the broker assigns to this member
// and calls back with up to Config.BatchMaxSize messages of one queue; it
// wants the result synchronously. The callback delivers the messages, in
// order, to the consumer's lane for that queue, named "topic/broker/queueId"
// (a redelivery through the group's retry topic arrives on a queue of
// %RETRY%<group>, a lane of its own), and then blocks until the consumer has
// acked or released every one of them. Lanes batch what several calls
// delivered into one transaction. Concurrent mode (the default) runs up to
// Config.ConsumeGoroutines calls per topic at once, their deliveries to one
// lane serialised; orderly mode (Config.Orderly) runs one call per queue at
// a time, with the queue locked on the broker, and keeps the queue's order.
//
// A message's ID (consumer.ByMessageID) is one that its copies from the
// retry topic share: the UNIQ_KEY property, else ORIGIN_MESSAGE_ID, else
// the OffsetMsgId. Producers set UNIQ_KEY (the 5.x broker adds one to a
// single message sent without it) and copies keep it. A message can still
// come without one: rocketmq-client-go's batch send sets none on the
// messages of the batch. The client's MsgId is then the OffsetMsgId, which
// names the stored copy (broker address and commit-log offset) and so
// changes when the message is sent back and stored in %RETRY%<group>; the
// broker's send-back sets ORIGIN_MESSAGE_ID on the copy to the original's
// OffsetMsgId, so a first delivery and its copies agree. Such a message
// gets its ID as UNIQ_KEY in the copy the client holds, because the client,
// when the broker refuses its send-back, sends that copy as an ordinary
// message, and the broker would give it a new UNIQ_KEY. A message without
// any of the three has no ID; ByMessageID refuses it and it is
// dead-lettered. A dead letter sent back to the topic (redriven, as `idem
// redrive --broker rocketmq` does with the letters of idem's dead-letter
// topic; the broker's %DLQ%<group> carries no idem metadata) is a new
// message with a UNIQ_KEY of its own; when it carries its letter's
// idem-original-* properties and idem-redrive-count, which stay user
// properties, the consumer keys it by the original's ID instead, in
// whichever queue it lies (the Source declares source.Description.ProducerChosenIDs:
// a producer may set UNIQ_KEY to anything, so lineage gives it no power it
// lacked). Its Key is the KEYS property (consumer.ByRecordKey), its
// Headers the user properties, Attempt the reconsume times plus one, and
// Raw the *primitive.MessageExt. Topic is the original topic also for
// redeliveries; Partition and Offset are those of the queue the message was
// pulled from.
//
// # What is guaranteed
//
//   - A call returns ConsumeSuccess only when all of its messages were
//     acked, that is after their transaction (or dead letter) committed. In
//     this client ConsumeSuccess is the zero value of ConsumeResult and an
//     error returned next to a result is ignored: every other outcome (a
//     message released or not delivered, a panic in the callback, the source
//     stopping) sets "retry later" explicitly — ConsumeRetryLater in
//     concurrent mode (the client sends the messages to %RETRY%<group> with
//     Config.RetryDelayLevel), SuspendCurrentQueueAMoment in orderly mode
//     (the client hands them over again after Config.SuspendTime, which
//     idem sets: the client's default is no pause at all).
//   - A panic in a handler is recovered by the consumer and counts as a
//     failed attempt; the queue is never pinned by it. (Left to the client, a
//     panicking callback pins its queue's offset until ConsumeTimeout.)
//   - When Run's context ends, Run stops delivering, waits until the
//     consumer settled what it delivered, and shuts the push consumer down.
//     Calls left unfinished are dropped with their process queues instead of
//     being sent to the retry topic: the next owner of the queue starts at
//     the committed offset, and the dedup store skips what was applied.
//     The client records a queue's offset after a consume call returned,
//     and not once its shutdown dropped the queue: Run waits (up to 3 s,
//     within Config.CloseTimeout) until the client handled every returned
//     call before it shuts the client down, so that what was acked, also
//     while Run drained, is not delivered to the queue's next owner. The
//     shutdown persists the offsets with one-way requests: a broker that
//     does not get one hands those messages over again, and the dedup
//     store skips them.
//   - The name servers are always given explicitly (a passthrough
//     resolver); each Source has its own instance name, so several Sources
//     of one group can run in one process.
//   - Dead letters (Source.DeadLetter): in DeadLetterTopic mode the letter
//     is stored by the broker (SEND_OK) before the consumer acks the
//     original; in DeadLetterBroker mode the original's queue offset does not
//     pass it until the client's send-back to %DLQ%<group> succeeded. A
//     letter in idem's topic is consumer.Letter.Record's, as in every idem
//     adapter: the original body (left out past Config.DeadLetterMaxBytes),
//     KEYS, TAGS and user properties, and the consumer.Meta* metadata as
//     properties.
//   - The client library's logs: New leaves its process-wide logger alone
//     (logrus at INFO on stdout, which logs whole messages, bodies
//     included, when a consume call fails). SetClientLogger, called once at
//     start-up, sends them to slog at the level it is given, with messages
//     reduced to their IDs: no bodies in logs.
//
// # Dead letters and the engine's acks
//
// The consumer calls DeadLetter and then Ack for a message it gives up on.
// In DeadLetterTopic mode DeadLetter produces the letter and the Ack is an
// ordinary one. In DeadLetterBroker mode DeadLetter only marks the message
// in its call's bookkeeping; the Ack then completes the call, and the call,
// seeing the mark, returns "retry later" with delay level -1 (concurrent) or
// "suspend" with the message's reconsume count past Config.MaxReconsumeTimes
// (orderly): the client's own send-back then asks the broker to store the
// original in %DLQ%<group>, and moves the offset on. A call's result covers
// all of its messages and this client has no ackIndex, so the mode requires
// Config.BatchMaxSize 1 (the lanes still batch the transactions of
// concurrent calls).
//
// # Non-blocking retries
//
// With Config.RetryDelays and consumer.NonBlocking{Sink: src}, a message
// whose attempts in its lane ran out is produced by Source.Retry to the
// retry topic of its topic (RetryTopic: "payments_RETRY") as a RocketMQ 5
// timer message, delayed by the trip's delay (TIMER_DELAY_MS), and acked
// once the broker stored the copy (SEND_OK). The broker's timer wheel puts
// the copy in the retry topic when it is due; the source, which subscribes
// the retry topics beside their topics, holds a copy the timer delivered
// early (it rounds down to timerPrecisionMs, 1 s) until its
// wire.MetaRetryDue. The copy carries the original body, KEYS, TAGS
// and user properties, the lineage and the idem-retry-* properties, so the
// consumer keys it as its original (Source.RetryOf) and reads its trip;
// past the last delay it is dead-lettered as the original would have been.
// The copy does not go back to the topic, which other groups read, nor to
// %RETRY%<group>, whose reconsume count also counts releases. Orderly mode
// works with it, and is the mode that keeps order for
// consumer.NonBlocking.KeyOrdered: consumer.New refuses KeyOrdered over a
// source in concurrent mode (source.Description.LaneOrdered). See
// docs/retries.md.
//
// # What is not
//
//   - Exactly-once delivery: RocketMQ redelivers after crashes (offsets are
//     committed with pulls and persisted every 5 s), rebalances and
//     ConsumeTimeout; effects are once only because the dedup store says so.
//   - Committed offsets that only grow: RocketMQ does not fence offset
//     commits. The client keeps a queue's offset in memory, sends it with
//     its pulls and persists it every 5 s and when a rebalance takes the
//     queue away; the queue's next owner starts from the offset the broker
//     has, which can be older than what the previous owner had settled, and
//     its commits can take the broker's offset below what the previous
//     owner committed on its way out (the broker takes any offset). The
//     messages in between are redelivered and skipped as duplicates. What
//     holds is that no committed offset is ahead of the settled messages:
//     the client moves a queue's offset past a message only once its call
//     returned, that is after the message was acked, or to give it back
//     through the retry topic.
//   - Order in concurrent mode: calls of one queue run at once and deliver
//     in the order they get their lane, not necessarily queue order.
//   - consumer.StopLaneOnExhausted holds an orderly queue until Run ends; in
//     concurrent mode it gives the messages back, so they come back through
//     the retry topic (a new lane) until MaxReconsumeTimes sends them to
//     %DLQ%<group>.
//   - TLS: the client's TLS mode skips certificate verification; idem does
//     not offer it.
//   - Known client defects this adapter cannot fix: in orderly mode the
//     client reads its process queue without a lock (a data race the race
//     detector reports, rocketmq-client-go issue #1213); after Shutdown some
//     of its goroutines linger until their sleeps end (up to ConsumeTimeout,
//     and a month for its statistics printers). In concurrent mode the
//     client's Shutdown closes a queue's message channel while a pull that
//     has just returned messages may send to it (issue #1051, its fix
//     unmerged): a data race, and, rarely, a panic "send on closed channel"
//     in the client's pull goroutine, which ends the process while it stops.
//     No order of calls avoids it: suspending the pulls first leaves the
//     pull in flight, which the broker holds up to 20 s. Offsets the client
//     had not persisted yet are then not committed: their messages are
//     redelivered and skipped as duplicates.
package rocketmq
