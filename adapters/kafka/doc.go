// Package kafka is idem's Kafka adapter: a consumer.Source over a
// segmentio/kafka-go consumer group, and a consumer.DeadLetter that writes to
// a Kafka topic.
//
//	src, err := kafka.New(kafka.Config{
//		Brokers: []string{"127.0.0.1:9092"},
//		Topics:  []string{"payments"},
//		GroupID: "payments-ledger",
//	})
//	dlq, err := kafka.NewDeadLetterWriter(kafka.DeadLetterConfig{Brokers: []string{"127.0.0.1:9092"}})
//	defer dlq.Close()
//	c, err := consumer.New(consumer.Config[pgx.Tx]{
//		Name: "payments-ledger", Source: src, DeadLetter: dlq, Store: store, Handler: h,
//		Key: consumer.ByJSONField("txn_id"),
//	})
//	err = c.Run(ctx)
//
// # How it consumes
//
// The Source uses kafka-go's lower-level ConsumerGroup API rather than its
// group Reader: each generation says which partitions this member owns and
// from which committed offset. Each owned partition gets a fetcher, which
// delivers its messages in offset order to the consumer's lane named
// "topic/partition"; lanes run in parallel. A message's ID is
// "topic/partition/offset" (consumer.ByMessageID); its record key, headers
// and timestamp are on the consumer.Message, and Raw is the *kafka.Message of
// kafka-go. A committer per generation commits offsets in the background.
//
// # What is guaranteed
//
//   - An offset is committed only after the consumer acked the message, that
//     is after its database transaction (or its dead letter) committed, and
//     for each partition only up to the contiguous prefix of acked messages
//     (committed offset = last acked + 1). A message released or still in
//     flight holds its partition's commit at its offset. kafka-go's
//     ReadMessage, which commits before the handler runs, is never used.
//   - Commits are fenced per generation: they run inside the generation that
//     delivered the messages (kafka-go joins the next generation only after
//     the previous one's goroutines returned), on its coordinator connection
//     and with its generation ID, which the coordinator refuses once the group
//     moved on. After a rebalance took a partition away, acks that arrive for
//     it are dropped and the new owner is redelivered the messages, which the
//     dedup store skips. A member never moves a committed offset backwards.
//   - A new group starts at the first retained offset (Config.StartOffset).
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
//   - DeadLetterWriter returns only after all in-sync replicas acknowledged
//     the letter; the consumer acks the original message only then.
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
//   - Records of transactional producers are read uncommitted.
//   - A committed offset outside the partition's log (retention deleted the
//     messages first, or the log was truncated) is reset as Kafka's
//     auto.offset.reset would, to the log start (or end, with LastOffset),
//     and logged at error level; messages lost that way were lost by the
//     broker.
//   - kafka-go's metadata requests ask the broker to create missing topics;
//     brokers with auto.create.topics.enable create them.
package kafka
