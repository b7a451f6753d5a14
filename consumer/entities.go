package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"

	"github.com/idemkit/idem/consumer/wire"
	"github.com/idemkit/idem/dedup"
)

// Entity order (Config.Entity): a message names the entity it is an event
// of and the event's version; in each batch's transaction, right after
// the claim, the new messages that name one meet their entities'
// watermarks in one dedup.Watermarks.AdvanceEntities call, in the batch's
// order, and those at or below it are stale: never handled, settled as
// Config.Stale says. A rolled-back attempt moved nothing, and the next
// attempt decides again.

// Entity names the entity a message is an event of and the event's
// version (Config.Entity). A zero Name: the message is of no entity.
type Entity = wire.Entity

// StalePolicy says what happens to a stale event: one whose version is at
// or below its entity's watermark (Config.Stale).
type StalePolicy uint8

const (
	// StaleSkip (the default) acknowledges a stale event without applying
	// it; Stats.Stale counts it, the Observer sees OutcomeStale, and the
	// store records it (dedup.Watermarks.StaleEvents). Under either policy
	// a stale event with provider steps is dead-lettered in doubt (see
	// Config.Stale).
	StaleSkip StalePolicy = iota
	// StaleDeadLetter dead-letters a stale event (CauseStale) after its
	// transaction committed, its letter naming the entity, the event's
	// version and the watermark it met. The store records it as well: a
	// process that dies between the commit and the letter leaves the
	// record, and the event, a duplicate when it comes back, is not
	// dead-lettered again.
	StaleDeadLetter
)

// ErrStale is what a stale event's Reason wraps (CauseStale, and
// Settlement.Reason of OutcomeStale).
var ErrStale = errors.New("stale event: its version is at or below its entity's watermark")

// deriveEntity sets it.entity with Config.Entity: from what a copy
// carries (wire.MetaEntity, wire.MetaEntityVersion), decided at its
// original's first delivery, or else from the function on the message as
// first delivered (originalView). An error means the message is
// dead-lettered with it (CauseBadInput).
func (c *Consumer[TTx]) deriveEntity(it *item) error {
	if c.cfg.Entity == nil {
		return nil
	}
	m := it.msg
	if e, ok := c.carriedEntity(m); ok {
		it.entity = e
		return nil
	}
	e, err := c.cfg.Entity(originalView(m))
	if err != nil {
		return fmt.Errorf("entity of message %s: %w", m.Ref(), err)
	}
	if len(e.Name) > 200 {
		return fmt.Errorf("entity of message %s: the name is %d bytes, the limit is 200", m.Ref(), len(e.Name))
	}
	if e.Name == "" && e.Version != (dedup.Version{}) {
		return fmt.Errorf("entity of message %s: version %s without an entity name", m.Ref(), e.Version)
	}
	it.entity = e
	return nil
}

// carriedEntity returns the entity and version a copy whose lineage the
// consumer honours (Message.Origin: a retry copy, a redriven letter)
// carries from its first delivery; ok is false when m is no such copy or
// carries none (a copy written before entities, or of a message that
// named none: then the function decides, on the original's view). A
// copy's own record (a retry topic, a new time) must not change its
// order: a copy is ordered as the event it stands for.
//
// A retry copy lies on a retry topic only the consumer writes to, and
// its entity is taken as carried. A redriven copy lies on its original's
// topic, where anyone who can produce can write headers: its carried
// entity must be the one Config.Entity names on its original's view, at
// a version no higher than the one it gives there, so that a forged copy
// cannot push an entity's watermark past the events still to come.
func (c *Consumer[TTx]) carriedEntity(m *Message) (Entity, bool) {
	origin, ok := m.Origin()
	if !ok {
		return Entity{}, false
	}
	name, ok := m.Header(wire.MetaEntity)
	if !ok {
		return Entity{}, false
	}
	ver, ok := m.Header(wire.MetaEntityVersion)
	v, err := wire.ParseVersion(string(ver))
	refuse := func(why string) (Entity, bool) {
		c.cfg.Logger.Warn("idem: the entity a copy carries is not honoured; it is derived from its original's view",
			slog.String("message", m.Ref()), slog.String("entity", string(name)), slog.String("version", string(ver)), slog.String("why", why))
		return Entity{}, false
	}
	switch {
	case !ok || err != nil:
		return refuse(wire.MetaEntityVersion + " is not major.minor")
	case len(name) == 0 || len(name) > 200:
		return refuse("the entity's name must be 1 to 200 bytes")
	}
	e := Entity{Name: string(name), Version: v}
	if !origin.Retry {
		own, err := c.cfg.Entity(originalView(m))
		switch {
		case err != nil:
			return refuse("entity: " + err.Error())
		case own.Name != e.Name:
			return refuse("a redriven copy's entity must be the one Entity names for it, " + strconv.Quote(own.Name))
		case e.Version.Compare(own.Version) > 0:
			return refuse("a redriven copy's version must not be above the one Entity gives it, " + own.Version.String())
		}
	}
	return e, true
}

// advanceEntities is the entity step of an attempt, in its transaction
// right after the claim: the items whose claim is new and that name an
// entity meet their watermarks in one AdvanceEntities call, in the items'
// order, and the stale ones are marked, for handle to skip. Every item's
// mark is set afresh: nothing is carried from a rolled-back attempt.
func (a *attempt[TTx]) advanceEntities(ctx context.Context, tx TTx, its []*item) error {
	marks := a.c.marks
	if marks == nil {
		return nil
	}
	events, at := a.events[:0], a.eventAt[:0]
	for i, it := range its {
		it.stale, it.watermark = false, dedup.Version{}
		if it.status == dedup.StatusNew && it.entity.Name != "" {
			events = append(events, dedup.EntityEvent{Key: it.claim.Key, Entity: it.entity.Name, Version: it.entity.Version})
			at = append(at, i)
		}
	}
	a.events, a.eventAt = events, at
	defer clear(events)
	if len(events) == 0 {
		return nil
	}
	if cap(a.advances) < len(events) {
		a.advances = make([]dedup.Advance, len(events))
	}
	adv := a.advances[:len(events)]
	clear(adv)
	if err := marks.AdvanceEntities(ctx, tx, events, adv); err != nil {
		return err
	}
	for j, i := range at {
		if adv[j].Stale {
			its[i].stale, its[i].watermark = true, adv[j].Watermark
		}
	}
	return nil
}

// staleReason is why it, a stale event, was not applied.
func staleReason(it *item) error {
	return fmt.Errorf("%w: entity %q, event version %s, watermark %s", ErrStale, it.entity.Name, it.entity.Version, it.watermark)
}

// stale settles a stale item of a committed transaction, as Config.Stale
// says. (One whose key has provider steps never gets here: staleSteps
// refused it in doubt before the commit.)
func (c *Consumer[TTx]) stale(ctx context.Context, it *item) error {
	if c.cfg.Stale == StaleDeadLetter {
		return c.deadLetter(ctx, it, staleReason(it), CauseStale)
	}
	if err := c.unpark(ctx, it); err != nil {
		return err
	}
	c.stats.stale.Add(1)
	c.settled(ctx, Settlement{Message: it.msg, Key: it.claim.Key, Outcome: OutcomeStale, Reason: staleReason(it)})
	c.cfg.Logger.Debug("idem: stale event skipped", append(refAttrs(it.msg, it.claim.Key),
		slog.String("entity", it.entity.Name), slog.String("version", it.entity.Version.String()), slog.String("watermark", it.watermark.String()))...)
	it.settled = true
	return nil
}

// staleSteps looks, in the attempt before its commit, for the provider
// steps (the Store's dedup.Journal) of each item found stale that are not
// failed. An earlier attempt of such an event, rolled back with the
// decision that it applied, called a provider (effect.Do) before a later
// event of its entity committed: the call's effect may have happened, and
// nothing books it. The first such item is refused with InDoubt, naming
// the entity, both versions and the steps, and its index returned: the
// transaction rolls back, the key stays free, and the event is
// dead-lettered with CauseInDoubt before its offset moves, whatever
// Config.Stale says. Deciding it after the commit would leave a done key
// behind a letter not yet written: a crash in between, and the event came
// back a duplicate, its effect unbooked and unsaid. A journal that cannot
// answer (a permanent or fatal error) refuses the first stale item the
// same way; one that fails for a moment fails the attempt (index -1),
// which is tried again; a store without a journal (dedup.ErrNoJournal)
// has no steps.
//
// A journal that is a dedup.TxSteps reads the steps of all the stale
// items in tx, in one statement; an error there may have aborted tx, and
// every error returned rolls it back. Any other journal is read with
// Steps, one query for each stale item, on a connection of the Store's
// besides the one tx holds (see Config.Stale).
func (a *attempt[TTx]) staleSteps(ctx context.Context, tx TTx, its []*item) (int, error) {
	c := a.c
	if c.journal == nil {
		return -1, nil
	}
	if c.txSteps == nil {
		return a.staleStepsApart(ctx, its)
	}
	first, keys := -1, []dedup.Key(nil)
	for i, it := range its {
		if it.stale {
			if first < 0 {
				first = i
			}
			keys = append(keys, it.claim.Key)
		}
	}
	if first < 0 {
		return -1, nil
	}
	steps, err := c.txSteps.LiveSteps(ctx, tx, keys)
	if err != nil {
		return c.stepsUnread(its, first, len(keys), err)
	}
	if len(steps) == 0 {
		return -1, nil
	}
	byKey := make(map[dedup.Key][]dedup.StepRecord)
	for _, s := range steps {
		byKey[s.Ref.Key] = append(byKey[s.Ref.Key], s)
	}
	for i, it := range its {
		if it.stale && len(byKey[it.claim.Key]) > 0 {
			return i, InDoubt(staleStepsReason(it, byKey[it.claim.Key], nil))
		}
	}
	return -1, nil
}

// staleStepsApart is staleSteps with a journal that reads only in
// transactions of its own: one Steps query for each stale item.
func (a *attempt[TTx]) staleStepsApart(ctx context.Context, its []*item) (int, error) {
	c := a.c
	for i, it := range its {
		if !it.stale {
			continue
		}
		f := dedup.StepFilter{Scope: it.claim.Key.Scope, Key: it.claim.Key.ID,
			States: []dedup.StepState{dedup.StepPending, dedup.StepSucceeded, dedup.StepUnknown, dedup.StepInDoubt}}
		steps, err := c.journal.Steps(ctx, f)
		switch {
		case err != nil:
			return c.stepsUnread(its, i, 1, err)
		case len(steps) > 0:
			return i, InDoubt(staleStepsReason(it, steps, nil))
		}
	}
	return -1, nil
}

// stepsUnread decides on err, the journal's failure to read the steps of
// n stale items, the first of them its[i]: none without a journal; its[i]
// refused in doubt when the journal cannot answer; else the attempt
// fails, to be tried again.
func (c *Consumer[TTx]) stepsUnread(its []*item, i, n int, err error) (int, error) {
	it := its[i]
	switch {
	case errors.Is(err, dedup.ErrNoJournal):
		return -1, nil
	case isFinal(classify(err, c.cfg.Store.ClassifyError)):
		return i, InDoubt(staleStepsReason(it, nil, err))
	case n == 1:
		return -1, fmt.Errorf("reading the provider steps of stale event %s: %w", it.msg.Ref(), err)
	default:
		return -1, fmt.Errorf("reading the provider steps of %d stale events, the first %s: %w", n, it.msg.Ref(), err)
	}
}

// isFinal reports whether class says a read will not succeed if tried
// again.
func isFinal(class dedup.ErrorClass) bool {
	return class == dedup.ClassPermanent || class == dedup.ClassFatal
}

// staleStepsError is the reason a stale event with provider steps is
// dead-lettered (CauseInDoubt); errors.Is(err, ErrStale) holds.
type staleStepsError struct{ msg string }

func (e *staleStepsError) Error() string { return e.msg }
func (e *staleStepsError) Unwrap() error { return ErrStale }

// staleStepsReason says why it, a stale event, is dead-lettered in doubt:
// its steps, or, with unread, that they could not be read.
func staleStepsReason(it *item, steps []dedup.StepRecord, unread error) error {
	var b strings.Builder
	fmt.Fprintf(&b, "stale event of entity %q (version %s at or below watermark %s) ", it.entity.Name, it.entity.Version, it.watermark)
	if unread != nil {
		fmt.Fprintf(&b, "whose provider steps could not be read (%v): an effect may have happened and not be booked; check its steps and resolve by hand", unread)
		return &staleStepsError{b.String()}
	}
	happened := false
	for i, s := range steps {
		switch {
		case i == 0 && len(steps) == 1:
			b.WriteString("whose provider step ")
		case i == 0:
			b.WriteString("whose provider steps ")
		default:
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %s (provider key %s)", s.Ref.Step, s.State, s.ProviderKey)
		happened = happened || s.State == dedup.StepSucceeded
	}
	if happened {
		b.WriteString(": its effect happened and is not booked; resolve by hand")
	} else {
		b.WriteString(": its effect may have happened and is not booked; resolve by hand")
	}
	return &staleStepsError{b.String()}
}
