package consumer

import "time"

// batcher fills a lane's batches: up to size messages, taking what has
// arrived by the time the lane is free, and waiting up to wait for more when
// wait is set. Its buffer is reused from batch to batch.
type batcher struct {
	size  int
	wait  time.Duration
	timer *time.Timer
	buf   []*Message
}

func newBatcher(size int, wait time.Duration) batcher {
	return batcher{size: size, wait: wait, buf: make([]*Message, 0, size)}
}

// next blocks for the first message of a batch and returns the batch, valid
// until the next call; false when in is closed and drained.
func (b *batcher) next(in <-chan *Message) ([]*Message, bool) {
	m, ok := <-in
	if !ok {
		return nil, false
	}
	clear(b.buf)
	batch := append(b.buf[:0], m)
	if b.wait > 0 && b.size > 1 {
		b.arm()
	}
	for len(batch) < b.size {
		select {
		case m, ok := <-in:
			if !ok {
				return b.done(batch), true
			}
			batch = append(batch, m)
			continue
		default:
		}
		if b.timer == nil {
			break
		}
		select {
		case m, ok := <-in:
			if !ok {
				return b.done(batch), true
			}
			batch = append(batch, m)
		case <-b.timer.C:
			b.timer = nil // fired: armed again by the next batch
			return b.done(batch), true
		}
	}
	return b.done(batch), true
}

func (b *batcher) arm() {
	b.timer = time.NewTimer(b.wait)
}

// done disarms the timer and keeps the buffer for the next batch.
func (b *batcher) done(batch []*Message) []*Message {
	b.stop()
	b.buf = batch
	return batch
}

func (b *batcher) stop() {
	if b.timer != nil {
		b.timer.Stop()
		b.timer = nil
	}
}
