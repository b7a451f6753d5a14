package pgstore

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/internal/testenv"
)

// TestLookupIsNotAPreparedStatement: pgx prepares statements by default, and
// after five runs Postgres may switch a prepared statement to a generic plan
// built on the table's size back then. For the duplicate lookup that plan was
// a hash join over a full scan of the dedup table, kept while the table grew
// (found by idem-bench: every batch with a duplicate cost the size of the
// table). The lookup must be planned afresh each time, so it must not be
// among the connection's prepared statements.
func TestLookupIsNotAPreparedStatement(t *testing.T) {
	pool := testenv.Pool(t)
	st, err := New(pool, Config{Schema: testenv.Schema(t, pool)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	c := dedup.Claim{Key: dedup.Key{Scope: "s", ID: "k"}}
	for round := range 8 { // more than the five runs before a generic plan
		err := st.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
			res := make([]dedup.Result, 2)
			if err := st.Claim(ctx, tx, []dedup.Claim{c, c}, res); err != nil { // the repeat needs the lookup
				return err
			}
			if res[1].Status != dedup.StatusDuplicate {
				return fmt.Errorf("round %d: repeat is %v", round, res[1].Status)
			}
			var n int
			if err := tx.QueryRow(ctx, `SELECT count(*) FROM pg_prepared_statements WHERE statement = $1`, st.lookupSQL).Scan(&n); err != nil {
				return err
			}
			if n != 0 {
				return fmt.Errorf("round %d: the lookup is a prepared statement", round)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}
