package sqlitestore_test

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/dedup/sqlitestore"
)

// A consumer on an SQLite file: the ledger row and the dedup row commit in one
// transaction. After a restart (the file opened again) the broker redelivers
// everything, and nothing is applied twice.
func Example() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "idem-example-")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "ledger.db")

	msgs := []*consumer.Message{
		consumertest.Message("payments", 0, 0, "", `{"txn_id":"T1","amount":100}`),
		consumertest.Message("payments", 0, 1, "", `{"txn_id":"T2","amount":250}`),
		consumertest.Message("payments", 0, 2, "", `{"txn_id":"T1","amount":100}`), // the channel re-sends
	}
	// consume is one run of the process: open the file, consume, close.
	consume := func() error {
		db, err := sqlitestore.Open(path, sqlitestore.Config{})
		if err != nil {
			return err
		}
		defer db.Close()
		store, err := sqlitestore.New(db, sqlitestore.Config{})
		if err != nil {
			return err
		}
		if err := store.Migrate(ctx); err != nil {
			return err
		}
		if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS ledger (txn_id TEXT PRIMARY KEY, amount INTEGER NOT NULL)`); err != nil {
			return err
		}
		res, err := consumertest.Drive(ctx, consumer.Config[*sql.Tx]{
			Name:  "ledger",
			Store: store,
			Handler: consumer.HandlerFunc[*sql.Tx](func(ctx context.Context, tx *sql.Tx, m *consumer.Message) error {
				txn, err := consumer.ByJSONField("txn_id")(m)
				if err != nil {
					return consumer.Permanent(err)
				}
				amount, err := consumer.ByJSONField("amount")(m)
				if err != nil {
					return consumer.Permanent(err)
				}
				_, err = tx.ExecContext(ctx, `INSERT INTO ledger (txn_id, amount) VALUES (?, ?)`, txn, amount)
				return err
			}),
			Key:    consumer.ByJSONField("txn_id"),
			Logger: slog.New(slog.DiscardHandler),
		}, consumertest.Script{}, msgs...)
		if err != nil {
			return err
		}
		var rows, sum int
		if err := db.QueryRowContext(ctx, `SELECT count(*), coalesce(sum(amount), 0) FROM ledger`).Scan(&rows, &sum); err != nil {
			return err
		}
		fmt.Printf("applied %d, duplicates %d; ledger: %d rows, %d in all\n", res.Stats.Applied, res.Stats.Duplicates, rows, sum)
		return nil
	}
	if err := consume(); err != nil {
		fmt.Println(err)
		return
	}
	if err := consume(); err != nil { // after a restart: everything delivered again
		fmt.Println(err)
		return
	}
	// Output:
	// applied 2, duplicates 1; ledger: 2 rows, 350 in all
	// applied 0, duplicates 3; ledger: 2 rows, 350 in all
}
