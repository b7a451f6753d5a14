package consumer

import (
	"context"
	"fmt"

	"github.com/idemkit/idem/dedup"
)

// settler commits a lane's keyed items in as few transactions as it can and
// decides, after each failed attempt, what the failure means.
type settler[TTx any] struct {
	c       *Consumer[TTx]
	l       *lane[TTx]
	attempt attempt[TTx]
	one     [1]*item
	// checkParked's buffers (KeyOrdered)
	parkRefs []dedup.ParkRef
	parkAt   []int
	parkOut  []dedup.ParkDecision
}

// action is what the settle policy does after a failed attempt.
type action uint8

const (
	retryWhole action = iota // wait, then attempt the same items again
	halve                    // settle each half on its own
	isolate                  // commit the items before the culprit, then settle it alone
	giveUp                   // record the failure and dead-letter the only item
	stop                     // the deployment is broken: stop the consumer
)

// decide is the settle policy: what to do with n items after failure f.
// last is the previous failure of the same n items, nil after progress.
//
//   - A broken deployment stops the consumer.
//   - A handler that failed is isolated: the items before it commit without
//     it, and it is retried alone under its retry budget. A BatchHandler
//     that failed without naming the message is split in halves down to it.
//   - A permanent failure no message is named for (a constraint at COMMIT)
//     is split in halves down to the message that causes it, which is then
//     given up at once.
//   - The database being away is waited out, the same items again, for as
//     long as it takes: dead-lettering healthy messages because Postgres
//     restarted would be wrong. So is a claim that fails for no message's
//     fault (a read-only database, a full disk): no handler ran.
//   - A conflict (deadlock, serialization failure) is retried whole, outside
//     any message's budget; twice in a row, the items are halved, because
//     two lanes retrying the same large batches can deadlock each other again
//     and again, and a smaller transaction holds fewer locks.
//   - Any other failure no message is named for, on a healthy connection, is
//     retried whole once, then halved down to the message that causes it,
//     which answers for it under its retry budget.
func decide(f, last *failure, n int) (action, int) {
	switch {
	case f.class == dedup.ClassFatal:
		return stop, 0
	case f.blame == blameMessage:
		return isolate, f.at
	case f.blame == blameBatch && n > 1:
		return halve, 0
	case f.blame == blameBatch:
		return isolate, 0
	case f.class == dedup.ClassPermanent && n > 1:
		return halve, 0
	case f.class == dedup.ClassPermanent:
		return giveUp, 0
	case f.class == dedup.ClassConflict && last != nil && last.class == dedup.ClassConflict && n > 1:
		return halve, 0
	case !f.charged():
		return retryWhole, 0 // the database, a conflict, or a claim that failed
	case n == 1:
		return isolate, 0
	case last != nil && last.charged():
		return halve, 0
	default:
		return retryWhole, 0
	}
}

// settle commits its, splitting and retrying as decide says. It returns nil
// when every item is settled (committed, skipped or dead-lettered).
func (s *settler[TTx]) settle(ctx context.Context, its []*item) error {
	var wait *retryWait
	var last *failure
	for len(its) > 0 {
		if s.c.parking != nil {
			var err error
			if its, err = s.checkParked(ctx, its); err != nil {
				return err
			}
			if len(its) == 0 {
				return nil
			}
		}
		f := s.attempt.run(ctx, its)
		if f == nil {
			return s.c.committed(ctx, its)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		act, at := decide(f, last, len(its))
		switch act {
		case stop:
			return s.c.fatal(s.l, f.err)
		case giveUp:
			return s.fail(ctx, its[0], f.err, true)
		case retryWhole:
			if wait == nil {
				wait = s.c.newWait(s.c.infra)
			}
			if err := wait.wait(ctx, s.l, f.err); err != nil {
				return err
			}
			last = f
			continue
		case halve:
			half := len(its) / 2
			if err := s.settle(ctx, its[:half]); err != nil {
				return err
			}
			its = its[half:]
		case isolate:
			if at > 0 {
				if err := s.settle(ctx, its[:at]); err != nil {
					return err
				}
			}
			if err := s.alone(ctx, its[at], f); err != nil {
				return err
			}
			its = its[at+1:]
		}
		wait, last = nil, nil
	}
	return nil
}

// alone retries one failing item in transactions of its own until it
// commits, fails for good, or uses up the retry policy. Failures charged to
// the message count against the policy; the database's and conflicts are
// waited out.
func (s *settler[TTx]) alone(ctx context.Context, it *item, f *failure) error {
	bounded, infra := s.c.newWait(s.c.policy), s.c.newWait(s.c.infra)
	s.one[0] = it
	defer func() { s.one[0] = nil }()
	one := s.one[:]
	for {
		switch {
		case f.class == dedup.ClassFatal:
			return s.c.fatal(s.l, f.err)
		case f.class == dedup.ClassPermanent:
			return s.fail(ctx, it, f.err, true)
		case !f.charged():
			if err := infra.wait(ctx, s.l, f.err); err != nil {
				return err
			}
		default:
			ok, err := bounded.next(ctx, s.l, f.err)
			if err != nil {
				return err
			}
			if !ok {
				err := fmt.Errorf("gave up after %d attempts: %w", it.attempts, f.err)
				if s.c.nonBlocking != nil {
					return s.c.retryLater(ctx, it, err)
				}
				if s.c.cfg.OnExhausted == StopLaneOnExhausted {
					s.c.halt(s.l, it, err)
					return ErrLaneStopped
				}
				return s.fail(ctx, it, err, false)
			}
		}
		if f = s.attempt.run(ctx, one); f == nil {
			return s.c.committed(ctx, one)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
}

// fail dead-letters it (Consumer.fail) and, with Config.Offsets, moves
// the partition's next offset past it at once, before the lane settles
// anything after it: the items before it are settled. From the moment its
// letter is written the letter can be redriven, and with Offsets alone the
// original writes no key row for its copy's claim to find: a redelivery of
// the original from an offset at or below it — the rest of the batch
// never settled (a crash, a rebalance), the process restarted from the
// stored offset — would be applied, once its cause is fixed, beside the
// copy.
func (s *settler[TTx]) fail(ctx context.Context, it *item, reason error, record bool) error {
	if err := s.c.fail(ctx, it, reason, record); err != nil {
		return err
	}
	return s.l.advancePast(ctx, s.c, it.msg)
}

// committed settles the items of a committed transaction: the new ones are
// applied, the duplicates skipped, and the ones the claim refused — another
// payload under the key, a key that failed before — dead-lettered.
func (c *Consumer[TTx]) committed(ctx context.Context, its []*item) error {
	for _, it := range its {
		switch {
		case it.status == dedup.StatusNew && it.stale:
			if err := c.stale(ctx, it); err != nil {
				return err
			}
			continue
		}
		if it.status == dedup.StatusNew || it.status == dedup.StatusDuplicate {
			if err := c.unpark(ctx, it); err != nil {
				return err
			}
		}
		switch it.status {
		case dedup.StatusNew:
			c.stats.applied.Add(1)
			c.settled(ctx, Settlement{Message: it.msg, Key: it.claim.Key, Outcome: OutcomeApplied})
		case dedup.StatusDuplicate:
			c.duplicate(ctx, it)
		case dedup.StatusMismatch:
			err := fmt.Errorf("%w: key %q was processed before with another payload", dedup.ErrFingerprintMismatch, it.claim.Key.ID)
			if err := c.deadLetter(ctx, it, err, CauseMismatch); err != nil {
				return err
			}
			continue
		case dedup.StatusFailed:
			err := fmt.Errorf("%w: key %q: %s", dedup.ErrFailedBefore, it.claim.Key.ID, it.reason)
			if err := c.deadLetter(ctx, it, err, CauseFailedBefore); err != nil {
				return err
			}
			continue
		}
		it.settled = true
	}
	return nil
}
