package rocketmq_test

import (
	"context"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/adapters/rocketmq"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/dedup/pgstore"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/internal/testenv/rmqtest"
)

// ledgerConsumer is the consumer of the crash test, in parent and child:
// keyed by the payment's txn_id, effects appended with the run number; seen,
// when set, records the seq property of every message delivered.
func ledgerConsumer(src *rocketmq.Source, store *pgstore.Store, effects string, run int, seen func(seq int)) consumer.Config[pgx.Tx] {
	byTxn := consumer.ByJSONField("txn_id")
	return consumer.Config[pgx.Tx]{
		Name:       "ledger",
		Source:     src,
		DeadLetter: src,
		Store:      store,
		Key: func(m *consumer.Message) (string, error) {
			if seen != nil {
				if v, ok := m.Header("seq"); ok {
					n, _ := strconv.Atoi(string(v))
					seen(n)
				}
			}
			return byTxn(m)
		},
		Handler: consumer.HandlerFunc[pgx.Tx](func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			txn, err := byTxn(m)
			if err != nil {
				return consumer.Permanent(err)
			}
			amount, err := consumer.ByJSONField("amount")(m)
			if err != nil {
				return consumer.Permanent(err)
			}
			seq, _ := m.Header("seq")
			_, err = tx.Exec(ctx, `INSERT INTO `+effects+` (key, amount, queue, seq, run) VALUES ($1, $2::bigint, $3, $4::int, $5)`,
				txn, amount, m.Lane, string(seq), run)
			return err
		}),
	}
}

// TestCrashRestartFiveThousand sends 5,000 payment callbacks, a fifth of
// them repeats of an earlier transaction number, and consumes them with
// three consumers in a row: the first is killed with SIGKILL (a crash inside
// the client's 5-second offset-persist window: what it acked since its last
// offset commit is redelivered), the second is hard-stopped by cancelling
// its context (no graceful Stop: its transactions in flight roll back and
// their messages are released unacknowledged), the third, two consumers of
// the group side by side, runs until every transaction is booked. Afterwards the ledger holds exactly one row per
// transaction number, with the right amounts: none lost, none doubled.
func TestCrashRestartFiveThousand(t *testing.T) {
	t.Parallel()
	const total, unique = 5000, 4000
	topic, group := name(t, "t"), name(t, "g")
	rmqtest.Shared(t).CreateTopic(t, topic, 4)
	rmqtest.Shared(t).CreateTopic(t, topic+"_DLQ", 1)
	d := newDB(t)

	// 4,000 transactions, 1,000 of them sent twice; a repeat has the same
	// body (same fingerprint) and its own seq property.
	rng := rand.New(rand.NewPCG(4, 2))
	order := make([]int, 0, total)
	for i := range unique {
		order = append(order, i)
	}
	for range total - unique {
		order = append(order, rng.IntN(unique))
	}
	rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
	var wantSum int64
	for i := range unique {
		wantSum += int64(100 + i)
	}
	msgs := make([]*primitive.Message, len(order))
	for seq, i := range order {
		m := payment(topic, i, 100+i)
		m.WithProperty("seq", strconv.Itoa(seq))
		msgs[seq] = m
	}
	rmqtest.Send(t, rmqtest.Shared(t).NewProducer(t), msgs...)

	// Run 1: a child process, SIGKILLed mid-stream.
	first := startChild(t, child{Schema: d.schema, Topic: topic, Group: group})
	testenv.WaitUntil(t, 2*time.Minute, "the first consumer to book 800 payments", func() bool {
		first.alive(t)
		return d.count(t, "") >= 800
	})
	first.kill(t)
	run1 := d.count(t, "")

	// Runs 2 and 3 record which messages they were delivered.
	var mu sync.Mutex
	seen := map[int]map[int]bool{2: {}, 3: {}}
	recorder := func(run int) func(int) {
		return func(seq int) {
			mu.Lock()
			seen[run][seq] = true
			mu.Unlock()
		}
	}

	// Run 2: in-process, hard-stopped.
	src2 := source(t, rocketmq.Config{Group: group, Topics: []string{topic}})
	r2 := start(t, ledgerConsumer(src2, d.store, d.effects, 2, recorder(2)))
	testenv.WaitUntil(t, 2*time.Minute, "the second consumer to book 2,400 payments", func() bool {
		return d.count(t, "") >= 2400
	})
	r2.Kill(t)
	run2 := d.count(t, "")

	// Run 3: two consumers of the group side by side (the queues are split
	// between them, and moved while they rebalance) until every transaction
	// is booked, then graceful stops.
	src3 := source(t, rocketmq.Config{Group: group, Topics: []string{topic}})
	r3 := start(t, ledgerConsumer(src3, d.store, d.effects, 3, recorder(3)))
	src3b := source(t, rocketmq.Config{Group: group, Topics: []string{topic}})
	r3b := start(t, ledgerConsumer(src3b, d.store, d.effects, 3, recorder(3)))
	testenv.WaitUntil(t, 3*time.Minute, "all 4,000 transactions booked", func() bool {
		return d.count(t, "") >= unique
	})
	r3.Stop(t)
	r3b.Stop(t)

	var rows, distinct int
	var sum int64
	if err := d.pool.QueryRow(context.Background(),
		`SELECT count(*), count(DISTINCT key), coalesce(sum(amount), 0) FROM `+d.effects).Scan(&rows, &distinct, &sum); err != nil {
		t.Fatal(err)
	}
	var done, failed int
	if err := d.pool.QueryRow(context.Background(), `SELECT count(*) FILTER (WHERE outcome = 'done'),
		count(*) FILTER (WHERE outcome <> 'done') FROM `+d.store.Table()).Scan(&done, &failed); err != nil {
		t.Fatal(err)
	}
	st2, st3, st3b := r2.Stats(), r3.Stats(), r3b.Stats()
	t.Logf("booked by run 1: %d, by run 2: %d, by run 3: %d", run1, run2-run1, rows-run2)
	t.Logf("run 2 %+v", st2)
	t.Logf("run 3 %+v and %+v", st3, st3b)
	if rows != unique || distinct != unique || sum != wantSum || done != unique || failed != 0 {
		t.Fatalf("ledger rows %d (distinct %d, sum %d), dedup rows done %d, failed %d; want %d rows, sum %d, no failures",
			rows, distinct, sum, done, failed, unique, wantSum)
	}
	if st2.DeadLettered+st3.DeadLettered+st3b.DeadLettered != 0 {
		t.Fatalf("dead letters: run 2 %d, run 3 %d and %d", st2.DeadLettered, st3.DeadLettered, st3b.DeadLettered)
	}

	// The crash redelivered messages whose effects the first consumer had
	// committed: the dedup rows are what kept them from applying twice.
	rows1, err := d.pool.Query(context.Background(), `SELECT seq FROM `+d.effects+` WHERE run = 1`)
	if err != nil {
		t.Fatal(err)
	}
	redelivered := 0
	mu.Lock()
	for rows1.Next() {
		var seq int
		if err := rows1.Scan(&seq); err != nil {
			t.Fatal(err)
		}
		if seen[2][seq] || seen[3][seq] {
			redelivered++
		}
	}
	mu.Unlock()
	rows1.Close()
	if err := rows1.Err(); err != nil {
		t.Fatal(err)
	}
	t.Logf("messages booked by the killed consumer and delivered again after the crash: %d", redelivered)
	if redelivered == 0 {
		t.Fatal("nothing the killed consumer had booked was redelivered: the crash did not land inside the offset-persist window")
	}
}
