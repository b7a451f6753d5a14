package consumer

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"
)

// laneID names a lane: the source's lane (Message.Lane, a partition or
// queue) and, with Config.KeyLanes, which of its key lanes.
type laneID struct {
	lane string
	key  int // 0..KeyLanes-1; -1 without key lanes
}

// String is the lane's name in logs, observers and Health: the source's
// lane, with "#k" for key lane k when Config.KeyLanes is above 1.
func (id laneID) String() string {
	if id.key < 0 {
		return id.lane
	}
	return id.lane + "#" + itoa(int64(id.key))
}

// laneOf returns the lane m goes to: its source lane or, with KeyLanes above
// 1, the key lane its record key hashes to (FNV-1a), so that the messages of
// one key stay in one lane, in order. Messages without a key share key lane
// of the empty key.
func (c *Consumer[TTx]) laneOf(m *Message) laneID {
	n := c.cfg.KeyLanes
	if n <= 1 {
		return laneID{lane: m.Lane, key: -1}
	}
	h := uint32(2166136261)
	for _, b := range m.Key {
		h ^= uint32(b)
		h *= 16777619
	}
	return laneID{lane: m.Lane, key: int(h % uint32(n))}
}

// A lane processes one partition's or queue's messages in order (with
// Config.KeyLanes, the messages of some of its keys). Its data
// flows through four stages, each a type of its own:
//
//	batcher     fills a batch from the lane's channel (batcher.go)
//	keying      derives each message's key and fingerprint (item.go)
//	settler     commits the batch in as few transactions as it can, one
//	            attempt (attempt.go) at a time, and decides what a failure
//	            means: retry, split, isolate, give up (settle.go)
//	settlement  dead-letters, acknowledges what committed and releases the
//	            rest (settlement.go)
//
// Nothing is acknowledged before the transaction (or dead letter) that
// settled it committed.
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
	for i := range items {
		it := &items[i]
		cause, kerr := c.keyItem(it)
		if kerr == nil {
			run = append(run, it)
			continue
		}
		if len(run) > 0 {
			if err := l.settleRun(ctx, c, run); err != nil {
				return err
			}
			run = run[:0]
		}
		if err := c.deadLetter(ctx, it, kerr, cause); err != nil {
			return err
		}
		if err := l.advancePast(ctx, c, it.msg); err != nil {
			return err
		}
	}
	if len(run) > 0 {
		return l.settleRun(ctx, c, run)
	}
	return nil
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
