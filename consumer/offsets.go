package consumer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/idem/dedup"
)

// Offsets in the store (Config.Offsets): instead of one key row per message,
// each batch's transaction moves its partition's next offset forward, and a
// message below it is a redelivery. The lane keeps the next offset it last
// committed (a cursor), so that a batch costs one statement: a
// compare-and-set from the cursor to the offset after the batch. The cursor
// can only be behind the store (offsets only grow); when it is — another
// consumer of the partition, or a zombie that lost it, committed first, or
// the partition came back to this lane after a rebalance — the
// compare-and-set is refused, the transaction rolls back, and the retry
// reads the stored offset afresh.

// errOffsetMoved: the compare-and-set of a partition's next offset was
// refused. A conflict, retried whole.
var errOffsetMoved = errors.New("consumer: the partition's next offset moved under the batch: another consumer of the partition committed first")

// errOffsetsAheadSuspect: the stored next offset lies past the log end a
// batch's messages were fetched with, within offsetsAheadGrace of the lane
// first seeing it. A conflict, retried whole: a member that lost the
// partition without knowing yet (its successor moved the offset on) learns
// it at its next heartbeat, and the source then disowns the messages
// (source.Description.Assigned), which are skipped.
var errOffsetsAheadSuspect = errors.New("consumer: the partition's stored next offset is past the log end its messages were fetched with; " +
	"waiting to learn whether this consumer still holds the partition")

// offsetsAheadGrace is how long a lane waits, retrying, before a stored
// offset past its messages' log end stops the consumer with
// dedup.ErrOffsetsAhead: longer than a Kafka member needs to notice that
// its session ended (a heartbeat interval, 3 s by default, past the session
// timeout).
const offsetsAheadGrace = time.Minute

// offsetCursor is a lane's view of its partition's next offset.
type offsetCursor struct {
	p     dedup.Partition
	next  int64
	known bool
}

// partitionOf returns the offsets row of m.
func (c *Consumer[TTx]) partitionOf(m *Message) dedup.Partition {
	return dedup.Partition{Scope: c.cfg.Name, Topic: m.Topic, Partition: m.Partition}
}

// cursorFor returns the cursor's next offset for p, reading it in tx when
// the cursor does not know it.
func (c *Consumer[TTx]) cursorFor(ctx context.Context, tx TTx, cur *offsetCursor, p dedup.Partition) (int64, error) {
	if cur.known && cur.p == p {
		return cur.next, nil
	}
	next, err := c.cfg.Offsets.NextOffset(ctx, tx, p)
	if err != nil {
		return 0, err
	}
	*cur = offsetCursor{p: p, next: next, known: true}
	return next, nil
}

// claimOffsets is the claim phase of an attempt with Config.Offsets: the
// items below the partition's next offset (or below an earlier item of the
// batch) are duplicates; with Config.Key set, the rest are claimed under
// their business keys too, and without it a redriven copy is claimed under
// its original's identity (item.lineage), which its new offset cannot
// tell is an old message. The next offset is then moved past the batch —
// but not past an item the business-key claim refused (mismatch, failed
// before), which is dead-lettered after the commit and moved past then.
// It returns the new next offset, or -1 when it did not move.
func (a *attempt[TTx]) claimOffsets(ctx context.Context, tx TTx, its []*item, results []dedup.Result) (int64, error) {
	c := a.c
	p := c.partitionOf(its[0].msg)
	for _, it := range its[1:] {
		if it.msg.Topic != p.Topic || it.msg.Partition != p.Partition {
			return -1, fmt.Errorf("%w: lane %s holds %s and %s: with Config.Offsets a lane must hold one partition",
				dedup.ErrContract, its[0].msg.Lane, its[0].msg.Coordinates(), it.msg.Coordinates())
		}
	}
	expected, err := c.cursorFor(ctx, tx, a.cursor, p)
	if err != nil {
		return -1, err
	}
	ahead := false
	for _, it := range its {
		// A fetched message proves the log reaches past it, whatever the
		// end it came with says: a source may attach a high watermark read
		// before the record was (seen on Kafka under a live producer), and a
		// stored offset at or below the message is never ahead of the log.
		end := max(it.msg.LogEnd, it.msg.Offset+1)
		if it.msg.LogEnd <= 0 || expected <= end || !c.assigned(it.msg) {
			continue
		}
		ahead = true
		now := c.cfg.Clock.Now()
		if a.aheadSince.IsZero() {
			a.aheadSince = now
		}
		if now.Sub(a.aheadSince) < offsetsAheadGrace {
			return -1, fmt.Errorf("%w (%s/%d: stored %d, log end %d at message %s)",
				errOffsetsAheadSuspect, p.Topic, p.Partition, expected, end, it.msg.Coordinates())
		}
		a.aheadSince = time.Time{}
		return -1, fmt.Errorf("%w: %s/%d: the store's next offset is %d, the log ended at %d when message %s was fetched, "+
			"and the consumer still held the partition %v later. Either the topic was deleted and created again "+
			"(stop the consumers of %q, reset the topic's offsets — pgstore: Store.ResetOffsets — and start them again), "+
			"or the log was truncated (an unclean leader election: the offsets from %d on now name new records; "+
			"set the partition's stored offset to where they begin), or this member read from a leader whose "+
			"high watermark lagged (restart it: nothing was applied or acknowledged)",
			dedup.ErrOffsetsAhead, p.Topic, p.Partition, expected, end, it.msg.Coordinates(), offsetsAheadGrace, p.Scope, end)
	}
	if !ahead {
		a.aheadSince = time.Time{}
	}
	running := expected
	claims, at := a.claims[:0], a.claimAt[:0]
	for i, it := range its {
		if it.msg.Offset < running {
			it.status = dedup.StatusDuplicate
			continue
		}
		running = it.msg.Offset + 1
		it.status = dedup.StatusNew
		if c.cfg.Key != nil || it.lineage {
			claims, at = append(claims, it.claim), append(at, i)
		}
	}
	a.claims, a.claimAt = claims, at
	next := running
	if len(claims) > 0 {
		res := results[:len(claims)]
		if err := c.cfg.Store.Claim(ctx, tx, claims, res); err != nil {
			return -1, err
		}
		for j, i := range at {
			if !res[j].Status.Valid() {
				return -1, fmt.Errorf("%w: Claim left the result of key %q unset (status %d)", dedup.ErrContract, claims[j].Key, res[j].Status)
			}
			it := its[i]
			it.status, it.reason, it.firstAt = res[j].Status, res[j].Reason, res[j].FirstAt
			if (it.status == dedup.StatusMismatch || it.status == dedup.StatusFailed) && it.msg.Offset < next {
				next = it.msg.Offset
			}
		}
	}
	if next <= expected {
		if len(claims) > 0 {
			// The first new message was refused by its key: nothing moves,
			// but the refusal (dead-lettered after the commit) and the
			// messages after it (applied) were decided from the cursor,
			// which a zombie's successor may have moved past. Fenced as a
			// move is, or the zombie dead-letters the refused message
			// again and applies messages whose key rows were purged.
			return -1, a.holdOffset(ctx, tx, p, expected)
		}
		return -1, nil
	}
	ok, err := c.cfg.Offsets.AdvanceOffset(ctx, tx, p, expected, next)
	if err != nil {
		return -1, err
	}
	if !ok {
		return -1, fmt.Errorf("%w (%s/%d, expected %d)", errOffsetMoved, p.Topic, p.Partition, expected)
	}
	return next, nil
}

// holdOffset checks in tx that p's next offset is still expected, for a
// transaction that moves nothing: a compare-and-set to the same offset,
// which locks the row until tx ends as a move does; or, with no row yet,
// a fresh read (a concurrent first writer of the partition claims the same
// business keys, and waits on them).
func (a *attempt[TTx]) holdOffset(ctx context.Context, tx TTx, p dedup.Partition, expected int64) error {
	c := a.c
	ok := false
	if expected > 0 {
		var err error
		if ok, err = c.cfg.Offsets.AdvanceOffset(ctx, tx, p, expected, expected); err != nil {
			return err
		}
	} else {
		next, err := c.cfg.Offsets.NextOffset(ctx, tx, p)
		if err != nil {
			return err
		}
		ok = next == expected
	}
	if !ok {
		return fmt.Errorf("%w (%s/%d, expected %d)", errOffsetMoved, p.Topic, p.Partition, expected)
	}
	return nil
}

// assigned reports whether m belongs to an assignment the source still
// holds; true when the source cannot tell.
func (c *Consumer[TTx]) assigned(m *Message) bool {
	return c.desc.Assigned == nil || c.desc.Assigned(m)
}
