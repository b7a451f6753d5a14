package consumer_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
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

// apply is a handler that counts each message's effect under its txn_id.
func (e *effects) apply(_ context.Context, tx *memstore.Tx, m *consumer.Message) error {
	id, _ := consumer.ByJSONField("txn_id")(m)
	e.add(tx, id)
	return nil
}

// applyEach counts the effects of a BatchHandler's messages.
func (e *effects) applyEach(tx *memstore.Tx, msgs []*consumer.Message) {
	for _, m := range msgs {
		id, _ := consumer.ByJSONField("txn_id")(m)
		e.add(tx, id)
	}
}

// failOn is apply, except that the message with txn_id id fails with err.
func (e *effects) failOn(id string, err error) consumer.HandlerFunc[*memstore.Tx] {
	return func(ctx context.Context, tx *memstore.Tx, m *consumer.Message) error {
		if got, _ := consumer.ByJSONField("txn_id")(m); got == id {
			return err
		}
		return e.apply(ctx, tx, m)
	}
}

func payment(i int) string { return fmt.Sprintf(`{"txn_id":"T%05d","amount":%d}`, i, 100+i) }

// payments returns n messages of partition 0 of topic pay, payment(i) at
// offset i.
func payments(n int) []*consumer.Message {
	msgs := make([]*consumer.Message, n)
	for i := range msgs {
		msgs[i] = consumertest.Message("pay", 0, int64(i), "", payment(i))
	}
	return msgs
}

// txnIDs returns the txn_ids of payment(0) to payment(n-1), but for the
// indexes in except.
func txnIDs(n int, except ...int) []string {
	var ids []string
	for i := range n {
		if !slices.Contains(except, i) {
			ids = append(ids, fmt.Sprintf("T%05d", i))
		}
	}
	return ids
}

// runUntil runs c until done reports true (polled for up to 10 s), then
// stops it gracefully and fails t unless Run and Stop return nil.
func runUntil(t *testing.T, c *consumer.Consumer[*memstore.Tx], done func() bool) {
	t.Helper()
	ran := make(chan error, 1)
	go func() { ran <- c.Run(context.Background()) }()
	for deadline := time.Now().Add(10 * time.Second); !done() && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-ran; err != nil {
		t.Fatal(err)
	}
}

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
