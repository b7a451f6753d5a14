package pgstore_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/dedup/pgstore"
	"github.com/idemkit/idem/internal/testenv"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// effectsTable is append-only on purpose: no unique constraint, so a double
// effect shows up as a second row instead of an error.
func effectsTable(t *testing.T, pool *pgxpool.Pool, schema string) string {
	t.Helper()
	table := pgx.Identifier{schema, "effects"}.Sanitize()
	if _, err := pool.Exec(context.Background(), `CREATE TABLE `+table+` (txn_id text NOT NULL, amount bigint NOT NULL, attempt int NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return table
}

// effectsRig is a migrated store and an effects table in a fresh schema;
// cfg.Schema is set here.
func effectsRig(t *testing.T, cfg pgstore.Config) (pool *pgxpool.Pool, schema string, st *pgstore.Store, table string) {
	t.Helper()
	pool = testenv.Pool(t)
	schema = testenv.Schema(t, pool)
	cfg.Schema = schema
	if strings.HasPrefix(t.Name(), partitionedEngine+"/") {
		cfg.PartitionWidth = time.Hour // partitions_test.go
	}
	st, err := pgstore.New(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return pool, schema, st, effectsTable(t, pool, schema)
}

func insertEffect(table string) consumer.HandlerFunc[pgx.Tx] {
	return func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		id, err := consumer.ByJSONField("txn_id")(m)
		if err != nil {
			return consumer.Permanent(err)
		}
		amount, err := consumer.ByJSONField("amount")(m)
		if err != nil {
			return consumer.Permanent(err)
		}
		_, err = tx.Exec(ctx, `INSERT INTO `+table+` (txn_id, amount, attempt) VALUES ($1, $2::bigint, $3)`, id, amount, m.Attempt)
		return err
	}
}

// TestThousandMessagesDeliveredManyTimesApplyOnce pushes 1,000 payment
// callbacks, each delivered 3–5 times, reordered, with acks lost after commit
// (crash between the database commit and the broker ack), through the fake
// source into real Postgres, and counts rows.
func TestThousandMessagesDeliveredManyTimesApplyOnce(t *testing.T) {
	pool, _, st, table := effectsRig(t, pgstore.Config{})
	ctx := context.Background()

	const n = 1000
	var msgs []*consumer.Message
	var wantSum int64
	for i := range n {
		amount := int64(100 + i)
		wantSum += amount
		msgs = append(msgs, consumertest.Message("payments", int32(i%4), int64(i/4), "",
			fmt.Sprintf(`{"txn_id":"T%05d","amount":%d}`, i, amount)))
	}
	res := consumertest.Run(t, consumer.Config[pgx.Tx]{
		Name:      "payments",
		Store:     st,
		Handler:   insertEffect(table),
		Key:       consumer.ByJSONField("txn_id"),
		BatchSize: 50,
		Logger:    quiet,
	}, consumertest.Script{MinDeliveries: 3, MaxDeliveries: 5, ReorderWindow: 40, CrashAfterCommitEvery: 5, Seed: 7}, msgs...)
	t.Log(res)

	var rows, distinct, dedupRows int64
	var sum int64
	if err := pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT txn_id), coalesce(sum(amount),0) FROM `+table).Scan(&rows, &distinct, &sum); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+st.Table()+` WHERE outcome = 'done'`).Scan(&dedupRows); err != nil {
		t.Fatal(err)
	}
	if rows != n || distinct != n || sum != wantSum || dedupRows != n {
		t.Fatalf("effects %d (distinct %d, sum %d), dedup rows %d; want %d each and sum %d", rows, distinct, sum, dedupRows, n, wantSum)
	}
	if res.Source.Deliveries < 3*n || res.Source.Crashes == 0 {
		t.Fatalf("the script did not misbehave enough: %+v", res.Source)
	}
	if res.Stats.Applied != n || res.Stats.Duplicates != int64(res.Source.Deliveries-n) || len(res.DeadLetters) != 0 {
		t.Fatalf("stats %+v, %d dead letters", res.Stats, len(res.DeadLetters))
	}
}

// TestHundredConcurrentDeliveriesOfOneKey races 100 deliveries of one payment
// through four consumers (as four processes would) with 25 lanes each, so
// that up to 100 transactions claim the key at once.
func TestHundredConcurrentDeliveriesOfOneKey(t *testing.T) {
	pool, _, st, table := effectsRig(t, pgstore.Config{LockTimeout: time.Second})
	slow := func(next consumer.Handler[pgx.Tx]) consumer.Handler[pgx.Tx] {
		return consumer.HandlerFunc[pgx.Tx](func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			// Hold the claim a moment so that the others pile up on it.
			if _, err := tx.Exec(ctx, `SELECT pg_sleep(0.05)`); err != nil {
				return err
			}
			return next.Handle(ctx, tx, m)
		})
	}
	raceOneKey(t, st, pool, table, slow)
}

// raceOneKey delivers one payment 100 times at once through four consumers
// of st (as four processes would) with 25 lanes each, and wants one effect
// in table (counted through db), one applied and 99 duplicates.
func raceOneKey(t *testing.T, st *pgstore.Store, db interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}, table string, mw ...consumer.Middleware[pgx.Tx]) {
	t.Helper()
	var wg sync.WaitGroup
	results := make([]consumertest.Result, 4)
	for c := range 4 {
		var msgs []*consumer.Message
		for p := range 25 {
			msgs = append(msgs, consumertest.Message("payments", int32(c*25+p), 0, "", `{"txn_id":"HOT","amount":500}`))
		}
		wg.Go(func() {
			results[c] = consumertest.Run(t, consumer.Config[pgx.Tx]{
				Name:       "payments",
				Store:      st,
				Handler:    insertEffect(table),
				Middleware: mw,
				Key:        consumer.ByJSONField("txn_id"),
				Logger:     quiet,
			}, consumertest.Script{}, msgs...)
		})
	}
	wg.Wait()
	var effects int64
	if err := db.QueryRow(context.Background(), `SELECT count(*) FROM `+table).Scan(&effects); err != nil {
		t.Fatal(err)
	}
	var applied, dups, letters int64
	for _, r := range results {
		applied += r.Stats.Applied
		dups += r.Stats.Duplicates
		letters += int64(len(r.DeadLetters))
	}
	if effects != 1 || applied != 1 || dups != 99 || letters != 0 {
		t.Fatalf("effects %d, applied %d, duplicates %d, dead letters %d; want 1, 1, 99, 0", effects, applied, dups, letters)
	}
}

// TestConstraintViolationSwallowedByHandler: the handler hits a unique
// violation, ignores the error and returns nil. Postgres has aborted the
// transaction, so COMMIT becomes ROLLBACK (pgx.ErrTxCommitRollback): no
// partial effect, the message is dead-lettered, its batch neighbours apply.
func TestConstraintViolationSwallowedByHandler(t *testing.T) {
	pool, schema, st, table := effectsRig(t, pgstore.Config{})
	ctx := context.Background()
	ledger := pgx.Identifier{schema, "ledger"}.Sanitize()
	if _, err := pool.Exec(ctx, `CREATE TABLE `+ledger+` (account text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO `+ledger+` VALUES ('taken')`); err != nil {
		t.Fatal(err)
	}
	effect := insertEffect(table)
	handler := consumer.HandlerFunc[pgx.Tx](func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if err := effect(ctx, tx, m); err != nil {
			return err
		}
		acct, _ := consumer.ByJSONField("account")(m)
		_, _ = tx.Exec(ctx, `INSERT INTO `+ledger+` VALUES ($1)`, acct) // error swallowed
		return nil
	})
	var msgs []*consumer.Message
	for i, acct := range []string{"a", "b", "taken", "c", "d"} {
		msgs = append(msgs, consumertest.Message("payments", 0, int64(i), "",
			fmt.Sprintf(`{"txn_id":"T%d","amount":1,"account":%q}`, i, acct)))
	}
	res := consumertest.Run(t, consumer.Config[pgx.Tx]{
		Name: "payments", Store: st, Handler: handler, Key: consumer.ByJSONField("txn_id"), Logger: quiet,
	}, consumertest.Script{}, msgs...)
	var effects int64
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+table+` WHERE txn_id <> 'T2'`).Scan(&effects); err != nil {
		t.Fatal(err)
	}
	var bad int64
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+table+` WHERE txn_id = 'T2'`).Scan(&bad); err != nil {
		t.Fatal(err)
	}
	if effects != 4 || bad != 0 {
		t.Fatalf("effects of good messages %d (want 4), of the violating one %d (want 0)", effects, bad)
	}
	if len(res.DeadLetters) != 1 || res.DeadLetters[0].Key.ID != "T2" {
		t.Fatalf("dead letters %+v, want T2", res.DeadLetters)
	}
	var outcome string
	if err := pool.QueryRow(ctx, `SELECT outcome FROM `+st.Table()+` WHERE key = 'T2'`).Scan(&outcome); err != nil || outcome != "failed" {
		t.Fatalf("dedup row of T2: %q, %v; want failed", outcome, err)
	}
}
