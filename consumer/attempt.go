package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/idemkit/idem/dedup"
)

// blame says whose doing a failed attempt was.
type blame uint8

const (
	// blameNone: no message is named — the claim or COMMIT failed, or the
	// database or a concurrent transaction failed under a handler.
	blameNone blame = iota
	// blameMessage: the handler of the item at failure.at failed.
	blameMessage
	// blameBatch: a BatchHandler failed without naming the message.
	blameBatch
)

// phase is how far an attempt got.
type phase uint8

const (
	phaseClaim  phase = iota // beginning the transaction or claiming the keys
	phaseHandle              // running the handlers
	phaseCommit              // the handlers returned; COMMIT
)

// failure is the outcome of a failed attempt.
type failure struct {
	err   error
	class dedup.ErrorClass
	blame blame
	at    int   // with blameMessage: the failing item's index
	phase phase // where it failed
}

// charged reports whether the failure counts against a message's retry
// budget: it is neither the database's nor a conflict's doing, the
// deployment is not broken, and a handler ran — a claim that fails (a
// read-only or full database the store does not call unavailable) is the
// store's trouble, never a message's.
func (f *failure) charged() bool {
	return !f.class.NotTheMessage() && f.class != dedup.ClassFatal && f.phase != phaseClaim
}

// attempt runs one transaction over a lane's items: one claim of every key,
// the handler for the new ones, one COMMIT. Its buffers are reused.
type attempt[TTx any] struct {
	c       *Consumer[TTx]
	claims  []dedup.Claim
	claimAt []int // with Config.Offsets: the items claimed under business keys
	results []dedup.Result
	cursor  *offsetCursor // the lane's, with Config.Offsets
	// with Config.Offsets: when the lane first found the stored offset past
	// the log end its messages were fetched with (zero: not now)
	aheadSince time.Time
	fresh      []*Message // a BatchHandler's messages
	freshAt    []int      // their positions in the items
	tx         TxEvent    // what the Observer is told of the transaction
	// with Config.Entity: the events of the new items, their positions in
	// the items, and what AdvanceEntities decided
	events   []dedup.EntityEvent
	eventAt  []int
	advances []dedup.Advance
}

// run runs the transaction. It returns nil when it committed, with each
// item's claim status set, and otherwise what failed, classified, with the
// failure charged to the message it names.
func (a *attempt[TTx]) run(ctx context.Context, its []*item) *failure {
	c := a.c
	claims := a.claims[:0]
	for _, it := range its {
		claims = append(claims, it.claim)
	}
	a.claims = claims
	if cap(a.results) < len(its) {
		a.results = make([]dedup.Result, len(its), cap(claims))
	}
	results := a.results[:len(its)]
	f := failure{blame: blameNone, phase: phaseClaim}
	a.tx = TxEvent{Messages: len(its), Start: time.Now()}
	txCtx := c.cfg.Observer.TxStart(ctx, len(its))
	next := int64(-1) // with Config.Offsets: the next offset this transaction stores
	err := c.cfg.Store.InTx(txCtx, func(ctx context.Context, tx TTx) error {
		clear(results)
		a.tx.ClaimStart = time.Now()
		if c.cfg.Offsets != nil {
			next, a.tx.ClaimErr = a.claimOffsets(ctx, tx, its, results)
		} else {
			a.tx.ClaimErr = c.cfg.Store.Claim(ctx, tx, claims, results)
		}
		a.tx.ClaimEnd = time.Now()
		if err := a.tx.ClaimErr; err != nil {
			return err
		}
		f.phase = phaseHandle
		for i, it := range its {
			if c.cfg.Offsets != nil {
				break // claimOffsets set the statuses
			}
			if !results[i].Status.Valid() {
				// Fail closed: acknowledging a message no handler ran for
				// loses its effect for good.
				return fmt.Errorf("%w: Claim left the result of key %q unset (status %d)", dedup.ErrContract, it.claim.Key, results[i].Status)
			}
			it.status, it.reason, it.firstAt = results[i].Status, results[i].Reason, results[i].FirstAt
		}
		if err := a.advanceEntities(ctx, tx, its); err != nil {
			f.phase = phaseClaim // no handler ran: the store's trouble, not a message's
			return err
		}
		if i, err := a.staleSteps(ctx, tx, its); err != nil {
			f.phase = phaseClaim
			if i >= 0 { // refused in doubt, as a handler's InDoubt
				f.phase, f.blame, f.at = phaseHandle, blameMessage, i
			}
			return err
		}
		if err := a.handle(ctx, tx, its, &f); err != nil {
			return err
		}
		f.phase = phaseCommit
		a.tx.CommitStart = time.Now()
		return nil
	})
	a.tx.End = time.Now()
	if a.cursor != nil {
		switch {
		case err != nil:
			// Rolled back, or an unknown outcome of COMMIT: the retry reads
			// the stored offset again.
			a.cursor.known = false
		case next >= 0:
			a.cursor.next = next
		}
	}
	if err == nil {
		c.stats.commits.Add(1)
		c.cfg.Observer.TxEnd(txCtx, a.tx)
		return nil
	}
	f.err = err
	f.class = classify(err, c.cfg.Store.ClassifyError)
	var p *PanicError
	if errors.As(err, &p) {
		c.cfg.Logger.Error("idem: handler panicked", slog.Any("panic", p.Value), slog.String("stack", string(p.Stack)))
		if c.cfg.PanicsArePermanent && f.class != dedup.ClassFatal {
			f.class = dedup.ClassPermanent
		}
	}
	a.tx.Err, a.tx.Class = err, f.class
	c.cfg.Observer.TxEnd(txCtx, a.tx)
	if f.class.NotTheMessage() {
		f.blame = blameNone // the database or a concurrent transaction failed under the handler
	}
	if f.charged() {
		switch {
		case f.blame == blameMessage:
			its[f.at].attempts++
		case f.blame == blameBatch:
			for _, i := range a.freshAt {
				its[i].attempts++
			}
		case len(its) == 1:
			// Alone in its transaction, the message answers for a failure
			// no one is named for: a deferred constraint raising at COMMIT
			// repeats on a healthy connection.
			its[0].attempts++
		}
	}
	return &f
}

// handle runs the handler for the new items, or the BatchHandler for all
// of them, and records on f which message failed.
func (a *attempt[TTx]) handle(ctx context.Context, tx TTx, its []*item, f *failure) error {
	if a.c.batch != nil {
		return a.handleBatch(ctx, tx, its, f)
	}
	for i, it := range its {
		if it.status != dedup.StatusNew || it.stale {
			continue
		}
		if err := a.c.handler.Handle(ctx, tx, it.msg); err != nil {
			f.blame, f.at = blameMessage, i
			return err
		}
	}
	return nil
}

// handleBatch calls the BatchHandler with the new messages of its and
// records on f which message failed, when it says.
func (a *attempt[TTx]) handleBatch(ctx context.Context, tx TTx, its []*item, f *failure) error {
	fresh, at := a.fresh[:0], a.freshAt[:0]
	for i, it := range its {
		if it.status == dedup.StatusNew && !it.stale {
			fresh, at = append(fresh, it.msg), append(at, i)
		}
	}
	a.fresh, a.freshAt = fresh, at
	defer clear(fresh)
	if len(fresh) == 0 {
		return nil
	}
	err := protect(func() error { return a.c.batch.HandleBatch(ctx, tx, fresh) })
	if err == nil {
		return nil
	}
	var me *MessageError
	if errors.As(err, &me) && me.Index >= 0 && me.Index < len(at) {
		f.blame, f.at = blameMessage, at[me.Index]
	} else {
		f.blame = blameBatch
	}
	return err
}
