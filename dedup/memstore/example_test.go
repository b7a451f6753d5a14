package memstore_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/memstore"
)

// The store used directly, as the consumer does: a claim and the effects
// staged with OnCommit happen together or not at all. A rolled-back claim is
// forgotten, so the retry is new again; after the commit it is a duplicate.
func Example() {
	ctx := context.Background()
	store := memstore.New(memstore.Config{})
	credited := 0
	claim := dedup.Claim{
		Key:         dedup.Key{Scope: "payments", ID: "4200000001"},
		Fingerprint: dedup.FingerprintOf([]byte(`{"txn_id":"4200000001","amount":100}`)),
	}
	apply := func(fail bool) error {
		return store.InTx(ctx, func(ctx context.Context, tx *memstore.Tx) error {
			results := make([]dedup.Result, 1)
			if err := store.Claim(ctx, tx, []dedup.Claim{claim}, results); err != nil {
				return err
			}
			fmt.Println("claim:", results[0].Status)
			if results[0].Status != dedup.StatusNew {
				return nil
			}
			tx.OnCommit(func() { credited += 100 })
			if fail {
				return errors.New("downstream failed") // rolls back the claim and the effect
			}
			return nil
		})
	}
	fmt.Println("attempt 1:", apply(true))
	fmt.Println("attempt 2:", apply(false))
	fmt.Println("redelivery:", apply(false))
	fmt.Println("credited:", credited, "rows:", store.Len())
	// Output:
	// claim: new
	// attempt 1: downstream failed
	// claim: new
	// attempt 2: <nil>
	// claim: duplicate
	// redelivery: <nil>
	// credited: 100 rows: 1
}
