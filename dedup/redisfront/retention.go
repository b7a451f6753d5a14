package redisfront

import "time"

// Retention returns the inner store's retention (dedup.Store.Retention):
// the inner store's purge is what forgets a key, so it is what
// consumer.New holds non-blocking retries to. Config.Retention and
// Config.ScopeRetention only bound how long an entry lives in Redis.
func (s *Store[TTx]) Retention() (def time.Duration, perScope map[string]time.Duration) {
	return s.inner.Retention()
}
