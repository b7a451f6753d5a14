// Package payments is the payment-callback consumer people copy: a payment
// channel (WeChat Pay, Alipay, Stripe, a bank) calls back once per payment —
// and again on every timeout it sees, and the queue redelivers on every
// crash. The handler must credit each payment exactly once.
//
// Four tables take part, all written in the consumer's transaction:
//
//   - orders: UNPAID -> PAID only through a conditional UPDATE;
//   - ledger: one row per channel transaction number (primary key);
//   - accounts: balances, credited by the payment amount;
//   - inventory: units sold per SKU;
//
// plus idem's dedup table. Reconcile cross-checks all of them: no lost
// payment, no double effect, balances equal ledger sums, inventory equals paid
// orders, dedup rows and ledger rows match both ways, nothing stuck.
//
// The same code runs on Postgres (pgx), SQLite and MySQL or MariaDB
// (database/sql): the SQL is portable and reaches the database through the
// small DB interface (the MySQL adapter rewrites the placeholders).
//
// RegisterFlags, Open, ConsumerConfig and Run are what the commands
// examples/kafka-payments and examples/rocketmq-payments share: each adds
// only its broker's Source and the sending of the demo's callbacks.
package payments
