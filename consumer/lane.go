package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"time"

	"github.com/idemkit/idem/dedup"
)

// lane processes one partition's or queue's messages in order, a batch at a
// time. Its buffers are reused from batch to batch.
type lane[TTx any] struct {
	name     string
	in       chan *Message
	halted   chan struct{} // closed when the lane stopped (StopLaneOnExhausted)
	haltOnce sync.Once

	batch   []*Message
	items   []item
	goods   []*item
	claims  []dedup.Claim
	results []dedup.Result
	fresh   []*Message // a BatchHandler's messages
	freshAt []int      // their positions in the batch
	acks    []*Message
	release []*Message
}

// item is one message's state within a batch.
type item struct {
	msg      *Message
	claim    dedup.Claim
	status   dedup.Status
	reason   string // recorded failure reason, for StatusFailed
	attempts int    // failed handler runs
	settled  bool   // committed, skipped or dead-lettered: may be acknowledged
}

func newLane[TTx any](name string, buffer, batchSize int) *lane[TTx] {
	return &lane[TTx]{
		name:   name,
		in:     make(chan *Message, buffer),
		halted: make(chan struct{}),
		batch:  make([]*Message, 0, batchSize),
	}
}

func (c *Consumer[TTx]) runLane(ctx context.Context, l *lane[TTx]) {
	defer c.lanesWG.Done()
	var wait *time.Timer
	for m := range l.in {
		batch := append(l.batch[:0], m)
		if c.cfg.BatchWait > 0 && len(batch) < c.cfg.BatchSize {
			if wait == nil {
				wait = time.NewTimer(c.cfg.BatchWait)
			} else {
				wait.Reset(c.cfg.BatchWait)
			}
		}
	fill:
		for len(batch) < c.cfg.BatchSize {
			select {
			case m, ok := <-l.in:
				if !ok {
					break fill
				}
				batch = append(batch, m)
				continue
			default:
			}
			if wait == nil {
				break
			}
			select {
			case m, ok := <-l.in:
				if !ok {
					break fill
				}
				batch = append(batch, m)
			case <-wait.C:
				break fill
			}
		}
		if wait != nil && !wait.Stop() {
			select {
			case <-wait.C:
			default:
			}
		}
		l.batch = batch
		select {
		case <-l.halted:
			c.releaseAll(batch, ErrLaneStopped)
			continue
		default:
		}
		if err := ctx.Err(); err != nil {
			c.releaseAll(batch, err)
			continue
		}
		c.process(ctx, l, batch)
	}
}

func (c *Consumer[TTx]) releaseAll(msgs []*Message, reason error) {
	if len(msgs) == 0 {
		return
	}
	c.stats.released.Add(int64(len(msgs)))
	c.cfg.Source.Release(msgs, reason)
}

// process settles one batch in order: bad input is dead-lettered, the
// messages between are claimed and handled in one transaction (split on
// failure), then the settled messages are acknowledged and the others
// released.
func (c *Consumer[TTx]) process(ctx context.Context, l *lane[TTx], batch []*Message) {
	items := l.items[:0]
	for _, m := range batch {
		items = append(items, item{msg: m})
	}
	l.items = items
	goods := l.goods[:0]
	var err error
	from := 0 // goods[from:] are not settled yet
	for i := range items {
		it := &items[i]
		kerr := c.key(it)
		if kerr == nil {
			goods = append(goods, it)
			continue
		}
		// Bad input is dead-lettered in its place: what came before it is
		// settled first, so a lane stopped ahead of it never passes it.
		if from < len(goods) {
			if err = c.settle(ctx, l, goods[from:]); err != nil {
				break
			}
			from = len(goods)
		}
		if err = c.deadLetter(ctx, it, kerr); err != nil {
			break
		}
	}
	l.goods = goods
	if err == nil && from < len(goods) {
		err = c.settle(ctx, l, goods[from:])
	}
	if err != nil && !errors.Is(err, ErrLaneStopped) && ctx.Err() == nil {
		c.cfg.Logger.Error("idem: batch not settled", slog.String("lane", l.name), slog.Any("error", err))
	}

	acks, rel := l.acks[:0], l.release[:0]
	for i := range items {
		if items[i].settled {
			acks = append(acks, items[i].msg)
		} else {
			rel = append(rel, items[i].msg)
		}
	}
	l.acks, l.release = acks, rel
	if len(acks) > 0 {
		if aerr := c.cfg.Source.Ack(ctx, acks); aerr != nil && ctx.Err() == nil {
			// Committed but not acknowledged: the broker redelivers and the
			// claim skips the messages as duplicates.
			c.cfg.Logger.Warn("idem: ack failed", slog.String("lane", l.name), slog.Any("error", aerr))
		}
	}
	if len(rel) > 0 {
		if err == nil {
			err = ErrStopped
		}
		c.releaseAll(rel, err)
	}
	clear(items) // drop message references until the next batch
}

// key derives the message's dedup key and fingerprint.
func (c *Consumer[TTx]) key(it *item) error {
	m := it.msg
	if max := c.cfg.MaxPayloadBytes; max > 0 && len(m.Value) > max {
		return fmt.Errorf("%w: %d bytes, the limit is %d", ErrPayloadTooLarge, len(m.Value), max)
	}
	id, err := c.cfg.Key(m)
	if err != nil {
		return fmt.Errorf("key: %w", err)
	}
	scope := c.cfg.Name
	if c.cfg.Tenant != nil {
		t, err := c.cfg.Tenant(m)
		if err != nil {
			return fmt.Errorf("tenant: %w", err)
		}
		scope += "/" + t
	}
	k := dedup.Key{Scope: scope, ID: id}
	if err := k.Validate(); err != nil {
		return err
	}
	src := m.ID // Kafka: topic/partition/offset already
	if src == "" {
		src = m.Coordinates()
	}
	it.claim = dedup.Claim{Key: k, Fingerprint: dedup.FingerprintOf(m.Value), Source: src}
	return nil
}

// settle commits its in as few transactions as it can. A handler failure at
// position i commits its[:i] first, then settles the failing message alone
// with its retries. A failure no message is named for (claim, COMMIT) is
// retried as a whole when transient and split in halves when permanent. A
// batch that meets a conflict (deadlock, serialization failure) twice in a
// row is split in halves too: a smaller transaction holds fewer locks, and
// two lanes retrying the same large batches can deadlock each other again
// and again.
// It returns nil when every item is settled.
func (c *Consumer[TTx]) settle(ctx context.Context, l *lane[TTx], its []*item) error {
	var infra *retryWait
	conflicted := false // the last try met a conflict
	unnamed := false    // the last try failed for no named message, not the database's doing
	for len(its) > 0 {
		failIdx, err := c.try(ctx, l, its)
		if err == nil {
			return c.afterCommit(ctx, its)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		class := classify(err, c.cfg.Store.ClassifyError)
		if class == dedup.ClassFatal {
			return c.fatal(l, err)
		}
		if class.NotTheMessage() {
			failIdx = -1 // the database or a concurrent transaction failed under the handler, not the message
		}
		switch {
		case failIdx == handlerFailedSomewhere && len(its) > 1:
			// A BatchHandler failed without naming the message: halve.
			half := len(its) / 2
			if err := c.settle(ctx, l, its[:half]); err != nil {
				return err
			}
			its = its[half:]
			infra, conflicted = nil, false
		case failIdx == handlerFailedSomewhere:
			if err := c.settleOne(ctx, l, its[0], err, class); err != nil {
				return err
			}
			its = its[1:]
			infra, conflicted = nil, false
		case failIdx >= 0:
			if failIdx > 0 {
				if err := c.settle(ctx, l, its[:failIdx]); err != nil {
					return err
				}
			}
			if err := c.settleOne(ctx, l, its[failIdx], err, class); err != nil {
				return err
			}
			its = its[failIdx+1:]
			infra, conflicted = nil, false
		case class == dedup.ClassPermanent && len(its) > 1:
			half := len(its) / 2
			if err := c.settle(ctx, l, its[:half]); err != nil {
				return err
			}
			its = its[half:]
			infra, conflicted = nil, false
		case class == dedup.ClassPermanent:
			return c.fail(ctx, its[0], err, true)
		case class == dedup.ClassConflict && conflicted && len(its) > 1:
			half := len(its) / 2
			if err := c.settle(ctx, l, its[:half]); err != nil {
				return err
			}
			its = its[half:]
			infra, conflicted = nil, false
		case !class.NotTheMessage() && len(its) == 1:
			// A failure no handler is named for (a deferred constraint
			// raising at COMMIT, say) on a healthy connection: it may well
			// repeat, so it counts against the message's retry budget.
			its[0].attempts++
			if err := c.settleOne(ctx, l, its[0], err, class); err != nil {
				return err
			}
			its = its[1:]
			infra, conflicted, unnamed = nil, false, false
		case !class.NotTheMessage() && unnamed:
			// Twice in a row: isolate the message that causes it.
			half := len(its) / 2
			if err := c.settle(ctx, l, its[:half]); err != nil {
				return err
			}
			its = its[half:]
			infra, conflicted, unnamed = nil, false, false
		default:
			unnamed = !class.NotTheMessage()
			conflicted = class == dedup.ClassConflict
			// The database, not a message: wait and try the same batch again,
			// for as long as it takes. Dead-lettering healthy messages because
			// Postgres restarted would be wrong.
			if infra == nil {
				infra = c.newWait(c.infra)
			}
			if err := infra.wait(ctx, l, err); err != nil {
				return err
			}
		}
	}
	return nil
}

// settleOne retries one failing message alone until it commits, fails for
// good, or uses up the retry policy. Only the handler's own failures count
// against the policy; a database failure is waited out.
func (c *Consumer[TTx]) settleOne(ctx context.Context, l *lane[TTx], it *item, err error, class dedup.ErrorClass) error {
	bounded, infra := c.newWait(c.policy), c.newWait(c.infra)
	handlerFailed := !class.NotTheMessage()
	one := []*item{it}
	for {
		switch {
		case class == dedup.ClassPermanent:
			return c.fail(ctx, it, err, true)
		case !handlerFailed:
			if werr := infra.wait(ctx, l, err); werr != nil {
				return werr
			}
		default:
			ok, werr := bounded.next(ctx, l, err)
			if werr != nil {
				return werr
			}
			if !ok {
				err = fmt.Errorf("gave up after %d attempts: %w", it.attempts, err)
				if c.cfg.OnExhausted == StopLaneOnExhausted {
					c.halt(l, it, err)
					return ErrLaneStopped
				}
				return c.fail(ctx, it, err, false)
			}
		}
		var failIdx int
		failIdx, err = c.try(ctx, l, one)
		if err == nil {
			return c.afterCommit(ctx, one)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		class = classify(err, c.cfg.Store.ClassifyError)
		if class == dedup.ClassFatal {
			return c.fatal(l, err)
		}
		// Alone in its transaction, the message answers for every failure
		// that is not the database's or a conflict: its handler's, or one
		// raised at COMMIT by what its handler wrote.
		handlerFailed = !class.NotTheMessage()
		if handlerFailed && failIdx < 0 {
			it.attempts++
		}
	}
}

// handlerFailedSomewhere is try's failIdx when a BatchHandler failed without
// naming the message.
const handlerFailedSomewhere = -2

// try runs one transaction over its: claim all keys at once, run the handler
// for the new ones, commit. failIdx names the item whose handler failed, -1
// when the failure was not a handler's, handlerFailedSomewhere when a
// BatchHandler failed without saying where.
func (c *Consumer[TTx]) try(ctx context.Context, l *lane[TTx], its []*item) (failIdx int, err error) {
	failIdx = -1
	claims := l.claims[:0]
	for _, it := range its {
		claims = append(claims, it.claim)
	}
	l.claims = claims
	if cap(l.results) < len(its) {
		l.results = make([]dedup.Result, len(its), cap(l.claims))
	}
	results := l.results[:len(its)]
	err = c.cfg.Store.InTx(ctx, func(ctx context.Context, tx TTx) error {
		clear(results)
		if err := c.cfg.Store.Claim(ctx, tx, claims, results); err != nil {
			return err
		}
		for i, it := range its {
			if !results[i].Status.Valid() {
				// Fail closed: acknowledging a message no handler ran for
				// loses its effect for good.
				return fmt.Errorf("%w: Claim left the result of key %q unset (status %d)", dedup.ErrContract, it.claim.Key, results[i].Status)
			}
			it.status, it.reason = results[i].Status, results[i].Reason
		}
		if c.batch != nil {
			return c.handleBatch(ctx, tx, l, its, &failIdx)
		}
		for i, it := range its {
			if it.status != dedup.StatusNew {
				continue
			}
			if err := c.handler.Handle(ctx, tx, it.msg); err != nil {
				it.attempts++
				failIdx = i
				return err
			}
		}
		return nil
	})
	if err == nil {
		c.stats.commits.Add(1)
	}
	return failIdx, err
}

// handleBatch calls the BatchHandler with the new messages of its.
func (c *Consumer[TTx]) handleBatch(ctx context.Context, tx TTx, l *lane[TTx], its []*item, failIdx *int) (err error) {
	fresh, at := l.fresh[:0], l.freshAt[:0]
	for i, it := range its {
		if it.status == dedup.StatusNew {
			fresh, at = append(fresh, it.msg), append(at, i)
		}
	}
	l.fresh, l.freshAt = fresh, at
	defer clear(fresh)
	if len(fresh) == 0 {
		return nil
	}
	defer func() {
		if v := recover(); v != nil {
			err = &PanicError{Value: v, Stack: debug.Stack()}
		}
		if err == nil {
			return
		}
		var me *MessageError
		if errors.As(err, &me) && me.Index >= 0 && me.Index < len(at) {
			*failIdx = at[me.Index]
			its[at[me.Index]].attempts++
			return
		}
		*failIdx = handlerFailedSomewhere
		for _, i := range at {
			its[i].attempts++
		}
	}()
	return c.batch.HandleBatch(ctx, tx, fresh)
}

// afterCommit counts the committed items and dead-letters the ones the claim
// refused (fingerprint mismatch, failed before).
func (c *Consumer[TTx]) afterCommit(ctx context.Context, its []*item) error {
	for _, it := range its {
		switch it.status {
		case dedup.StatusNew:
			c.stats.applied.Add(1)
		case dedup.StatusDuplicate:
			c.stats.duplicates.Add(1)
		case dedup.StatusMismatch:
			err := fmt.Errorf("%w: key %q was processed before with another payload", dedup.ErrFingerprintMismatch, it.claim.Key.ID)
			if err := c.deadLetter(ctx, it, err); err != nil {
				return err
			}
			continue
		case dedup.StatusFailed:
			if err := c.deadLetter(ctx, it, fmt.Errorf("key %q failed before: %s", it.claim.Key.ID, it.reason)); err != nil {
				return err
			}
			continue
		}
		it.settled = true
	}
	return nil
}

// fail dead-letters a message that cannot be processed. With record, the
// failure is first recorded in the store so that a redelivery is dead-lettered
// without running the handler again.
func (c *Consumer[TTx]) fail(ctx context.Context, it *item, reason error, record bool) error {
	if record {
		w := c.newWait(c.infra)
		for {
			err := c.cfg.Store.RecordFailure(ctx, it.claim, dedup.ShortReason(reason.Error()))
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if classify(err, c.cfg.Store.ClassifyError) == dedup.ClassPermanent {
				c.cfg.Logger.Error("idem: recording a failure failed", slog.String("key", it.claim.Key.String()), slog.Any("error", err))
				break
			}
			if err := w.wait(ctx, nil, err); err != nil {
				return err
			}
		}
	}
	return c.deadLetter(ctx, it, reason)
}

// deadLetter writes it to the dead-letter sink, retrying until it succeeds or
// ctx ends, and marks it settled.
func (c *Consumer[TTx]) deadLetter(ctx context.Context, it *item, reason error) error {
	w := c.newWait(c.infra)
	for {
		err := c.cfg.DeadLetter.DeadLetter(ctx, Letter{Message: it.msg, Key: it.claim.Key, Reason: reason, Attempts: it.attempts})
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err := w.wait(ctx, nil, fmt.Errorf("dead letter: %w", err)); err != nil {
			return err
		}
	}
	c.stats.deadLettered.Add(1)
	it.settled = true
	c.cfg.Logger.Warn("idem: message dead-lettered",
		slog.String("message", it.msg.Coordinates()), slog.String("key", it.claim.Key.String()),
		slog.Int("attempts", it.attempts), slog.String("reason", reason.Error()))
	return nil
}

func (c *Consumer[TTx]) halt(l *lane[TTx], it *item, err error) {
	l.haltOnce.Do(func() { close(l.halted) })
	c.cfg.Logger.Error("idem: lane stopped: a message used up its retries",
		slog.String("lane", l.name), slog.String("message", it.msg.Coordinates()),
		slog.String("key", it.claim.Key.String()), slog.Any("error", err))
}

// fatal stops the consumer over a broken deployment: the lane stops where it
// is (its messages are released, none acknowledged), the source stops
// fetching, the other lanes finish what they hold, and Run returns err.
func (c *Consumer[TTx]) fatal(l *lane[TTx], err error) error {
	l.haltOnce.Do(func() { close(l.halted) })
	c.runMu.Lock()
	first := c.fatalErr == nil
	if first {
		c.fatalErr = err
		c.stopped = true
		if c.stopSrc != nil {
			c.stopSrc()
		}
	}
	c.runMu.Unlock()
	if first {
		c.cfg.Logger.Error("idem: consumer stopping: the deployment is broken, not the message",
			slog.String("lane", l.name), slog.Any("error", err))
	}
	return ErrLaneStopped
}
