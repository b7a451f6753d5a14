package consumer_test

import (
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/dedup/memstore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// quiet drops the retry and dead-letter logs the tests provoke on purpose.
var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// effects counts committed effects per key; OnCommit makes them roll back
// with the transaction.
type effects struct {
	mu sync.Mutex
	n  map[string]int
}

func newEffects() *effects { return &effects{n: map[string]int{}} }

func (e *effects) add(tx *memstore.Tx, key string) {
	tx.OnCommit(func() {
		e.mu.Lock()
		e.n[key]++
		e.mu.Unlock()
	})
}

func (e *effects) count(key string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.n[key]
}

func (e *effects) check(t *testing.T, keys []string) {
	t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, k := range keys {
		if e.n[k] != 1 {
			t.Errorf("key %s: %d effects, want 1", k, e.n[k])
		}
	}
	if len(e.n) != len(keys) {
		t.Errorf("%d keys with effects, want %d", len(e.n), len(keys))
	}
}

func payment(i int) string { return fmt.Sprintf(`{"txn_id":"T%05d","amount":%d}`, i, 100+i) }

func baseConfig(h consumer.HandlerFunc[*memstore.Tx]) consumer.Config[*memstore.Tx] {
	return consumer.Config[*memstore.Tx]{
		Name:    "payments",
		Store:   memstore.New(memstore.Config{}),
		Handler: h,
		Key:     consumer.ByJSONField("txn_id"),
		Retry:   consumer.RetryPolicy{MaxAttempts: 4},
		Logger:  quiet,
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
