package dedup

import (
	"context"
	"errors"
)

// Partition names one offset sequence of a consumer: its scope (the
// consumer's Name), a topic and a partition.
type Partition struct {
	Scope     string
	Topic     string
	Partition int32
}

// ErrOffsetsAhead: the stored next offset of a partition lies past the end
// of the partition's log, as the broker reports it. The log the offsets were
// taken from is gone — the topic was deleted and created again, or its log
// truncated — and its offsets now name other messages. Nothing is skipped or
// acknowledged: the consumer stops until an operator resets the partition's
// row (see the store's ResetOffsets).
var ErrOffsetsAhead = errors.New("dedup: the stored next offset is past the end of the partition's log")

// OffsetStore is a Store that also keeps, per partition, the next offset a
// consumer has not settled: every offset below it committed (or was
// dead-lettered) before, so a message below it is a redelivery. One row per
// partition, moved forward once per batch in the batch's own transaction,
// instead of one key row per message. The consumer uses it when
// consumer.Config.Offsets is set.
//
// The next offset of a partition without a row is 0. Offsets only grow: a
// store never moves one backwards, and AdvanceOffset is a compare-and-set,
// so a writer that read an old value (a consumer that lost the partition in
// a rebalance and does not know it yet) is refused rather than obeyed.
//
// Implementations are safe for concurrent use.
type OffsetStore[TTx any] interface {
	// NextOffset returns p's next offset as tx sees it now (0 without a
	// row).
	NextOffset(ctx context.Context, tx TTx, p Partition) (int64, error)

	// AdvanceOffset sets p's next offset to next in tx if it is expected (0:
	// there is no row), and reports whether it did. next must be above
	// expected, or equal to it when expected is above 0: a hold, which
	// moves nothing but is refused, waits and locks the row as a move
	// does (for a transaction that must be fenced without moving). A concurrent transaction that advanced p first, committed
	// or not, makes it report false (after waiting for that transaction to
	// end, at most the store's lock timeout, or failing with an error
	// wrapping ErrInFlight). Under SERIALIZABLE isolation (a distributed
	// database) it may fail instead with a serialization error its
	// ClassifyError reports as ClassConflict, which the consumer retries.
	// When it reports true, p's row stays locked until tx ends: no other
	// writer moves it meanwhile.
	AdvanceOffset(ctx context.Context, tx TTx, p Partition, expected, next int64) (bool, error)

	// NextOffsets returns the next offsets of scope's partitions of topic,
	// outside any transaction: where a source may start fetching after an
	// assignment. Partitions without a row are absent.
	NextOffsets(ctx context.Context, scope, topic string) (map[int32]int64, error)
}
