package httpidem

import (
	"sync"

	"github.com/idemkit/idem/dedup"
)

// inflight is the set of keys this process is executing in a transaction.
// A duplicate that arrives meanwhile is answered 409 at once, without a
// transaction: the only way SQLite, whose writers queue behind one lock, can
// tell it, and a saving on Postgres, whose advisory lock tells it across
// processes. Leased requests do without: their committed lease says it.
type inflight struct {
	mu   sync.Mutex
	keys map[dedup.Key]struct{}
}

func (f *inflight) acquire(k dedup.Key) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.keys[k]; ok {
		return false
	}
	if f.keys == nil {
		f.keys = make(map[dedup.Key]struct{})
	}
	f.keys[k] = struct{}{}
	return true
}

func (f *inflight) release(k dedup.Key) {
	f.mu.Lock()
	delete(f.keys, k)
	f.mu.Unlock()
}
