package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/idemkit/idem/dedup"
)

// A lane processes one partition's or queue's messages in order (with
// Config.KeyLanes, the messages of some of its keys), one batch at a time;
// deliver (deliver.go) hands each message to its lane. Its data flows
// through these stages, a file each:
//
//	batcher      fills a batch from the lane's channel (batcher.go)
//	keying       derives each message's key and fingerprint, after its
//	             lineage (keying.go, lineage.go); bad input is
//	             dead-lettered in its place (settleInOrder, below)
//	attempt      one transaction: claims the keys — with Config.Offsets,
//	             moves the partition's next offset (offsets.go) — runs the
//	             handlers of the new ones, commits (attempt.go)
//	settler      commits the batch in as few attempts as it can, decides
//	             what a failure means — retry, split, isolate, give up —
//	             and settles each item of a committed attempt: applied,
//	             a duplicate (duplicates.go) or refused (settler.go)
//	dead letter  writes what cannot be processed to the sink (deadletter.go)
//	finish       acknowledges what settled and releases the rest (below)
//
// batcher, attempt and settler are types, a lane's own, whose buffers are
// reused from batch to batch; keying, the dead letter and finish are
// methods. Nothing is acknowledged before the transaction (or dead letter)
// that settled it committed.
type lane[TTx any] struct {
	name     string
	in       chan *Message
	halted   chan struct{} // closed when the lane stopped (StopLaneOnExhausted, a broken deployment)
	haltOnce sync.Once

	batcher batcher
	settler settler[TTx]
	items   []item
	runs    []*item // the keyed items between two bad ones
	acks    []*Message
	release []*Message
	cursor  offsetCursor // the partition's next offset, with Config.Offsets
}

func newLane[TTx any](c *Consumer[TTx], name string) *lane[TTx] {
	l := &lane[TTx]{
		name:    name,
		in:      make(chan *Message, c.cfg.LaneBuffer),
		halted:  make(chan struct{}),
		batcher: newBatcher(c.cfg.BatchSize, c.cfg.BatchWait),
	}
	l.settler = settler[TTx]{c: c, l: l, attempt: attempt[TTx]{c: c}}
	if c.cfg.Offsets != nil {
		l.settler.attempt.cursor = &l.cursor
	}
	return l
}

func (l *lane[TTx]) laneName() string { return l.name }

// halt stops the lane: what it holds and what reaches it later is released
// unacknowledged, for the next owner of the partition or queue.
func (l *lane[TTx]) halt() { l.haltOnce.Do(func() { close(l.halted) }) }

func (l *lane[TTx]) stopped() bool {
	select {
	case <-l.halted:
		return true
	default:
		return false
	}
}

// halt stops a lane whose message used up its retries (StopLaneOnExhausted).
func (c *Consumer[TTx]) halt(l *lane[TTx], it *item, err error) {
	l.halt()
	attrs := append([]any{slog.String("lane", l.name)}, refAttrs(it.msg, it.claim.Key)...)
	c.cfg.Logger.Error("idem: lane stopped: a message used up its retries", append(attrs, slog.Any("error", err))...)
}

// run processes batches until the lane's channel is closed.
func (l *lane[TTx]) run(ctx context.Context, c *Consumer[TTx]) {
	defer c.lanesWG.Done()
	defer l.batcher.stop()
	for {
		batch, ok := l.batcher.next(l.in)
		if !ok {
			return
		}
		l.process(ctx, c, batch)
	}
}

// item is one message's state within a batch.
type item struct {
	msg      *Message
	claim    dedup.Claim
	status   dedup.Status
	reason   string    // recorded failure reason, for StatusFailed
	firstAt  time.Time // when the key was first claimed, for all but StatusNew
	attempts int       // failures charged to the message (see Letter.Attempts)
	settled  bool      // committed, skipped or dead-lettered: may be acknowledged
	// unlisted: KeyOrdered's CheckParked tried it in no key's list (not a
	// head), and it was not parked since: settling it needs no Unpark
	unlisted bool
	// lineage: with Config.Offsets and no Key, a redriven copy, claimed
	// in the key table under its original's identity (see lineage.go)
	lineage bool
	// entity: the entity it is an event of (Config.Entity), zero for none;
	// stale: the attempt's AdvanceEntities found it at or below the
	// entity's watermark, which it met
	entity    Entity
	stale     bool
	watermark dedup.Version
}

// process settles one batch in order — bad input is dead-lettered in its
// place, the keyed messages between are committed — then acknowledges the
// settled messages and releases the others. A stopped lane releases them all.
func (l *lane[TTx]) process(ctx context.Context, c *Consumer[TTx], batch []*Message) {
	ctx = c.cfg.Observer.BatchStart(ctx, Batch{Consumer: c.cfg.Name, Source: c.source, Lane: l.name, Messages: batch})
	items := l.items[:0]
	for _, m := range batch {
		items = append(items, item{msg: m})
	}
	l.items = items
	var err error
	switch {
	case l.stopped():
		err = ErrLaneStopped
	case ctx.Err() != nil:
		err = ctx.Err()
	default:
		err = l.settleInOrder(ctx, c, items)
		if err != nil && !errors.Is(err, ErrLaneStopped) && ctx.Err() == nil {
			c.cfg.Logger.Error("idem: batch not settled", slog.String("lane", l.name), slog.Any("error", err))
		}
	}
	l.finish(ctx, c, batch, items, err)
	clear(items) // drop message references until the next batch
}

// settleInOrder keys the items and settles them in order. Bad input is
// dead-lettered in its place: what came before it is settled first, so a
// lane stopped ahead of it never passes it.
func (l *lane[TTx]) settleInOrder(ctx context.Context, c *Consumer[TTx], items []item) error {
	run := l.runs[:0]
	defer func() { clear(run); l.runs = run[:0] }()
	flush := func() error {
		if len(run) == 0 {
			return nil
		}
		err := l.settleRun(ctx, c, run)
		run = run[:0]
		return err
	}
	for i := range items {
		it := &items[i]
		cause, kerr := c.keyItem(ctx, l, it, flush)
		if kerr == nil {
			run = append(run, it)
			continue
		}
		if cause == 0 {
			return kerr // not settled: ctx ended while Validate was waited for
		}
		if err := flush(); err != nil {
			return err
		}
		if err := c.deadLetter(ctx, it, kerr, cause); err != nil {
			return err
		}
		if err := l.advancePast(ctx, c, it.msg); err != nil {
			return err
		}
	}
	return flush()
}

// settleRun settles a run of keyed items. With Config.Offsets, the next
// offset then moves past the run, if the run's last items were
// dead-lettered after their transactions rather than committed in them.
func (l *lane[TTx]) settleRun(ctx context.Context, c *Consumer[TTx], run []*item) error {
	if err := l.settler.settle(ctx, run); err != nil {
		return err
	}
	if c.cfg.Offsets == nil {
		return nil
	}
	last := run[0].msg // the highest offset: redeliveries may follow it
	for _, it := range run[1:] {
		if it.msg.Offset > last.Offset {
			last = it.msg
		}
	}
	return l.advancePast(ctx, c, last)
}

// advancePast moves the lane's partition's next offset past m, in a
// transaction of its own, after m was settled outside a batch's transaction
// (dead-lettered): a redelivery of m is then a duplicate. It retries until
// it succeeds or ctx ends, and stops the consumer on an error retrying
// cannot mend (permanent, fatal); an offset already past m is left as it
// is.
func (l *lane[TTx]) advancePast(ctx context.Context, c *Consumer[TTx], m *Message) error {
	if c.cfg.Offsets == nil || m.Offset < 0 {
		return nil
	}
	p, next := c.partitionOf(m), m.Offset+1
	cur := &l.cursor
	if cur.known && cur.p == p && cur.next >= next {
		return nil
	}
	err := c.untilDone(ctx, l, "advance the next offset past "+m.Coordinates(), func() error {
		err := c.cfg.Store.InTx(ctx, func(ctx context.Context, tx TTx) error {
			expected, err := c.cursorFor(ctx, tx, cur, p)
			if err != nil || expected >= next {
				return err
			}
			ok, err := c.cfg.Offsets.AdvanceOffset(ctx, tx, p, expected, next)
			if err == nil && !ok {
				err = fmt.Errorf("%w (%s/%d, expected %d)", errOffsetMoved, p.Topic, p.Partition, expected)
			}
			return err
		})
		if err != nil {
			cur.known = false
		}
		return err
	}, func(err error) (error, bool) {
		if class := classify(err, c.cfg.Store.ClassifyError); class == dedup.ClassFatal || class == dedup.ClassPermanent {
			// Retrying cannot help, and going on without the move cannot
			// either: a redelivery of m, which is settled, would run again.
			return c.fatal(l, fmt.Errorf("consumer: advance the next offset past %s, which was dead-lettered: %w", m.Coordinates(), err)), true
		}
		return nil, false
	})
	if err != nil {
		return err
	}
	if cur.next < next {
		cur.next = next
	}
	return nil
}

// finish acknowledges the settled items and releases the others; err says
// why they were not settled.
func (l *lane[TTx]) finish(ctx context.Context, c *Consumer[TTx], batch []*Message, items []item, err error) {
	acks, rel := l.acks[:0], l.release[:0]
	for i := range items {
		if items[i].settled {
			acks = append(acks, items[i].msg)
		} else {
			rel = append(rel, items[i].msg)
		}
	}
	var aerr error
	if len(acks) > 0 {
		if aerr = c.cfg.Source.Ack(ctx, acks); aerr != nil && ctx.Err() == nil {
			// Committed but not acknowledged: the broker redelivers and the
			// claim skips the messages as duplicates.
			c.cfg.Logger.Warn("idem: ack failed", slog.String("lane", l.name), slog.Any("error", aerr))
		}
		c.progress.Store(time.Now().UnixNano())
	}
	if len(rel) > 0 {
		if err == nil {
			err = ErrStopped
		}
		c.releaseAll(rel, err)
	}
	c.cfg.Observer.BatchEnd(ctx, Batch{Consumer: c.cfg.Name, Source: c.source, Lane: l.name, Messages: batch, Acked: acks, Released: rel, AckErr: aerr})
	clear(acks)
	clear(rel)
	l.acks, l.release = acks[:0], rel[:0]
}

func (c *Consumer[TTx]) releaseAll(msgs []*Message, reason error) {
	if len(msgs) == 0 {
		return
	}
	c.stats.released.Add(int64(len(msgs)))
	c.cfg.Source.Release(msgs, reason)
}
