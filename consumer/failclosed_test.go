package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/memstore"
)

// unsetStore leaves the claim result of one key at the zero status, as a
// buggy third-party store would.
type unsetStore struct {
	*memstore.Store
	key string
}

func (u unsetStore) Claim(ctx context.Context, tx *memstore.Tx, claims []dedup.Claim, results []dedup.Result) error {
	if err := u.Store.Claim(ctx, tx, claims, results); err != nil {
		return err
	}
	for i := range claims {
		if claims[i].Key.ID == u.key {
			results[i] = dedup.Result{}
		}
	}
	return nil
}

// TestUnsetClaimResultIsNeverAcknowledged: a claim result left at the zero
// status used to be acknowledged as settled with no handler run, losing the
// effect for good. It must fail closed: the transaction rolls back, the
// consumer stops with dedup.ErrContract, and neither that message nor the
// ones behind it in its lane are acknowledged.
func TestUnsetClaimResultIsNeverAcknowledged(t *testing.T) {
	eff := newEffects()
	cfg := baseConfig(eff.apply)
	cfg.Store = unsetStore{Store: memstore.New(memstore.Config{}), key: "T00001"}
	src := consumertest.NewSource(consumertest.Script{})
	cfg.Source = src
	msgs := []*consumer.Message{
		consumertest.Message("pay", 0, 0, "", payment(0)),
		consumertest.Message("pay", 0, 1, "", payment(1)),
		consumertest.Message("pay", 0, 2, "", payment(2)),
	}
	cfg.BatchSize = 1 // T00000 commits on its own first
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := consumertest.Drive(ctx, cfg, consumertest.Script{}, msgs...)
	if !errors.Is(err, dedup.ErrContract) {
		t.Fatalf("Drive: %v, want dedup.ErrContract (%v)", err, res)
	}
	for i, m := range msgs {
		want := 0
		if i == 0 {
			want = 1
		}
		if got := src.Acked(m.ID); got != want {
			t.Errorf("%s acked %d times, want %d", m.ID, got, want)
		}
	}
	if n := eff.count("T00001") + eff.count("T00002"); n != 0 {
		t.Errorf("%d effects of the refused message and the one behind it, want 0", n)
	}
	if len(res.DeadLetters) != 0 {
		t.Errorf("dead letters: %+v", res.DeadLetters)
	}
}

// deferredFailStore fails COMMIT of any transaction in which the handler
// marked a poison message, as a deferred constraint trigger raising P0001
// would: an error the store cannot classify, on a healthy connection.
type deferredFailStore struct {
	*memstore.Store
	poisoned sync.Map // *memstore.Tx -> true
	commits  atomic.Int64
}

var errTrigger = errors.New("ERROR: amount must be positive (SQLSTATE P0001)")

func (d *deferredFailStore) InTx(ctx context.Context, fn func(context.Context, *memstore.Tx) error) error {
	return d.Store.InTx(ctx, func(ctx context.Context, tx *memstore.Tx) error {
		if err := fn(ctx, tx); err != nil {
			return err
		}
		if _, bad := d.poisoned.LoadAndDelete(tx); bad {
			if d.commits.Add(1) > 100 {
				return consumer.Permanent(fmt.Errorf("retried without bound: %w", errTrigger))
			}
			return fmt.Errorf("commit: %w", errTrigger)
		}
		return nil
	})
}

// TestDeterministicCommitErrorUsesTheRetryBudget: an error raised at COMMIT
// that is neither the database's unavailability nor a conflict repeats on a
// healthy connection. It used to be waited out for ever like an outage,
// wedging the lane; it must be isolated to its message, fall under
// Retry.MaxAttempts and end in a dead letter, with the rest applied.
func TestDeterministicCommitErrorUsesTheRetryBudget(t *testing.T) {
	eff := newEffects()
	st := &deferredFailStore{Store: memstore.New(memstore.Config{})}
	cfg := baseConfig(func(ctx context.Context, tx *memstore.Tx, m *consumer.Message) error {
		id, _ := consumer.ByJSONField("txn_id")(m)
		if id == "T00003" {
			st.poisoned.Store(tx, true)
		}
		eff.add(tx, id)
		return nil
	})
	cfg.Store = st
	res := consumertest.Run(t, cfg, consumertest.Script{}, payments(8)...)
	eff.check(t, txnIDs(8, 3))
	if len(res.DeadLetters) != 1 {
		t.Fatalf("dead letters %+v, want T00003's", res.DeadLetters)
	}
	l := res.DeadLetters[0]
	if l.Key.ID != "T00003" || !errors.Is(l.Reason, errTrigger) || consumer.IsPermanent(l.Reason) {
		t.Errorf("dead letter %s: %v, want T00003 given up after its retries", l.Key.ID, l.Reason)
	}
	if l.Attempts != 4 {
		t.Errorf("dead letter after %d attempts, want Retry.MaxAttempts = 4", l.Attempts)
	}
}
