package redisfront_test

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/deduptest"
)

// BenchmarkStream claims a stream of messages in batches, one transaction
// per batch as the consumer runs them, with a share of duplicates (a
// duplicate is a key committed earlier in the stream, with its payload),
// on MariaDB and on Postgres, through the front and on the store alone.
// msgs/s is messages settled per second; db-tx/1k-msgs is the store's
// transactions per 1,000 messages.
func BenchmarkStream(b *testing.B) {
	for _, db := range []string{"mariadb", "postgres"} {
		for _, batch := range []int{1, 10} {
			for _, dups := range []int{0, 50, 90} {
				for _, withFront := range []bool{false, true} {
					name := fmt.Sprintf("db=%s/batch=%d/dups=%d%%/front=%v", db, batch, dups, withFront)
					b.Run(name, func(b *testing.B) {
						switch db {
						case "mariadb":
							inner := &counting[*sql.Tx]{Store: mysqlInner(b, deduptest.Config{})}
							stream(b, dedup.Store[*sql.Tx](inner), &inner.txs, withFront, batch, dups)
						case "postgres":
							inner := &counting[pgx.Tx]{Store: postgresInner(b, deduptest.Config{})}
							stream(b, dedup.Store[pgx.Tx](inner), &inner.txs, withFront, batch, dups)
						}
					})
				}
			}
		}
	}
}

type counter interface{ Load() int64 }

func stream[TTx any](b *testing.B, inner dedup.Store[TTx], txs counter, withFront bool, batch, dups int) {
	st := inner
	if withFront {
		cfg := frontConfig(newClient(b), nil)
		cfg.Timeout = 0 // the default
		st = front(b, inner, cfg)
	}
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(1, uint64(dups)))
	fps := []dedup.Fingerprint{dedup.FingerprintOf([]byte(`{"amount":1}`))}
	claims := make([]dedup.Claim, batch)
	results := make([]dedup.Result, batch)
	next := 0 // keys 0..next-1 were claimed
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for j := range claims {
			id := next
			if next > 0 && rng.IntN(100) < dups {
				id = rng.IntN(next)
			} else {
				next++
			}
			claims[j] = dedup.Claim{Key: dedup.Key{Scope: "bench", ID: fmt.Sprintf("txn-%09d", id)}, Fingerprint: fps[0]}
		}
		err := st.InTx(ctx, func(ctx context.Context, tx TTx) error {
			return st.Claim(ctx, tx, claims, results)
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	msgs := float64(b.N * batch)
	b.ReportMetric(msgs/b.Elapsed().Seconds(), "msgs/s")
	b.ReportMetric(float64(txs.Load())/msgs*1000, "db-tx/1k-msgs")
	b.ReportMetric(0, "ns/op")
}
