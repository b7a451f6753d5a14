package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/deduptest"
	"github.com/idemkit/idem/dedup/pgstore"
	"github.com/idemkit/idem/internal/testenv"
)

// TestPurgePartitionedTable: idem purge of a partitioned table needs
// --partition-width; without it, it says why and purges nothing.
func TestPurgePartitionedTable(t *testing.T) {
	pool, schema := testenv.SchemaPool(t)
	ctx := context.Background()
	st, err := pgstore.New(pool, pgstore.Config{Schema: schema, PartitionWidth: 24 * time.Hour,
		ScopeRetention: map[string]time.Duration{"brief": time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	err = st.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		return st.Claim(ctx, tx, []dedup.Claim{deduptest.Claim("brief", "a", "p"), deduptest.Claim("kept", "b", "p")}, make([]dedup.Result, 2))
	})
	if err != nil {
		t.Fatal(err)
	}
	envs := map[string]string{"IDEM_PG_URL": testenv.PostgresURL(t), "IDEM_PG_SCHEMA": schema}
	if code, _, errOut := idem(t, "", envs, "purge", "--json"); code != exitError || !strings.Contains(errOut, "partitioned") {
		t.Errorf("purge without --partition-width: %d %q", code, errOut)
	}
	testenv.WaitUntil(t, 30*time.Second, "the brief key purged", func() bool {
		code, out, errOut := idem(t, "", envs, "purge", "--json", "--partition-width", "24h")
		if code != exitOK {
			t.Fatalf("purge --partition-width 24h: %d %q %q", code, out, errOut)
		}
		return decode[map[string]int](t, out)["purged"] == 1
	})
	var left int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+st.Table()).Scan(&left); err != nil || left != 1 {
		t.Errorf("%d rows left (%v), want the kept one", left, err)
	}
}
