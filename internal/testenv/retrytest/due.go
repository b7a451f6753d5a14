package retrytest

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/wire"
)

// EarlyCopies counts the retry copies a handler was given before they were
// due (wire.RetryDue). Safe for concurrent use.
type EarlyCopies struct {
	n    atomic.Int32
	mu   sync.Mutex
	what string // the last one
}

// Handled notes m, handled now; the handler calls it first.
func (e *EarlyCopies) Handled(m *consumer.Message) {
	if due, ok := wire.RetryDue(m); ok && time.Now().Before(due) {
		e.n.Add(1)
		e.mu.Lock()
		e.what = fmt.Sprintf("%s due %v, handled %v", m.Ref(), due, time.Now())
		e.mu.Unlock()
	}
}

// Check fails t when a copy was handled before it was due.
func (e *EarlyCopies) Check(t testing.TB) {
	t.Helper()
	if n := e.n.Load(); n > 0 {
		e.mu.Lock()
		defer e.mu.Unlock()
		t.Errorf("%d retry copies handled before they were due, e.g. %s", n, e.what)
	}
}
