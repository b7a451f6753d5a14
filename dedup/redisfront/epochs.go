package redisfront

import (
	"context"
	"log/slog"
	"time"

	"github.com/idemkit/idem/dedup"
)

// epochView is the release epochs as the database had them when a read
// began, trusted until that moment plus Config.EpochTTL (by this process's
// monotonic clock). It is never changed once made.
type epochView struct {
	epochs    map[string]dedup.Epoch
	refreshAt time.Time // one caller reads the epochs again from here on
	until     time.Time // nothing trusted from here on
}

// of returns the epoch of scope an entry is written under, and false when
// the view is missing or a release of scope is in progress: then nothing
// of scope is trusted or written.
func (v *epochView) of(scope string) (int64, bool) {
	if v == nil {
		return 0, false
	}
	e := v.epochs[scope]
	return e.N, !e.Releasing
}

// trusts reports whether an entry of scope written under epoch is still
// true: no release of the scope began since it was written.
func (v *epochView) trusts(scope string, epoch int64) bool {
	n, ok := v.of(scope)
	return ok && n == epoch
}

// epochsNow returns a view of the release epochs that is still valid,
// reading them again when it runs out (one caller reads; while the old view
// is valid the others go on with it, else they wait for the read). nil when
// they cannot be read: then Redis answers nothing and is written nothing.
func (s *Store[TTx]) epochsNow(ctx context.Context) *epochView {
	v := s.epoch.Load()
	now := time.Now()
	if v != nil && now.Before(v.refreshAt) {
		return v
	}
	if v != nil && now.Before(v.until) {
		if !s.epochMu.TryLock() {
			return v // another caller is reading them
		}
	} else {
		s.epochMu.Lock()
	}
	defer s.epochMu.Unlock()
	if v = s.epoch.Load(); v != nil && time.Now().Before(v.refreshAt) {
		return v // read meanwhile
	}
	if time.Now().UnixNano() < s.epochDownUntil.Load() {
		if v != nil && time.Now().Before(v.until) {
			return v
		}
		return nil
	}
	nv, err := s.readEpochs(ctx)
	if err != nil {
		if ctx.Err() == nil {
			s.epochDownUntil.Store(time.Now().Add(s.cfg.RetryAfter).UnixNano())
			s.cfg.Logger.Warn("idem: redis front: cannot read the release epochs; claims go to the database meanwhile",
				slog.Any("error", err), slog.Duration("retry_after", s.cfg.RetryAfter))
		}
		if v != nil && time.Now().Before(v.until) {
			return v
		}
		return nil
	}
	return nv
}

// readEpochs reads the release epochs from the database, within
// EpochTTL, and keeps them as the current view.
func (s *Store[TTx]) readEpochs(ctx context.Context) (*epochView, error) {
	began := time.Now() // before the read: a release that began after it is seen by the next
	ctx, cancel := context.WithTimeout(ctx, s.cfg.EpochTTL)
	defer cancel()
	s.stats.epochReads.Add(1)
	m, err := s.epochs.Epochs(ctx)
	if err != nil {
		return nil, err
	}
	v := &epochView{epochs: m, refreshAt: began.Add(s.cfg.EpochTTL * 4 / 5), until: began.Add(s.cfg.EpochTTL)}
	s.epoch.Store(v)
	return v, nil
}

// settle is how long Release and Forget wait after moving an epoch: every
// view read before the move has run out by then (a tenth more than
// EpochTTL for clocks that do not run at quite the same rate).
func (s *Store[TTx]) settle() time.Duration { return s.cfg.EpochTTL + s.cfg.EpochTTL/10 }
