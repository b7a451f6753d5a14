package mysqlstore

import (
	"maps"
	"time"
)

// Retention returns how long keys are kept: def for a scope perScope does
// not name (Config.Retention, Config.ScopeRetention); zero is for ever.
// consumer.New refuses non-blocking retries that outlast it.
func (s *Store) Retention() (def time.Duration, perScope map[string]time.Duration) {
	return s.cfg.Retention, maps.Clone(s.cfg.ScopeRetention)
}
