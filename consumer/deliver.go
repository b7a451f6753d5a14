package consumer

import (
	"context"
	"time"
)

func (c *Consumer[TTx]) deliver(ctx, workCtx context.Context, m *Message) error {
	if err := ctx.Err(); err != nil {
		return err // select below could still pick the send
	}
	c.lanesMu.Lock()
	if c.closed {
		c.lanesMu.Unlock()
		return ErrStopped
	}
	id := c.laneOf(m)
	l, ok := c.lanes[id]
	if !ok {
		l = newLane(c, id.String())
		c.lanes[id] = l
		c.lanesWG.Add(1)
		go l.run(workCtx, c)
	}
	// Sending under lanesMu would block other lanes; the channel is closed only
	// after Source.Run returned, when no deliver is in flight any more.
	c.lanesMu.Unlock()
	m.DeliveredAt = time.Now()
	c.stats.delivered.Add(1)
	select {
	case l.in <- m:
		return nil
	case <-l.halted:
		c.stats.delivered.Add(-1)
		return ErrLaneStopped
	case <-ctx.Done():
		c.stats.delivered.Add(-1)
		return ctx.Err()
	}
}

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
// 1, the key lane its record key hashes to, so that the messages of one key
// stay in one lane, in order. Messages without a key share key lane of the
// empty key.
//
// The hash is FNV-1a, mixed (murmur3's finalizer) before the modulo:
// producers that pick a record's partition by FNV-1a of its key — Sarama's
// default partitioner, kafka-go's Hash balancer, RocketMQ's Go hash
// selector — leave on each partition only the keys of a few FNV-1a
// residues, and FNV-1a modulo KeyLanes would put them in a few of the
// lanes (2 of 8 on a topic of 4 partitions). After the mix, every bit of
// the hash moves the lane.
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
	h ^= h >> 16
	h *= 0x85ebca6b
	h ^= h >> 13
	h *= 0xc2b2ae35
	h ^= h >> 16
	return laneID{lane: m.Lane, key: int(h % uint32(n))}
}
