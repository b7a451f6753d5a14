package memstore

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/internal/storekit/parkrule"
)

// parkedKey is a parked key: its messages in retry, the head first.
type parkedKey struct {
	ids       []string
	headDelay time.Duration
	parkedAt  time.Time
	headSince time.Time
	expired   bool
}

// CheckParked decides each ref in order, adding followers to their keys;
// see dedup.Parking. The store's mutex serializes concurrent calls.
func (s *Store) CheckParked(ctx context.Context, refs []dedup.ParkRef, limits dedup.ParkLimits, now time.Time, out []dedup.ParkDecision) error {
	if len(out) < len(refs) {
		return fmt.Errorf("memstore: %d decisions for %d parked refs", len(out), len(refs))
	}
	for _, r := range refs {
		if err := r.Validate(); err != nil {
			return err
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, r := range refs {
		pk := s.parked[r.ParkKey]
		if pk != nil && parkrule.Released(pk.headSince, limits, now) {
			delete(s.parked, r.ParkKey) // released: its head is taken for lost
			pk = nil
		}
		out[i] = pk.decide(r.ID, limits, now)
	}
	return nil
}

// decide is CheckParked of one message id against pk (nil: not parked); it adds
// a follower to pk, or expires pk.
func (pk *parkedKey) decide(id string, limits dedup.ParkLimits, now time.Time) dedup.ParkDecision {
	if pk == nil {
		return dedup.ParkDecision{Action: dedup.ParkTry}
	}
	if !pk.expired && limits.Wait > 0 && now.Sub(pk.headSince) > limits.Wait {
		pk.expired = true
	}
	if pk.expired {
		return dedup.ParkDecision{Action: dedup.ParkExpired}
	}
	if pk.ids[0] == id {
		return dedup.ParkDecision{Action: dedup.ParkTry, Head: true}
	}
	if !slices.Contains(pk.ids, id) {
		if limits.Depth > 0 && len(pk.ids) >= limits.Depth {
			pk.expired = true
			return dedup.ParkDecision{Action: dedup.ParkExpired}
		}
		pk.ids = append(pk.ids, id)
	}
	return dedup.ParkDecision{Action: dedup.ParkFollow, Delay: pk.headDelay}
}

// Park records that ref went to retry with delay; see dedup.Parking.
func (s *Store) Park(ctx context.Context, ref dedup.ParkRef, delay time.Duration, now time.Time) error {
	if err := ref.Validate(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	pk := s.parked[ref.ParkKey]
	if pk == nil {
		pk = &parkedKey{parkedAt: now, headSince: now}
		s.parked[ref.ParkKey] = pk
	}
	if !slices.Contains(pk.ids, ref.ID) {
		pk.ids = append(pk.ids, ref.ID)
	}
	if pk.ids[0] == ref.ID {
		pk.headDelay = delay
	}
	return nil
}

// Unpark removes ref from its key; see dedup.Parking. A new head keeps the
// key's HeadDelay: it went to retry as a follower with that delay.
func (s *Store) Unpark(ctx context.Context, ref dedup.ParkRef, now time.Time) error {
	if err := ref.Validate(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	pk := s.parked[ref.ParkKey]
	if pk == nil {
		return nil
	}
	i := slices.Index(pk.ids, ref.ID)
	switch {
	case i < 0:
	case len(pk.ids) == 1:
		delete(s.parked, ref.ParkKey)
	default:
		pk.ids = slices.Delete(pk.ids, i, i+1)
		if i == 0 {
			pk.headSince = now
		}
	}
	return nil
}

// Parked lists the parked keys f selects, oldest first; see dedup.Parking.
func (s *Store) Parked(ctx context.Context, f dedup.ParkFilter) ([]dedup.ParkedKey, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	limit := f.Limit
	if limit <= 0 {
		limit = 100
	}
	s.mu.Lock()
	var out []dedup.ParkedKey
	for k, pk := range s.parked {
		if f.Scope != "" && k.Scope != f.Scope || f.Topic != "" && k.Topic != f.Topic || f.Key != "" && k.Key != f.Key {
			continue
		}
		out = append(out, dedup.ParkedKey{ParkKey: k, Head: pk.ids[0], HeadDelay: pk.headDelay, Depth: len(pk.ids),
			ParkedAt: pk.parkedAt, HeadSince: pk.headSince, Expired: pk.expired})
	}
	s.mu.Unlock()
	slices.SortFunc(out, func(a, b dedup.ParkedKey) int {
		return cmp.Or(a.ParkedAt.Compare(b.ParkedAt), cmp.Compare(a.Scope, b.Scope), cmp.Compare(a.Topic, b.Topic), cmp.Compare(a.ParkKey.Key, b.ParkKey.Key))
	})
	if len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

// ParkStats counts the parked keys and finds the oldest; see dedup.Parking.
func (s *Store) ParkStats(ctx context.Context) (dedup.ParkStats, error) {
	if err := ctx.Err(); err != nil {
		return dedup.ParkStats{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	st := dedup.ParkStats{Keys: len(s.parked)}
	for _, pk := range s.parked {
		if st.Oldest.IsZero() || pk.parkedAt.Before(st.Oldest) {
			st.Oldest = pk.parkedAt
		}
	}
	return st, nil
}

var _ dedup.Parking = (*Store)(nil)
