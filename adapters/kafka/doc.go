// Package kafka is idem's Kafka adapter: a source.Source over a
// segmentio/kafka-go consumer group that is also the consumer.DeadLetter
// for its messages, writing to a dead-letter topic.
//
//	src, err := kafka.New(kafka.Config{
//		Brokers: []string{"127.0.0.1:9092"},
//		Topics:  []string{"payments"},
//		Group:   "payments-ledger",
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
// The Source uses kafka-go's lower-level ConsumerGroup API rather than its
// group Reader: each generation says which partitions this member owns and
// from which committed offset. Each owned partition gets a fetcher, which
// delivers its messages in offset order to the consumer's lane named
// "topic/partition"; lanes run in parallel. A message's ID is
// "topic/partition/offset" (consumer.ByMessageID; a copy sent back by
// `idem redrive` is keyed by the original's position, which its lineage
// headers name, see source.Origin); its record key, headers
// and timestamp are on the consumer.Message, and Raw is the *kafka.Message of
// kafka-go. A committer per generation commits offsets in the background.
//
// Fetchers speak kafka-go's protocol package on a connection of their own
// rather than using kafka-go's Conn, whose batches hand transaction markers
// out as messages and drop what reading committed needs (the batches'
// producer IDs and attributes, the aborted transactions of a fetch
// response; kafka-go #1332, #1446).
//
// With offsets in the store (consumer.Config.Offsets) the group's offsets
// are advisory: messages carry the fetch's high watermark (Message.LogEnd),
// the Source tells the consumer whether a message's assignment still holds
// (source.Description.Assigned), and Config.StartOffsets (kafka.StoreOffsets)
// starts each partition at the store's next offset and brings the group's
// offset up to it.
//
// Config.RetryDelays adds retry topics (consumer.NonBlocking): the source
// consumes <topic>.retry.<delay> beside each topic, writes the retry copies
// there (Source.Retry) and delivers a copy only once it is due, its
// partition's fetcher waiting on a timer. See docs/retries.md.
//
// # What is guaranteed
//
//   - An offset is committed only after the consumer acked the message, that
//     is after its database transaction (or its dead letter) committed, and
//     for each partition only up to the contiguous prefix of acked messages
//     (committed offset = last acked + 1). A message released or still in
//     flight holds its partition's commit at its offset. Offsets that hold
//     nothing to deliver (transaction markers, records of aborted
//     transactions, compacted records) count as acked, so a partition that
//     ends with a marker is committed to its end. kafka-go's ReadMessage,
//     which commits before the handler runs, is never used.
//   - Topics written by transactional producers (Kafka Streams, Flink,
//     Debezium, any exactly-once producer) are read committed, as Kafka's
//     isolation.level=read_committed: a record written in a transaction is
//     delivered once the transaction committed and never when it aborted,
//     nothing past a partition's last stable offset (the first record of
//     its oldest open transaction) is delivered before that transaction
//     ends, and transaction markers are never delivered. Records written
//     outside transactions are delivered as usual. Config.ReadUncommitted
//     delivers the records of open and aborted transactions too.
//   - Commits are fenced per generation: they run inside the generation that
//     delivered the messages (kafka-go joins the next generation only after
//     the previous one's goroutines returned), on its coordinator connection
//     and with its generation ID, which the coordinator refuses once the group
//     moved on. After a rebalance took a partition away, acks that arrive for
//     it are dropped and the new owner is redelivered the messages, which the
//     dedup store skips. A member never moves a committed offset backwards,
//     except to follow a log that started over (below).
//   - A new group starts at the first retained offset (Config.StartFrom).
//   - Every broker request has a deadline. A fetch connection that fails or
//     stalls is closed and the partition's current leader dialled again; a
//     generation that loses its coordinator ends and the group is joined
//     again. Run recovers from broker restarts and leader changes by itself.
//   - Partitions added to a topic, or a topic created after the group
//     started, are picked up by a rebalance (Config.PartitionWatchInterval).
//   - When its context ends Run stops fetching, waits until the consumer has
//     settled every message it delivered (graceful Stop: processed and acked;
//     hard stop: released), commits, leaves the group and returns. The last
//     two steps are bounded by Config.CloseTimeout, so Run returns even when
//     the brokers are gone or hang.
//   - Dead letters (Source.DeadLetter) return only after all in-sync
//     replicas acknowledged the letter; the consumer acks the original
//     message only then. A letter is consumer.Letter.Record's, as in every
//     idem adapter: the original key, value (left out past
//     Config.DeadLetterMaxBytes) and headers, then the consumer.Meta*
//     headers; it goes to the partition numbered like the original's in
//     Config.DeadLetterTopic (default <topic>.dlq).
//
// # What is not
//
//   - Delivery exactly once. Kafka redelivers after crashes and rebalances,
//     and commits are asynchronous (a commit in flight gathers the acks that
//     arrive meanwhile), so a crash redelivers what was acked since the last
//     commit. Effects happen once because the dedup store says so.
//   - A lane the consumer stopped (consumer.StopLaneOnExhausted) stops its
//     partition until the consumer is restarted or a rebalance moves the
//     partition to another member; either resumes at the first unsettled
//     message.
//   - A committed offset outside the partition's log (retention deleted the
//     messages first, or the log was truncated) is reset as Kafka's
//     auto.offset.reset would, to the log start (or end, with LastOffset),
//     and logged at error level; messages lost that way were lost by the
//     broker.
//   - A topic deleted and created again (or a log truncated below what was
//     consumed) starts its offsets over. (If the partition watch saw the
//     topic gone, the group rebalances, and Kafka deleted the group's
//     offsets with the topic: the new assignment starts at StartFrom.)
//     Otherwise the fetcher finds its offset past the new log's end and
//     resets to its start, below offsets it delivered: the partition starts
//     a new epoch. Messages of the old log still in the
//     lane are settled, but their acks commit nothing; the reset offset is
//     committed at once (lower than before) and the new log's offsets from
//     there, so Stop does not wait on them and a restart resumes in the new
//     log. Were the new log already past the old offset when the fetcher
//     looked, nothing would tell: it goes on from there and the new log's
//     messages below are skipped (Kafka's own consumers do the same).
//   - Keys made of coordinates recur with a recreated topic: its messages
//     get the same topic/partition/offset IDs as the old topic's, and
//     consumer.ByMessageID, when it is the Key chosen, skips them as
//     duplicates for as long as the store retains the old keys. A topic that may be recreated
//     wants a business key (consumer.ByJSONField, ByHeader, ByRecordKey), or
//     a key scope per incarnation of the topic: a new consumer Name, or a
//     consumer Config.Tenant that names the incarnation.
//   - kafka-go's metadata requests ask the broker to create missing topics;
//     brokers with auto.create.topics.enable create them.
package kafka
