package memstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/idemkit/idem/dedup"
)

// entity names the entity of a scope a watermark belongs to.
type entity struct{ scope, name string }

func compareEntities(a, b entity) int {
	return cmp.Or(cmp.Compare(a.scope, b.scope), cmp.Compare(a.name, b.name))
}

// mark is a committed watermark.
type mark struct {
	v       dedup.Version
	updated time.Time
	expires time.Time // zero: never
}

// staleRecord is a recorded stale event and when Purge may delete it.
type staleRecord struct {
	dedup.StaleEvent
	expires time.Time // zero: never
}

// AdvanceEntities decides events against their entities' watermarks in tx;
// see dedup.Watermarks. An entity is held by tx from its first advance to
// the end of tx, like a row lock; the advances and the stale records are
// kept in tx and committed with its claims, or forgotten with them.
func (s *Store) AdvanceEntities(ctx context.Context, tx *Tx, events []dedup.EntityEvent, results []dedup.Advance) error {
	if len(results) < len(events) {
		return fmt.Errorf("memstore: %d results for %d entity events", len(results), len(events))
	}
	if tx.finished {
		return errors.New("memstore: transaction is finished")
	}
	for _, e := range events {
		if err := e.Validate(); err != nil {
			return err
		}
	}
	// Take the entities in (scope, entity) order: one lock order for every
	// transaction, as the SQL stores do.
	ents := make([]entity, 0, len(events))
	for _, e := range events {
		ents = append(ents, entity{e.Key.Scope, e.Entity})
	}
	slices.SortFunc(ents, compareEntities)
	for _, en := range slices.Compact(ents) {
		if err := s.holdEntity(ctx, tx, en); err != nil {
			return err
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.cfg.Now()
	for i, e := range events {
		en := entity{e.Key.Scope, e.Entity}
		w, had := tx.marks[en]
		if !had {
			var m mark
			m, had = s.marks[en]
			w = m.v
		}
		results[i] = dedup.Advance{Watermark: w, Had: had}
		if had && e.Version.Compare(w) <= 0 {
			results[i].Stale = true
			tx.stale = append(tx.stale, dedup.StaleEvent{Key: e.Key, Entity: e.Entity, Version: e.Version, Watermark: w, At: now})
			continue
		}
		tx.marks[en] = e.Version
	}
	return nil
}

// holdEntity makes tx the holder of en, waiting, at most the lock timeout,
// for the transaction that holds it to end.
func (s *Store) holdEntity(ctx context.Context, tx *Tx, en entity) error {
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		s.mu.Lock()
		owner, busy := s.markHolders[en]
		if !busy || owner == tx {
			if !busy {
				s.markHolders[en] = tx
				tx.held = append(tx.held, en)
			}
			s.mu.Unlock()
			return nil
		}
		s.mu.Unlock()
		if timer == nil {
			timer = time.NewTimer(s.cfg.LockTimeout)
		}
		select {
		case <-owner.done:
		case <-timer.C:
			return fmt.Errorf("%w: entity %q of scope %q", dedup.ErrInFlight, en.name, en.scope)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// commitEntities moves tx's watermarks and records its stale events;
// s.mu is held.
func (s *Store) commitEntities(tx *Tx, now time.Time) {
	for en, v := range tx.marks {
		s.marks[en] = mark{v: v, updated: now, expires: s.expiry(en.scope, now)}
	}
	for _, e := range tx.stale {
		s.stale = append(s.stale, staleRecord{StaleEvent: e, expires: s.expiry(e.Key.Scope, e.At)})
	}
}

// releaseEntities ends tx's hold of its entities; s.mu is held.
func (s *Store) releaseEntities(tx *Tx) {
	for _, en := range tx.held {
		if s.markHolders[en] == tx {
			delete(s.markHolders, en)
		}
	}
}

// Watermark returns the committed watermark of entity in scope; see
// dedup.Watermarks.
func (s *Store) Watermark(ctx context.Context, scope, name string) (dedup.Version, bool, error) {
	if err := ctx.Err(); err != nil {
		return dedup.Version{}, false, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	m, ok := s.marks[entity{scope, name}]
	return m.v, ok, nil
}

// StaleEvents lists the recorded stale events f selects, newest first; see
// dedup.Watermarks.
func (s *Store) StaleEvents(ctx context.Context, f dedup.StaleFilter) ([]dedup.StaleEvent, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	limit := f.Limit
	if limit <= 0 {
		limit = 100
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []dedup.StaleEvent
	// Recorded in commit order: the newest are last.
	for i := len(s.stale) - 1; i >= 0 && len(out) < limit; i-- {
		e := s.stale[i].StaleEvent
		if f.Scope != "" && e.Key.Scope != f.Scope || f.Entity != "" && e.Entity != f.Entity {
			continue
		}
		out = append(out, e)
	}
	return out, nil
}

// purgeEntities deletes, at most limit, the watermarks untouched and the
// stale records kept for longer than their scope's retention; s.mu is
// held.
func (s *Store) purgeEntities(now time.Time, limit int) int {
	n := 0
	for en, m := range s.marks {
		if n >= limit {
			return n
		}
		if !m.expires.IsZero() && m.expires.Before(now) {
			delete(s.marks, en)
			n++
		}
	}
	s.stale = slices.DeleteFunc(s.stale, func(r staleRecord) bool {
		if n < limit && !r.expires.IsZero() && r.expires.Before(now) {
			n++
			return true
		}
		return false
	})
	return n
}

var _ dedup.Watermarks[*Tx] = (*Store)(nil)
