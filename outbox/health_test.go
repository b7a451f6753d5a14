package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/internal/testenv/relaytest"
	"github.com/idemkit/idem/outbox"
)

// flaky is a Publisher whose first call fails every record, and whose
// second, once it has sent, kills the relay's connection (the one idle in
// its transaction over the outbox's table), so that the round cannot mark
// what it published. Later calls send.
type flaky struct {
	pool  *pgxpool.Pool
	table string

	mu    sync.Mutex
	calls int
	sent  int
}

func (p *flaky) Publish(ctx context.Context, recs []outbox.Record, errs []error) {
	p.mu.Lock()
	p.calls++
	call := p.calls
	p.mu.Unlock()
	if call == 1 {
		for i := range errs {
			errs[i] = errors.New("broker away")
		}
		return
	}
	p.mu.Lock()
	p.sent += len(recs)
	p.mu.Unlock()
	if call == 2 {
		var n int
		err := p.pool.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
WHERE state = 'idle in transaction' AND pid <> pg_backend_pid() AND strpos(query, $1) > 0`, p.table).Scan(&n)
		if err != nil || n != 1 {
			panic(fmt.Sprintf("killing the relay's connection: %d killed, %v", n, err))
		}
	}
}

func (p *flaky) published() (calls, sent int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.calls, p.sent
}

// TestRelayPendingAndHealth: Pending counts what waits and how old the
// oldest is; a round whose publish failed and a round whose marking failed
// are failed rounds, the records of the latter republished; Health shows
// the failures until a round goes through, and the progress after.
func TestRelayPendingAndHealth(t *testing.T) {
	pool, schema := testenv.SchemaPool(t)
	ctx := testenv.Context(t, time.Minute)
	ob := relaytest.OutboxIn(t, pool, schema)
	if p, err := ob.Pending(ctx); err != nil || p != (outbox.PendingStats{}) {
		t.Fatalf("pending of an empty outbox: %+v, %v", p, err)
	}
	const n = 5
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var msgs []outbox.Message
		for i := range n {
			msgs = append(msgs, outbox.Message{Topic: "orders", Key: []byte("k"), Value: fmt.Appendf(nil, "v%d", i)})
		}
		return ob.EnqueueFor(ctx, tx, dedup.Key{Scope: "s", ID: "1"}, msgs...)
	}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitUntilProgress(t, time.Minute, "the pending rows to age", func() (bool, string) {
		p, err := ob.Pending(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return p.Count == n && p.OldestAge > 0 && !p.Oldest.IsZero(), fmt.Sprintf("%+v", p)
	})

	pub := &flaky{pool: pool, table: ob.Table()}
	relay, err := outbox.NewRelay(outbox.RelayConfig{Outbox: ob, Publisher: pub, PollInterval: 5 * time.Millisecond,
		Backoff: consumer.RetryPolicy{Initial: 5 * time.Millisecond, Max: 50 * time.Millisecond}, Logger: testenv.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if h := relay.Health(); h.Running || !h.LastProgress.IsZero() || h.Rounds != 0 {
		t.Fatalf("health before Run: %+v", h)
	}
	done := make(chan error, 1)
	go func() { done <- relay.Run(ctx) }()
	// The failed publish backs its shard off: rounds over the other,
	// empty shards are no progress meanwhile.
	testenv.WaitUntilProgress(t, time.Minute, "the failed round", func() (bool, string) {
		h := relay.Health()
		return h.FailedRounds >= 1, fmt.Sprintf("%+v", h)
	})
	if h := relay.Health(); h.Rounds == 3 {
		t.Log("the relay went through before Health was read")
	} else if h.FailingRounds == 0 {
		t.Errorf("health while the shard backs off: %+v, want failing rounds", h)
	}
	testenv.WaitUntilProgress(t, time.Minute, "the outbox to drain", func() (bool, string) {
		p, err := ob.Pending(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return p.Count == 0, fmt.Sprintf("%+v, %+v", p, relay.Stats())
	})
	calls, sent := pub.published()
	st, h := relay.Stats(), relay.Health()
	if calls != 3 || sent != 2*n {
		t.Errorf("publisher: %d calls, %d sent; want 3 calls, %d sent (one failed, one not marked, one)", calls, sent, 2*n)
	}
	if st.Published != n || st.Republished != n || st.MarkFailures != 1 || st.FailedRounds != 2 || st.Rounds != 3 || st.Failed != n {
		t.Errorf("stats %+v: want %d published, %d republished, 1 mark failure, 2 failed rounds of 3, %d failed", st, n, n, n)
	}
	if !h.Running || h.LastProgress.IsZero() || h.FailingRounds != 0 || h.FailedRounds != 2 || h.LastError != nil {
		t.Errorf("health after the outbox drained: %+v", h)
	}
	if p, err := ob.Pending(ctx); err != nil || p.OldestAge != 0 || !p.Oldest.IsZero() {
		t.Errorf("pending once drained: %+v, %v", p, err)
	}
	if err := relay.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if h := relay.Health(); h.Running {
		t.Errorf("health after Stop: %+v", h)
	}
}
