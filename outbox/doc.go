// Package outbox carries a handler's effects outside the database — an
// event for another service — with the same guarantee as its effects inside:
// once per key, never lost.
//
// A handler writes its outgoing messages with Enqueue into a table, in the
// transaction the consumer gave it; they commit with its other effects and
// its dedup row, or roll back with them. A Relay publishes the committed
// rows to Kafka (outbox/kafkapub) or RocketMQ (outbox/rocketmqpub) and then
// deletes them. Between publishing and deleting it can die, so it publishes
// at least once; every message therefore carries an identity derived from
// the work that produced it:
//
//	MessageID(parent, position)  parent = the handler's dedup key (scope, ID)
//
// in the header HeaderID, and a downstream idem consumer keyed by it
// (consumer.ByHeader(outbox.HeaderID)) skips the copies. That is the pattern
// for effectively-once across hops, without distributed transactions: each
// hop commits its dedup row, its effects and its outgoing messages in one
// local transaction, and identity flows forward.
//
// # What it guarantees
//
//   - A committed Enqueue is published, eventually: rows wait while the
//     broker is down, while Postgres is down, and across relay crashes.
//   - A rolled-back one never is: no row outlives its transaction.
//   - Messages with the same topic and key are published in the order they
//     were enqueued (by the outbox's seq, which for transactions that
//     write the same rows is their commit order). A republished run can
//     repeat earlier messages after later ones; the first copy of each is
//     in order, and those are the ones a downstream consumer applies.
//   - A message the broker refuses for good (too large, a topic name it
//     cannot have) is moved, with the reason, to the dead-letter table
//     (Outbox.DeadTable), never dropped. Put it back with
//     INSERT INTO idem_outbox (...) SELECT ... FROM idem_outbox_dead.
//
// It does not guarantee that a message is published once: downstream
// deduplication by HeaderID is part of the pattern. Nor does it deduplicate
// what a handler sends by other means.
//
// # Relays, leases and wakeup
//
// The outbox is divided into 16 shards by a hash of topic and key. A relay's
// round opens a transaction, locks the shards it reads with
// pg_try_advisory_xact_lock (skipping those another relay holds), reads
// their oldest unsent rows (at most BatchSize), publishes them, deletes or
// marks them, and commits: the lock is the lease, released by COMMIT,
// ROLLBACK or a dead connection — a relay killed with SIGKILL holds nothing.
// Several relays share the shards without publishing any row twice (except
// after a crash); a round stops locking once its batch is full, so the
// others get the rest. The transaction holds no snapshot while it waits for
// the broker (READ COMMITTED, no writes before the mark), so it does not
// hold back vacuum. Keep idle_in_transaction_session_timeout above
// RelayConfig.PublishTimeout.
//
// An idle relay polls (RelayConfig.PollInterval, 50ms): one query that
// probes the pending-rows index of each shard, a few microseconds of
// server time. LISTEN/NOTIFY would wake it sooner but costs the producing
// side: a transaction that notifies takes a database-wide lock at commit
// and holds it until its commit record is flushed (PreCommit_Notify in
// Postgres's async.c), so notifying consumer transactions would commit one
// at a time, defeating the group commit idem's throughput rests on. A busy
// relay does not poll: it reads the next batch as soon as it committed the
// last.
//
// A shard whose messages fail to publish backs off (exponential with
// jitter, cenkalti/backoff) while the other shards go on.
//
// Outbox.Pending counts the rows waiting and the oldest one's age;
// Relay.Stats counts what a relay published, republished and failed, and
// Relay.Health says whether it runs and when a round last went through.
// outbox/oteloutbox exports them as OpenTelemetry metrics, and
// observe.Server.WatchRelay serves them on /metrics and /healthz.
package outbox
