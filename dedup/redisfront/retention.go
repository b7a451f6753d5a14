package redisfront

import (
	"maps"
	"time"
)

// Retention returns how long the keys behind the front are kept: def for
// a scope perScope does not name; zero is for ever. consumer.New refuses
// non-blocking retries that outlast it (consumer.KeyRetention).
//
// It is the inner store's retention when the inner store says one, since
// the inner store's purge is what forgets a key; Config.Retention and
// Config.ScopeRetention only bound how long an entry lives in Redis, and
// forwarding keeps the two checks from disagreeing. An inner store that
// says none is described by Config.Retention and Config.ScopeRetention.
func (s *Store[TTx]) Retention() (def time.Duration, perScope map[string]time.Duration) {
	if kr, ok := s.inner.(interface {
		Retention() (time.Duration, map[string]time.Duration)
	}); ok {
		return kr.Retention()
	}
	return s.cfg.Retention, maps.Clone(s.cfg.ScopeRetention)
}
