package mysqlstore_test

import (
	"context"
	"database/sql"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/mysqlstore"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/internal/testenv/ledger"
)

// commitCounter counts the store's committed transactions.
type commitCounter struct {
	*mysqlstore.Store
	commits atomic.Int64
	lost    atomic.Int64 // transactions that failed with a lost connection
}

func (c *commitCounter) InTx(ctx context.Context, fn func(context.Context, *sql.Tx) error) error {
	err := c.Store.InTx(ctx, fn)
	switch {
	case err == nil:
		c.commits.Add(1)
	case c.ClassifyError(err) == dedup.ClassUnavailable:
		c.lost.Add(1)
	}
	return err
}

// TestServerKilledMidStream runs the consumer over the ledger workload's
// 600 credits, delivered up to twice and with acks lost after commit, and
// kills the MariaDB server with SIGKILL twice while it works
// (scripts/testenv/mariadb.sh kill, then start: InnoDB's crash recovery).
// Nothing is lost, nothing applied twice, no message is dead-lettered over
// the outage: ledger.Reconcile checks the ledger, the balances and the
// dedup table.
func TestServerKilledMidStream(t *testing.T) {
	if testing.Short() {
		t.Skip("kills the MariaDB server")
	}
	dsn := testenv.MySQLDatabase(t, testenv.MySQLExclusive(t))
	cfg := mysqlstore.Config{LockTimeout: 2 * time.Second}
	db, err := mysqlstore.Open(dsn, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	inner, err := mysqlstore.New(db, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := inner.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	st := &commitCounter{Store: inner}
	s := ledger.Generate(600, 42)
	if err := ledger.Setup(ctx, db, s.Accounts); err != nil {
		t.Fatal(err)
	}
	msgs := ledger.Messages("ledger", s.Payloads)

	// The killer: kill once a third of the commits are in, start again,
	// wait until the consumer commits again, kill again.
	total := int64(len(msgs) / 20) // about the transactions of a run (batches of 20)
	killed := make(chan error, 1)
	stop := make(chan struct{})
	var kills atomic.Int64
	go func() {
		defer close(killed)
		for _, at := range []int64{total / 3, 0} {
			for st.commits.Load() < at || (at == 0 && st.lost.Load() == 0) {
				select {
				case <-stop:
					return
				case <-time.After(5 * time.Millisecond):
				}
			}
			if at == 0 { // the second kill: once the consumer is back at work
				back := st.commits.Load() + 3
				for st.commits.Load() < back {
					select {
					case <-stop:
						return
					case <-time.After(5 * time.Millisecond):
					}
				}
			}
			for _, cmd := range []string{"kill", "start"} {
				if out, err := testenv.RunScript("mariadb", cmd); err != nil {
					killed <- err
					t.Logf("mariadb.sh %s: %s", cmd, out)
					return
				}
			}
			kills.Add(1)
		}
	}()

	dctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	res, err := consumertest.Drive(dctx, consumer.Config[*sql.Tx]{
		Name: "ledger", Store: st, Handler: ledger.Handler(), Key: consumer.ByJSONField(ledger.KeyField),
		MaxPayloadBytes: ledger.MaxPayload, BatchSize: 20, Logger: quiet,
		Clock: testenv.ShortClock{}, // real waits, short: the server restarts meanwhile
	}, consumertest.Script{MinDeliveries: 1, MaxDeliveries: 2, CrashAfterCommitEvery: 5, Seed: 7}, msgs...)
	close(stop)
	if err := <-killed; err != nil {
		t.Fatalf("killing the server: %v", err)
	}
	if err != nil {
		t.Fatalf("consumer: %v (%v)", err, res)
	}
	t.Log(res, "kills:", kills.Load(), "transactions that lost the server:", st.lost.Load())
	if kills.Load() != 2 || st.lost.Load() == 0 {
		t.Fatalf("%d kills, %d transactions met them: the test proved nothing", kills.Load(), st.lost.Load())
	}
	r, err := ledger.Reconcile(ctx, db, inner.Table(), "ledger", s.Expected)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(r)
	if !r.OK() || r.Entries != int64(len(s.Expected)) {
		t.Fatalf("%v: %d entries, want %d", r, r.Entries, len(s.Expected))
	}
	dead := map[string]bool{}
	for _, l := range res.DeadLetters {
		dead[l.Message.ID] = true
	}
	if want := s.Bad + s.Conflicting; len(dead) != want {
		t.Fatalf("%d messages dead-lettered, want the %d bad and conflicting ones: the outage dead-lettered good ones", len(dead), want)
	}
}
