package pgstore_test

import (
	"context"
	"log"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/dedup/pgstore"
)

// A store on a pgx pool, its table created (or upgraded) by Migrate, and a
// handler whose writes commit with the dedup row. Keys are kept for 90 days,
// the audit consumer's for ever. (Not run: it needs a database.)
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	store, err := pgstore.New(pool, pgstore.Config{
		Schema:         "idem",                               // idem.idem_dedup
		Retention:      90 * 24 * time.Hour,                  // longer than any re-send
		ScopeRetention: map[string]time.Duration{"audit": 0}, // 0: for ever
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil { // safe to run from every replica at start
		log.Fatal(err)
	}
	handler := consumer.HandlerFunc[pgx.Tx](func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		txn, err := consumer.ByJSONField("txn_id")(m)
		if err != nil {
			return consumer.Permanent(err)
		}
		// In the store's transaction: committed with the dedup row, or not at all.
		_, err = tx.Exec(ctx, `INSERT INTO ledger (txn_id, payload) VALUES ($1, $2)`, txn, m.Value)
		return err
	})
	_ = consumer.Config[pgx.Tx]{Name: "ledger", Store: store, Handler: handler, Key: consumer.ByJSONField("txn_id")}
	// ... Source and DeadLetter from adapters/kafka or adapters/rocketmq, then consumer.New.
}

// Purge deletes expired keys in bounded batches, skipping rows that other
// transactions hold; call it in a loop from a periodic job. Expiry follows the
// database's clock. (Not run: it needs a database.)
func ExampleStore_Purge() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	store, err := pgstore.New(pool, pgstore.Config{Retention: 30 * 24 * time.Hour})
	if err != nil {
		log.Fatal(err)
	}
	total := 0
	for {
		n, err := store.Purge(ctx, 1000)
		if err != nil {
			log.Fatal(err)
		}
		total += n
		if n < 1000 {
			break
		}
	}
	log.Printf("purged %d expired keys", total)
}
