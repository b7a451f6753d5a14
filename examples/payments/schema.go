package payments

import (
	"context"
	"fmt"
)

// The schema is portable across Postgres, SQLite and MySQL: keys and
// columns with defaults are VARCHAR (MySQL indexes no TEXT without a prefix
// length and gives TEXT no literal default), foreign keys are table
// constraints (MySQL ignores them written on a column).
var schema = []string{
	`CREATE TABLE IF NOT EXISTS accounts (
    id      VARCHAR(100) PRIMARY KEY,
    balance BIGINT NOT NULL DEFAULT 0
)`,
	`CREATE TABLE IF NOT EXISTS inventory (
    sku  VARCHAR(100) PRIMARY KEY,
    sold BIGINT NOT NULL DEFAULT 0
)`,
	`CREATE TABLE IF NOT EXISTS orders (
    id         VARCHAR(100) PRIMARY KEY,
    account_id VARCHAR(100) NOT NULL,
    sku        VARCHAR(100) NOT NULL,
    amount     BIGINT NOT NULL CHECK (amount > 0),
    status     VARCHAR(32) NOT NULL DEFAULT 'UNPAID' CHECK (status IN ('UNPAID', 'PAID')),
    paid_txn   VARCHAR(100),
    FOREIGN KEY (account_id) REFERENCES accounts (id),
    FOREIGN KEY (sku) REFERENCES inventory (sku)
)`,
	// A transaction number is the channel's: two channels may send the
	// same one, so a ledger row is keyed by both.
	`CREATE TABLE IF NOT EXISTS ledger (
    txn_id     VARCHAR(100) NOT NULL,
    order_id   VARCHAR(100) NOT NULL,
    account_id VARCHAR(100) NOT NULL,
    amount     BIGINT NOT NULL,
    channel    VARCHAR(100) NOT NULL,
    PRIMARY KEY (channel, txn_id),
    FOREIGN KEY (order_id) REFERENCES orders (id),
    FOREIGN KEY (account_id) REFERENCES accounts (id)
)`,
}

// Setup creates the four tables when missing. On Postgres, point the
// connection's search_path at the schema you want them in.
func Setup(ctx context.Context, db DB) error { return setup(ctx, db, "payments", schema) }

// Extend is Setup for an example that adds tables of its own: it creates
// the four tables, then runs stmts; an error of theirs is name's.
func Extend(ctx context.Context, db DB, name string, stmts []string) error {
	if err := Setup(ctx, db); err != nil {
		return err
	}
	return setup(ctx, db, name, stmts)
}

func setup(ctx context.Context, db DB, name string, stmts []string) error {
	for _, stmt := range stmts {
		if _, err := db.Exec(ctx, stmt); err != nil {
			return fmt.Errorf("%s: setup: %w", name, err)
		}
	}
	return nil
}

// Order is an order waiting for its payment.
type Order struct {
	ID, Account, SKU string
	Amount           int64
}

// CreateOrders inserts unpaid orders with their accounts and SKUs.
func CreateOrders(ctx context.Context, db DB, orders []Order) error {
	for _, o := range orders {
		if _, err := db.Exec(ctx, `INSERT INTO accounts (id) VALUES ($1) ON CONFLICT (id) DO NOTHING`, o.Account); err != nil {
			return fmt.Errorf("payments: account %s: %w", o.Account, err)
		}
		if _, err := db.Exec(ctx, `INSERT INTO inventory (sku) VALUES ($1) ON CONFLICT (sku) DO NOTHING`, o.SKU); err != nil {
			return fmt.Errorf("payments: sku %s: %w", o.SKU, err)
		}
		if _, err := db.Exec(ctx, `INSERT INTO orders (id, account_id, sku, amount) VALUES ($1, $2, $3, $4)`, o.ID, o.Account, o.SKU, o.Amount); err != nil {
			return fmt.Errorf("payments: order %s: %w", o.ID, err)
		}
	}
	return nil
}
