// Package retention is the stores' rule for how long a key is kept:
// Config.Retention, or the scope's own in Config.ScopeRetention, where zero
// is for ever.
package retention

import (
	"fmt"
	"time"
)

// Of returns the retention of scope: perScope's for it when it has one,
// else def. ok is false for a retention of zero or less: for ever.
func Of(def time.Duration, perScope map[string]time.Duration, scope string) (d time.Duration, ok bool) {
	d = def
	if r, found := perScope[scope]; found {
		d = r
	}
	return d, d > 0
}

// CheckScopes returns an error, prefixed with the store's name, when a
// retention of perScope (Config.ScopeRetention) is negative.
func CheckScopes(store string, perScope map[string]time.Duration) error {
	for scope, d := range perScope {
		if d < 0 {
			return fmt.Errorf("%s: Config.ScopeRetention[%q] is negative", store, scope)
		}
	}
	return nil
}
