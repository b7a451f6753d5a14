package pgstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/deduptest"
	"github.com/idemkit/idem/dedup/pgstore"
)

func TestJournalConformance(t *testing.T) {
	deduptest.RunJournal(t, func(t *testing.T, cfg deduptest.Config) dedup.Journal {
		return newStore(t, pgstore.Config{LockTimeout: cfg.LockTimeout, ScopeRetention: cfg.ScopeRetention})
	})
}

// TestPartitionedJournalConformance: the steps table is plain in the
// partitioned layout too, and Purge reaches it after the partitions.
func TestPartitionedJournalConformance(t *testing.T) {
	deduptest.RunJournal(t, func(t *testing.T, cfg deduptest.Config) dedup.Journal {
		return partitionedStore(t, pgstore.Config{LockTimeout: cfg.LockTimeout, ScopeRetention: cfg.ScopeRetention})
	})
}

func TestTxStepsConformance(t *testing.T) {
	deduptest.RunTxSteps(t, func(t *testing.T, cfg deduptest.Config) deduptest.TxStepsStore[pgx.Tx] {
		return newStore(t, pgstore.Config{LockTimeout: cfg.LockTimeout, ScopeRetention: cfg.ScopeRetention})
	})
}

func TestPartitionedTxStepsConformance(t *testing.T) {
	deduptest.RunTxSteps(t, func(t *testing.T, cfg deduptest.Config) deduptest.TxStepsStore[pgx.Tx] {
		return partitionedStore(t, pgstore.Config{LockTimeout: cfg.LockTimeout, ScopeRetention: cfg.ScopeRetention})
	})
}

func TestWatermarksConformance(t *testing.T) {
	deduptest.RunWatermarks(t, func(t *testing.T, cfg deduptest.Config) deduptest.WatermarkStore[pgx.Tx] {
		return newStore(t, pgstore.Config{LockTimeout: cfg.LockTimeout, ScopeRetention: cfg.ScopeRetention})
	})
}

// TestPartitionedWatermarksConformance: the watermark tables are plain in
// the partitioned layout too, and Purge reaches them after the partitions.
func TestPartitionedWatermarksConformance(t *testing.T) {
	deduptest.RunWatermarks(t, func(t *testing.T, cfg deduptest.Config) deduptest.WatermarkStore[pgx.Tx] {
		return partitionedStore(t, pgstore.Config{LockTimeout: cfg.LockTimeout, ScopeRetention: cfg.ScopeRetention})
	})
}

// TestDistributedJournalRefused: a store in distributed mode refuses the
// journal with an error that says why, classified fatal.
func TestDistributedJournalRefused(t *testing.T) {
	st, err := pgstore.New(new(pgxpool.Pool), pgstore.Config{Distributed: true})
	if err != nil {
		t.Fatal(err)
	}
	_, err = st.BeginStep(context.Background(), deduptest.Step("s", "k", "call"), "pk", dedup.Fingerprint{}, time.Minute)
	if !errors.Is(err, pgstore.ErrDistributedJournal) || st.ClassifyError(err) != dedup.ClassFatal {
		t.Fatalf("BeginStep in distributed mode: %v, want ErrDistributedJournal, fatal", err)
	}
	// Refused before any statement: the caller's transaction is untouched.
	if _, err := st.LiveSteps(context.Background(), nil, []dedup.Key{{Scope: "s", ID: "k"}}); !errors.Is(err, dedup.ErrNoJournal) {
		t.Fatalf("LiveSteps in distributed mode: %v, want ErrNoJournal", err)
	}
}
