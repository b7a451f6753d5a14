package pgstore_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/pgstore"
	"github.com/idemkit/idem/internal/testenv"
)

// beginCounter is a pgx tracer that counts the transactions begun.
type beginCounter struct{ n atomic.Int64 }

func (b *beginCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.HasPrefix(strings.ToLower(strings.TrimSpace(d.SQL)), "begin") {
		b.n.Add(1)
	}
	return ctx
}

func (b *beginCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// countingRig is effectsRig on a pool of its own that counts BEGINs.
func countingRig(t *testing.T) (*pgxpool.Pool, *beginCounter, *pgstore.Store, string) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(testenv.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	begins := &beginCounter{}
	cfg.ConnConfig.Tracer = begins
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	_, _, st, table := effectsRigOn(t, pool, pgstore.Config{})
	return pool, begins, st, table
}

// TestReplayOfCommittedKeysOpensNoTransactions (issue 29, carried over): a
// batch whose keys were all committed before opened a transaction to find
// that out — BEGIN, the claim, COMMIT for nothing. Replayed after a first
// run, 50 payments and one new one: the lane's first batch of duplicates
// runs its transaction, the batches after it are settled from committed
// rows without one, and the batch with the new payment falls back to its
// transaction. Every duplicate is skipped, the new payment applied once.
func TestReplayOfCommittedKeysOpensNoTransactions(t *testing.T) {
	for _, batch := range []int{10, 1} {
		t.Run(fmt.Sprintf("BatchSize=%d", batch), func(t *testing.T) {
			pool, begins, st, table := countingRig(t)
			cfg := consumer.Config[pgx.Tx]{
				Name: "payments", Store: st, Key: consumer.ByJSONField("txn_id"), Handler: insertEffect(table),
				BatchSize: batch, Logger: quiet,
			}
			first := consumertest.Run(t, cfg, consumertest.Script{}, paymentMsgs("payments", 1, 50, 0)...)
			if first.Stats.Applied != 50 {
				t.Fatalf("first run: %v, want 50 applied", first)
			}
			before := begins.n.Load()
			replay := consumertest.Run(t, cfg, consumertest.Script{}, paymentMsgs("payments", 1, 51, 0)...)
			got := begins.n.Load() - before
			if rows, distinct := countEffects(t, pool, table); rows != 51 || distinct != 51 {
				t.Fatalf("effects %d (distinct %d), want 51", rows, distinct)
			}
			if replay.Stats.Duplicates != 50 || replay.Stats.Applied != 1 || replay.Source.Acked != 51 {
				t.Fatalf("replay: %v, want 50 duplicates and 1 applied, all acknowledged", replay)
			}
			// The first batch of duplicates and the batch of the new
			// payment; before, every batch (at least 6 of them).
			if got > 2 {
				t.Fatalf("the replay began %d transactions, want at most 2: batches of committed keys need none", got)
			}
		})
	}
}

// TestLookupCommittedSeesOnlyCommittedRows: a key claimed by a transaction
// in flight is not found (its duplicate could be acknowledged while the
// original rolls back), a committed one is, with Claim's statuses.
func TestLookupCommittedSeesOnlyCommittedRows(t *testing.T) {
	_, _, st, _ := countingRig(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	claim := func(id, body string) dedup.Claim {
		return dedup.Claim{Key: dedup.Key{Scope: "payments", ID: id}, Fingerprint: dedup.FingerprintOf([]byte(body))}
	}
	done := []dedup.Claim{claim("T1", "a"), claim("T2", "b")}
	if err := st.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		return st.Claim(ctx, tx, done, make([]dedup.Result, 2))
	}); err != nil {
		t.Fatal(err)
	}
	if err := st.RecordFailure(ctx, claim("T3", "c"), "bad payload"); err != nil {
		t.Fatal(err)
	}
	held := make(chan struct{})
	release := make(chan struct{})
	inFlight := make(chan error, 1)
	go func() {
		inFlight <- st.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
			if err := st.Claim(ctx, tx, []dedup.Claim{claim("T4", "d"), claim("T5", "e")}, make([]dedup.Result, 2)); err != nil {
				return err
			}
			close(held)
			<-release
			return nil
		})
	}()
	select {
	case <-held:
	case err := <-inFlight:
		t.Fatal(err)
	}
	lookup := func(cs ...dedup.Claim) []dedup.Result {
		t.Helper()
		res := make([]dedup.Result, len(cs))
		for i := range res {
			res[i].Status = dedup.StatusNew // must be cleared
		}
		if err := st.LookupCommitted(ctx, cs, res); err != nil {
			t.Fatal(err)
		}
		return res
	}
	res := lookup(claim("T1", "a"), claim("T2", "other"), claim("T3", "c"), claim("T4", "d"), claim("T5", "e"), claim("T6", "f"))
	want := []dedup.Status{dedup.StatusDuplicate, dedup.StatusMismatch, dedup.StatusFailed, 0, 0, 0}
	for i, r := range res {
		if r.Status != want[i] {
			t.Fatalf("result %d: %v, want %v (all: %+v)", i, r.Status, want[i], res)
		}
		if r.Status != 0 && r.FirstAt.IsZero() {
			t.Fatalf("result %d: no FirstAt", i)
		}
	}
	if r := res[2]; r.Reason != "bad payload" {
		t.Fatalf("failed key's reason %q", r.Reason)
	}
	if r := lookup(claim("T4", "d")); r[0].Status != 0 {
		t.Fatalf("one key in flight: %v, want not found", r[0].Status)
	}
	if r := lookup(claim("T1", "a")); r[0].Status != dedup.StatusDuplicate {
		t.Fatalf("one committed key: %v, want a duplicate", r[0].Status)
	}
	close(release)
	if err := <-inFlight; err != nil {
		t.Fatal(err)
	}
	if r := lookup(claim("T4", "d"), claim("T5", "e")); r[0].Status != dedup.StatusDuplicate || r[1].Status != dedup.StatusDuplicate {
		t.Fatalf("after the commit: %+v, want duplicates", r)
	}
}
