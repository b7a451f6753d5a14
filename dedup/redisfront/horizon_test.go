package redisfront_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/pgstore"
	"github.com/idemkit/idem/dedup/redisfront"
	"github.com/idemkit/idem/internal/testenv"
)

type nopSink struct{}

func (nopSink) Retry(context.Context, consumer.RetryLetter) error { return nil }

// TestConsumerRefusesRetriesOutlastingTheInnerRetention: consumer.New
// refuses NonBlocking retries whose horizon (delays + RetryMargin) a
// scope's keys do not outlive (hole 37.6), by what the store says
// (dedup.Store.Retention). The front keeps its inner store's
// rows, and the inner store purges them: a front over a Postgres store
// that keeps keys 10 minutes must be refused exactly as that store is, or
// a copy that comes back after its original's key was purged is applied
// again.
func TestConsumerRefusesRetriesOutlastingTheInnerRetention(t *testing.T) {
	pool := testenv.Pool(t)
	inner, err := pgstore.New(pool, pgstore.Config{Schema: testenv.Schema(t, pool), Retention: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if err := inner.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	f := front[pgx.Tx](t, inner, redisfront.Config{
		Client: newClient(t), Prefix: "idemtest:horizon:", Retention: 10 * time.Minute, Logger: quiet,
	})
	for _, c := range []struct {
		name  string
		store dedup.Store[pgx.Tx]
	}{{"pgstore", inner}, {"redisfront over pgstore", f}} {
		t.Run(c.name, func(t *testing.T) {
			_, err := consumer.New(consumer.Config[pgx.Tx]{
				Name: "payments", Store: c.store, Key: consumer.ByJSONField("txn_id"), Logger: quiet,
				Handler: consumer.HandlerFunc[pgx.Tx](func(context.Context, pgx.Tx, *consumer.Message) error { return nil }),
				Source:  consumertest.NewSource(consumertest.Script{}), DeadLetter: &consumertest.DeadLetters{},
				Retries: consumer.NonBlocking{Delays: []time.Duration{time.Minute, 5 * time.Minute}, Sink: nopSink{}},
			})
			if err == nil || !strings.Contains(err.Error(), "keeps the keys of scope") {
				t.Fatalf("consumer.New: %v; want it refused: retries with a 21m horizon over keys kept 10m "+
					"(%T does not say its inner store's retention)", err, c.store)
			}
		})
	}
}
