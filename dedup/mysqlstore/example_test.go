package mysqlstore_test

import (
	"context"
	"database/sql"
	"log"
	"os"
	"time"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/dedup/mysqlstore"
)

// A store on MySQL or MariaDB: Open sets every connection to the store's
// isolation level and lock wait timeout, Migrate creates the table, and the
// handler's writes commit with the dedup row. (Not run: it needs a
// database.)
func Example() {
	ctx := context.Background()
	cfg := mysqlstore.Config{
		LockTimeout: 5 * time.Second,     // innodb_lock_wait_timeout, whole seconds
		Retention:   90 * 24 * time.Hour, // longer than any re-send
	}
	db, err := mysqlstore.Open(os.Getenv("MYSQL_DSN"), cfg) // user:pass@tcp(host:3306)/app
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	store, err := mysqlstore.New(db, cfg)
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil { // safe to run from every replica at start
		log.Fatal(err)
	}
	handler := consumer.HandlerFunc[*sql.Tx](func(ctx context.Context, tx *sql.Tx, m *consumer.Message) error {
		txn, err := consumer.ByJSONField("txn_id")(m)
		if err != nil {
			return consumer.Permanent(err)
		}
		// In the store's transaction: committed with the dedup row, or not at all.
		_, err = tx.ExecContext(ctx, `INSERT INTO ledger (txn_id, payload) VALUES (?, ?)`, txn, m.Value)
		return err
	})
	_ = consumer.Config[*sql.Tx]{Name: "ledger", Store: store, Handler: handler, Key: consumer.ByJSONField("txn_id")}
	// ... Source and DeadLetter from adapters/kafka or adapters/rocketmq, then consumer.New.
}
