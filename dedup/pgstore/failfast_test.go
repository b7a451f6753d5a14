package pgstore_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/pgstore"
	"github.com/idemkit/idem/internal/testenv"
)

// A broken deployment fails fast and loudly: Run returns an error that says
// what is wrong, and no message is acknowledged or dead-lettered over it.

// TestRunRefusesAStoreThatWasNeverMigrated: before, the consumer retried
// 42P01 for ever, silently with a quiet logger.
func TestRunRefusesAStoreThatWasNeverMigrated(t *testing.T) {
	pool := testenv.Pool(t)
	st, err := pgstore.New(pool, pgstore.Config{Schema: testenv.Schema(t, pool)})
	if err != nil {
		t.Fatal(err)
	}
	src := consumertest.NewSource(consumertest.Script{})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	res, err := consumertest.Drive(ctx, consumer.Config[pgx.Tx]{
		Name: "payments", Source: src, Store: st, Key: consumer.ByJSONField("txn_id"), Logger: quiet,
		Handler: consumer.HandlerFunc[pgx.Tx](func(context.Context, pgx.Tx, *consumer.Message) error { return nil }),
	}, consumertest.Script{}, consumertest.Message("payments", 0, 0, "", `{"txn_id":"T1"}`))
	if !errors.Is(err, dedup.ErrNotMigrated) || !strings.Contains(err.Error(), "Migrate") {
		t.Fatalf("Drive: %v, want dedup.ErrNotMigrated naming Migrate (%v)", err, res)
	}
	t.Logf("Run returned after %v: %v", time.Since(start), err)
	if src.Acked("payments/0/0") != 0 || len(res.DeadLetters) != 0 {
		t.Errorf("acked %d, dead letters %v", src.Acked("payments/0/0"), res.DeadLetters)
	}
}

// TestMissingBusinessTableStopsTheConsumer: a handler whose table does not
// exist (42P01) fails every message the same way. Before, each was retried
// ten times and dead-lettered: the whole stream thrown away over a
// deployment mistake.
func TestMissingBusinessTableStopsTheConsumer(t *testing.T) {
	_, schema, st, _ := effectsRig(t, pgstore.Config{})
	src := consumertest.NewSource(consumertest.Script{})
	msgs := []*consumer.Message{
		consumertest.Message("payments", 0, 0, "", `{"txn_id":"T1"}`),
		consumertest.Message("payments", 0, 1, "", `{"txn_id":"T2"}`),
		consumertest.Message("payments", 1, 0, "", `{"txn_id":"T3"}`),
	}
	res, err := consumertest.Drive(context.Background(), consumer.Config[pgx.Tx]{
		Name: "payments", Source: src, Store: st, Key: consumer.ByJSONField("txn_id"), Logger: quiet,
		Handler: consumer.HandlerFunc[pgx.Tx](func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			_, err := tx.Exec(ctx, `INSERT INTO `+pgx.Identifier{schema, "ledger"}.Sanitize()+` VALUES (1)`)
			return err
		}),
	}, consumertest.Script{}, msgs...)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "42P01" {
		t.Fatalf("Drive: %v, want Run to stop with the undefined table (%v)", err, res)
	}
	for _, m := range msgs {
		if n := src.Acked(m.ID); n != 0 {
			t.Errorf("%s acked %d times", m.ID, n)
		}
	}
	if len(res.DeadLetters) != 0 || res.Stats.Applied != 0 {
		t.Errorf("dead letters %v, applied %d; want none", res.DeadLetters, res.Stats.Applied)
	}
}

// TestHandlerThatCommitsIsRefused: the consumer owns the transaction. A
// handler that commits it itself used to show only at DEBUG, the message
// then counted as a duplicate.
func TestHandlerThatCommitsIsRefused(t *testing.T) {
	for _, end := range []string{"commit", "rollback"} {
		t.Run(end, func(t *testing.T) {
			_, _, st, _ := effectsRig(t, pgstore.Config{})
			src := consumertest.NewSource(consumertest.Script{})
			res, err := consumertest.Drive(context.Background(), consumer.Config[pgx.Tx]{
				Name: "payments", Source: src, Store: st, Key: consumer.ByJSONField("txn_id"), Logger: quiet,
				Handler: consumer.HandlerFunc[pgx.Tx](func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
					if end == "commit" {
						return tx.Commit(ctx)
					}
					return tx.Rollback(ctx)
				}),
			}, consumertest.Script{}, consumertest.Message("payments", 0, 0, "", `{"txn_id":"T1"}`))
			if !errors.Is(err, dedup.ErrTxEnded) {
				t.Fatalf("Drive: %v, want dedup.ErrTxEnded (%v)", err, res)
			}
			if res.Stats.Duplicates != 0 || len(res.DeadLetters) != 0 {
				t.Errorf("duplicates %d, dead letters %v; want the error only", res.Stats.Duplicates, res.DeadLetters)
			}
		})
	}
}
