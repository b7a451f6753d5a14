package mysqlstore_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/deduptest"
	"github.com/idemkit/idem/dedup/mysqlstore"
)

// TestLockWaitIsTheKeys: a claim's lock wait, reported as
// dedup.ErrInFlight, is a wait on a key of its own batch that another
// transaction holds — never on another key. A transaction holds new keys
// k1 and k3 uncommitted, and k5 (committed before) as a duplicate; a claim
// of the keys around and between them (k0, k2, k4, k6) and of the
// duplicate k5 goes through at once, at both isolation levels (the claim
// locks primary-key records, not the gaps between them); a claim of k1
// waits and gets ErrInFlight.
func TestLockWaitIsTheKeys(t *testing.T) {
	for _, iso := range []sql.IsolationLevel{sql.LevelReadCommitted, sql.LevelRepeatableRead} {
		t.Run(iso.String(), func(t *testing.T) {
			st, _ := newStore(t, mysqlstore.Config{Isolation: iso, LockTimeout: time.Second})
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			claim := func(ctx context.Context, tx *sql.Tx, ids ...string) ([]dedup.Result, error) {
				cs := make([]dedup.Claim, len(ids))
				for i, id := range ids {
					cs[i] = deduptest.Claim("orders", id, "p")
				}
				res := make([]dedup.Result, len(cs))
				return res, st.Claim(ctx, tx, cs, res)
			}
			if err := st.InTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
				_, err := claim(ctx, tx, "k5")
				return err
			}); err != nil {
				t.Fatal(err)
			}
			held, release := make(chan error, 1), make(chan struct{})
			ready := make(chan struct{})
			go func() {
				held <- st.InTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
					_, err := claim(ctx, tx, "k1", "k3", "k5")
					close(ready)
					<-release
					return err
				})
			}()
			<-ready
			var res []dedup.Result
			err := st.InTx(ctx, func(ctx context.Context, tx *sql.Tx) (err error) {
				res, err = claim(ctx, tx, "k0", "k2", "k4", "k5", "k6")
				return err
			})
			if err != nil {
				t.Fatalf("claim of the keys around the held ones: %v, want no wait", err)
			}
			for i, want := range []dedup.Status{dedup.StatusNew, dedup.StatusNew, dedup.StatusNew, dedup.StatusDuplicate, dedup.StatusNew} {
				if res[i].Status != want {
					t.Fatalf("claim %d: %v, want %v", i, res[i].Status, want)
				}
			}
			err = st.InTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
				_, err := claim(ctx, tx, "k1")
				return err
			})
			if !errors.Is(err, dedup.ErrInFlight) {
				t.Fatalf("claim of the held key: %v, want ErrInFlight", err)
			}
			close(release)
			if err := <-held; err != nil {
				t.Fatal(err)
			}
		})
	}
}
