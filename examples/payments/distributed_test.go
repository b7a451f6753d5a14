package payments_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/dedup/pgstore"
	"github.com/idemkit/idem/examples/payments"
	"github.com/idemkit/idem/internal/testenv"
)

// TestDistributedModeReconciles runs the payments stream (duplicates,
// crashes after commit, bad and conflicting callbacks) on pgstore's
// distributed mode, on Postgres with what CockroachDB and YugabyteDB lack
// refused (testenv.Distributed), under SERIALIZABLE, with the first 60
// ledger inserts failing with 40001 or 40P01. Every payment is booked once;
// no message is dead-lettered over a serialization failure.
func TestDistributedModeReconciles(t *testing.T) {
	d := testenv.NewDistributed(t)
	ctx := context.Background()
	st, err := pgstore.New(d.Pool, pgstore.Config{Schema: d.Schema, Distributed: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	h := payments.Handler(func(tx pgx.Tx) payments.DB { return payments.Pgx(tx) })
	b := backend{
		db:    payments.Pgx(d.Pool),
		dedup: st.Table(),
		drive: func(t *testing.T, script consumertest.Script, msgs []*consumer.Message) consumertest.Result {
			return consumertest.Run(t, config(st, h), script, msgs...)
		},
	}
	s := payments.Generate(400, 3)
	setup(t, b, s.Orders)
	const inject = 60
	injected := d.InjectFailures(t, pgx.Identifier{d.Schema, "ledger"}.Sanitize(), inject)

	res := b.drive(t, consumertest.Script{MinDeliveries: 1, MaxDeliveries: 3, CrashAfterCommitEvery: 4, Seed: 5}, messages(s.Payloads))
	r := reconcile(t, b, s.Expected)
	t.Log(res, r)
	if !r.OK() || r.Payments != 400 {
		t.Fatalf("%v (payments %d, want 400)", r, r.Payments)
	}
	if got := injected(); got != inject {
		t.Fatalf("%d failures injected, want %d", got, inject)
	}
	if res.Stats.Applied != 400 || res.Stats.Duplicates == 0 || res.Stats.Retries < inject {
		t.Fatalf("stats %+v: want 400 applied, duplicates, and a retry for each of the %d failures", res.Stats, inject)
	}
	if want := s.Bad + s.Conflicting; distinctMessages(res.DeadLetters) != want {
		t.Fatalf("%d messages dead-lettered, want %d (bad %d, conflicting %d)", distinctMessages(res.DeadLetters), want, s.Bad, s.Conflicting)
	}
	for _, l := range res.DeadLetters {
		var pgErr *pgconn.PgError
		if errors.As(l.Reason, &pgErr) && (pgErr.Code == "40001" || pgErr.Code == "40P01") {
			t.Errorf("dead-lettered over a serialization failure: %v", l.Reason)
		}
	}
}
