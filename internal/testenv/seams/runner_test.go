package seams_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/pgstore"
	"github.com/idemkit/idem/dedup/redisfront"
	"github.com/idemkit/idem/internal/testenv"
)

// consumerName is the consumers' Name: the scope of their keys.
const consumerName = "pay"

// settleTimeout bounds the wait for a step's messages to be settled: a
// hang, not a measure.
const settleTimeout = time.Minute

// runner runs a sequence of ops against real Postgres (and Redis) with two
// consumer processes, A and B, sharing the partitions, and checks the
// model after every op.
type runner struct {
	t    testing.TB
	mode mode
	rep  *reporter
	seq  atomic.Int64 // deliveries and releases, in one order

	b   *broker
	dlq *dlq
	mo  *model
	beh *behaviour

	pool  *pgxpool.Pool
	pg    *pgstore.Store
	store dedup.Store[pgx.Tx] // pg, or the Redis front over it
	front *redisfront.Store[pgx.Tx]
	rds   *testenv.PrivateRedis
	snap  string // the last Redis snapshot, "" before the first
	rdb   *redis.Client
	table string // the handler's business table

	procs   [2]*process
	owner   [partitions]int // partition → consumer
	holding *heldTx         // the transaction held open, during opHeld
	log     *slog.Logger
}

// process is one consumer process: a Consumer over its member of the group.
type process struct {
	m      *member
	cancel context.CancelFunc
	done   chan error
}

func newRunner(t testing.TB, m mode, rep *reporter) *runner {
	r := &runner{t: t, mode: m, rep: rep, dlq: &dlq{}, mo: newModel(), beh: newBehaviour()}
	r.b = newBroker(partitions, &r.seq)
	r.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	if os.Getenv("IDEM_TEST_LOG") != "" {
		r.log = testenv.Logger(t)
	}
	ctx := context.Background()
	r.pool = pool(t)
	schema := testenv.Schema(t, r.pool)
	st, err := pgstore.New(r.pool, pgstore.Config{Schema: schema, LockTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	r.pg, r.store = st, st
	r.table = pgx.Identifier{schema, "business"}.Sanitize()
	if _, err := r.pool.Exec(ctx, `CREATE TABLE `+r.table+` (id bigserial PRIMARY KEY, pay text NOT NULL,
		part int NOT NULL, off bigint NOT NULL, value text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	if m.redis {
		r.rds = testenv.NewPrivateRedis(t)
		// The front's client as an application has it: go-redis's own
		// retries of a broken connection.
		r.rdb = redis.NewClient(&redis.Options{Addr: r.rds.Addr(), ContextTimeoutEnabled: true, DialTimeout: time.Second})
		t.Cleanup(func() { r.rdb.Close() })
		f, err := redisfront.New[pgx.Tx](st, redisfront.Config{Client: r.rdb, Logger: r.log,
			Timeout: 10 * time.Second, RetryAfter: time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		r.front, r.store = f, f
	}
	for p := range partitions {
		r.owner[p] = p % 2
	}
	r.start(0)
	r.start(1)
	return r
}

// consumerConfig is the mode's consumer over source m.
func (r *runner) consumerConfig(m *member) consumer.Config[pgx.Tx] {
	cfg := consumer.Config[pgx.Tx]{
		Name: consumerName, Source: m, Store: r.store, Handler: r.beh.handler(r.table), DeadLetter: r.dlq,
		KeyLanes: r.mode.keyLanes, BatchSize: 8, Logger: r.log, Clock: consumertest.NewClock(),
		Retry: consumer.RetryPolicy{MaxAttempts: 5},
	}
	switch r.mode.key {
	case "msgid":
		cfg.Key = consumer.ByMessageID()
	case "business":
		cfg.Key = consumer.ByJSONField("pay")
	}
	if r.mode.offsets {
		cfg.Offsets = r.pg
	}
	return cfg
}

// start starts consumer i's process, holding the partitions it owns.
func (r *runner) start(i int) {
	m := newMember(r.b, slotName(i))
	for p, o := range r.owner {
		if o == i {
			m.take(int32(p))
		}
	}
	c, err := consumer.New(r.consumerConfig(m))
	if err != nil {
		r.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	r.procs[i] = &process{m: m, cancel: cancel, done: done}
}

// kill stops consumer i's process hard: what it has in flight rolls back.
func (r *runner) kill(i int) {
	p := r.procs[i]
	p.cancel()
	if err := <-p.done; err != nil && !errors.Is(err, context.Canceled) {
		r.rep.violation(checkConsumer, "run", "consumer %s stopped: %v", slotName(i), err)
	}
	p.m.abandon()
	if n := p.m.pending.Load(); n != 0 {
		r.rep.violation(checkConsumer, "settle", "consumer %s returned from Run with %d messages neither acknowledged nor released", slotName(i), n)
	}
}

func (r *runner) restart(i int) {
	r.kill(i)
	r.start(i)
}

// stop stops both processes gracefully at the end of the run.
func (r *runner) stop() {
	for i, p := range r.procs {
		p.cancel()
		if err := <-p.done; err != nil && !errors.Is(err, context.Canceled) {
			r.rep.violation(checkConsumer, "run", "consumer %s stopped: %v", slotName(i), err)
		}
	}
}

// settle waits until every message handed to a consumer was acknowledged
// or released.
func (r *runner) settle() {
	deadline := time.Now().Add(settleTimeout)
	for {
		left := r.procs[0].m.pending.Load() + r.procs[1].m.pending.Load()
		if left == 0 {
			return
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("seams: seed=%d mode=%s step=%d: %d messages not settled after %v", r.rep.seed, r.mode.name, r.rep.stepNow(), left, settleTimeout)
		}
		time.Sleep(time.Millisecond)
	}
}

// run applies ops one by one, settling and checking after each.
func (r *runner) run(ctx context.Context, ops []op) {
	for i, o := range ops {
		r.rep.at(i+1, o.String())
		if os.Getenv("IDEM_SEAMS_TRACE") != "" {
			r.t.Logf("step %d: %v", i+1, o)
		}
		o.apply(ctx, r)
		r.settle()
		r.check(ctx)
		if r.front != nil && os.Getenv("IDEM_SEAMS_TRACE") == "redis" {
			keys, _ := r.rdb.Keys(ctx, "*").Result()
			sort.Strings(keys)
			r.t.Logf("  front %+v; redis keys %q", r.front.Stats(), keys)
		}
	}
	r.rep.at(len(ops)+1, "drain")
	r.drain(ctx)
	r.check(ctx)
	r.stop()
	r.t.Logf("seams: seed=%d mode=%s: %s", r.rep.seed, r.mode.name, r.mo.summary())
}

// drain restarts both consumers and delivers every partition to its end,
// without faults.
func (r *runner) drain(ctx context.Context) {
	r.restart(0)
	r.restart(1)
	for range 5 {
		r.deliver(-1, 1<<20, 1)
		r.settle()
		done := true
		for p := range int32(partitions) {
			r.b.mu.Lock()
			if r.b.committed[p] < int64(len(r.b.logs[p])) {
				done = false
			}
			r.b.mu.Unlock()
		}
		if done {
			return
		}
		r.restart(0) // a new owner starts at the committed offset
		r.restart(1)
	}
	r.b.mu.Lock()
	defer r.b.mu.Unlock()
	for p := range partitions {
		if c, end := r.b.committed[p], int64(len(r.b.logs[p])); c < end {
			r.rep.violation(checkDrained, fmt.Sprint(p), "partition %d: committed offset %d, log end %d after draining", p, c, end)
		}
	}
}

// check compares the database with the model.
func (r *runner) check(ctx context.Context) {
	rows := map[string]int{}
	res, err := r.pool.Query(ctx, `SELECT pay, count(*) FROM `+r.table+` GROUP BY pay`)
	if err != nil {
		r.t.Fatal(err)
	}
	for res.Next() {
		var pay string
		var n int
		if err := res.Scan(&pay, &n); err != nil {
			r.t.Fatal(err)
		}
		rows[pay] = n
	}
	if err := res.Err(); err != nil {
		r.t.Fatal(err)
	}
	r.mo.checkApplied(r.rep, rows, r.b.records(), r.dlq.dead())
}

// --- producing --------------------------------------------------------------

type payload struct {
	Pay    string `json:"pay"`
	Amount int    `json:"amount"`
	// the entity dimension's account and version (entity_test.go)
	Ent string `json:"ent,omitempty"`
	Ver int64  `json:"ver,omitempty"`
	// the status variant's time and status, for Ver (statusOf)
	At     int64  `json:"at,omitempty"`
	Status string `json:"status,omitempty"`
}

func (r *runner) produce(np newPay) {
	v, _ := json.Marshal(payload{Pay: np.id, Amount: np.amount})
	part := partitionOf(np.id)
	rec := r.b.append(part, []byte(np.id), v, nil, np.id, false)
	r.mo.add(&payment{id: np.id, part: part, value: v, first: rec.id, poisoned: np.poisoned})
	r.beh.set(np.id, np.poisoned, np.flaky)
}

func (r *runner) resend(pay string, conflict bool) {
	p := r.mo.pays[pay]
	v := p.value
	if conflict {
		var pl payload
		_ = json.Unmarshal(v, &pl)
		pl.Amount += 1000
		v, _ = json.Marshal(pl)
	}
	r.b.append(p.part, []byte(pay), v, nil, pay, false)
	r.mo.count("resends")
}

// --- delivering -------------------------------------------------------------

// deliver has consumer only (-1: both) deliver up to max records of each
// partition it owns, partitions interleaved at random.
func (r *runner) deliver(only, max int, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 1))
	for i, p := range r.procs {
		if only >= 0 && i != only {
			continue
		}
		var runs [][]*consumer.Message
		for part, o := range r.owner {
			if o == i {
				runs = append(runs, p.m.fetch(int32(part), 1+rng.IntN(max)))
			}
		}
		p.m.send(interleave(rng, runs))
	}
}

func (r *runner) crashAfterCommit(i, max int, seed uint64) {
	m := r.procs[i].m
	m.mu.Lock()
	m.loseAcks = true
	m.mu.Unlock()
	r.deliver(i, max, seed)
	r.settle()
	r.restart(i)
	r.mo.count("crashes after commit")
}

// rebalance moves partition p to the other consumer, which starts at the
// committed offset; a zombie old owner delivers what it fetched before.
func (r *runner) rebalance(p int32, zombie int) {
	from := r.owner[p]
	to := 1 - from
	old, nw := r.procs[from].m, r.procs[to].m
	var late []*consumer.Message
	if zombie > 0 {
		late = old.fetch(p, zombie)
	}
	old.drop(p)
	nw.take(p)
	r.owner[p] = to
	nw.send(nw.fetch(p, zombie+2))
	if len(late) > 0 {
		old.send(late)
		r.mo.count("zombie deliveries")
	}
	r.mo.count("rebalances")
}

func (r *runner) rewind(p int32, k int64) {
	r.procs[r.owner[p]].m.rewind(p, k)
	r.deliver(r.owner[p], int(k)+1, uint64(k))
	r.mo.count("rewinds")
}

// heldTx is a transaction held open by opHeld.
type heldTx struct {
	owner int
	gate  *gate
}

// held delivers n records of partition p, holds the last one's transaction
// open while during runs, then lets it go.
func (r *runner) held(ctx context.Context, p int32, n int, during op) {
	owner := r.owner[p]
	m := r.procs[owner].m
	msgs := m.fetch(p, n)
	if len(msgs) == 0 {
		during.apply(ctx, r) // nothing to hold: the op alone
		return
	}
	last := msgs[len(msgs)-1]
	g := r.beh.hold(recID{p, last.Offset})
	r.holding = &heldTx{owner: owner, gate: g}
	m.send(msgs)
	// The handler of the last message may not run (a duplicate): then
	// nothing is held once the messages settled.
	deadline := time.Now().Add(settleTimeout)
	for !g.isEntered() && m.pending.Load() > 0 {
		if time.Now().After(deadline) {
			r.t.Fatalf("seams: seed=%d mode=%s step=%d: the held message was neither handled nor settled", r.rep.seed, r.mode.name, r.rep.stepNow())
		}
		time.Sleep(time.Millisecond)
	}
	if g.isEntered() {
		r.mo.count("held transactions")
	}
	during.apply(ctx, r)
	r.beh.unhold(g)
	r.holding = nil
}

// crashHeld kills the process whose transaction is held: it rolls back.
func (r *runner) crashHeld() {
	if r.holding == nil {
		return
	}
	r.restart(r.holding.owner)
	r.mo.count("crashes before commit")
}

// --- operators --------------------------------------------------------------

// keyOf is the dedup key the mode's consumer claims for a payment's first
// record.
func (r *runner) keyOf(p *payment) dedup.Key {
	if r.mode.key == "msgid" {
		return dedup.Key{Scope: consumerName, ID: p.first.String()}
	}
	return dedup.Key{Scope: consumerName, ID: p.id}
}

func (r *runner) fix(p *payment) {
	p.poisoned = false
	r.beh.fix(p.id)
}

func (r *runner) releaseFailed(ctx context.Context, pay string) {
	p := r.mo.pays[pay]
	r.fix(p)
	rows, err := r.pg.Admin().Release(ctx, []dedup.Key{r.keyOf(p)}, false)
	if err != nil {
		r.t.Fatalf("release: %v", err)
	}
	if len(rows) > 0 {
		r.mo.count("failed keys released")
	}
}

// releaseDone reverts a payment's effect and deletes its done key row, in
// one transaction, through the Redis front's Release when there is one.
// A row a held transaction has locked is left alone (the operator's
// statement would wait; this one gives up).
func (r *runner) releaseDone(ctx context.Context, pay string) {
	key := dedup.Key{Scope: consumerName, ID: pay}
	deleted := false
	errNothing := errors.New("no done row")
	deleteRows := func(ctx context.Context) error {
		return pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '500ms'`); err != nil {
				return err
			}
			tag, err := tx.Exec(ctx, `DELETE FROM `+r.pg.Table()+` WHERE scope = $1 AND key = $2 AND outcome = 'done'`, key.Scope, key.ID)
			if err != nil {
				return err
			}
			if tag.RowsAffected() == 0 {
				return errNothing
			}
			if _, err := tx.Exec(ctx, `DELETE FROM `+r.table+` WHERE pay = $1`, pay); err != nil {
				return err
			}
			deleted = true
			return nil
		})
	}
	var err error
	if r.front != nil {
		err = r.front.Release(ctx, []dedup.Key{key}, deleteRows)
	} else {
		err = deleteRows(ctx)
	}
	if deleted {
		r.mo.pays[pay].resetSeq = r.seq.Add(1)
		r.mo.count("done keys released")
	} else if err != nil && !errors.Is(err, errNothing) && !isLockTimeout(err) {
		r.t.Fatalf("release %s: %v", pay, err)
	}
}

func isLockTimeout(err error) bool {
	var pe interface{ SQLState() string }
	return errors.As(err, &pe) && pe.SQLState() == "55P03"
}

// redisOp does something to the Redis front's server, then waits until
// the front's client reaches it again.
func (r *runner) redisOp(ctx context.Context, what string) {
	if r.rds == nil {
		return
	}
	var err error
	switch what {
	case "snapshot": // a backup, which restore brings back
		r.snap, err = r.rds.Snapshot()
	case "restore": // the backup (or a replica promoted from an old state); empty without one
		err = r.rds.Restart(r.snap)
	case "flush":
		_, err = r.rds.Do("FLUSHALL")
	case "restart": // empty
		err = r.rds.Restart("")
	case "restart-persist": // from the data saved on the way down
		err = r.rds.RestartSaved()
	}
	if err != nil {
		r.t.Fatalf("redis %s: %v", what, err)
	}
	testenv.WaitUntil(r.t, 10*time.Second, "the front's Redis client reaches the server", func() bool {
		return r.rdb.Ping(ctx).Err() == nil
	})
	r.mo.count("redis " + what)
}

// --- the handler ------------------------------------------------------------

var (
	errPoisoned = errors.New("seams: the payment's account is broken")
	errFlaky    = errors.New("seams: the ledger timed out")
)

// behaviour is what the handler does for each payment: apply it (a row in
// the business table), fail permanently (poisoned), fail transiently a few
// times first (flaky), or wait inside its transaction (a held gate).
type behaviour struct {
	mu       sync.Mutex
	poisoned map[string]bool
	flaky    map[string]int
	gate     *gate
}

func newBehaviour() *behaviour {
	return &behaviour{poisoned: map[string]bool{}, flaky: map[string]int{}}
}

func (b *behaviour) set(pay string, poisoned bool, flaky int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.poisoned[pay], b.flaky[pay] = poisoned, flaky
}

func (b *behaviour) fix(pay string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.poisoned[pay] = false
}

// gate holds the handler of one record inside its transaction.
type gate struct {
	at      recID
	entered chan struct{}
	open    chan struct{}
	once    sync.Once
}

func (g *gate) isEntered() bool {
	select {
	case <-g.entered:
		return true
	default:
		return false
	}
}

func (b *behaviour) hold(at recID) *gate {
	g := &gate{at: at, entered: make(chan struct{}), open: make(chan struct{})}
	b.mu.Lock()
	b.gate = g
	b.mu.Unlock()
	return g
}

func (b *behaviour) unhold(g *gate) {
	b.mu.Lock()
	if b.gate == g {
		b.gate = nil
	}
	b.mu.Unlock()
	close(g.open)
}

// fault says how the handler treats pay now, and returns the gate that
// holds this message, if one does.
func (b *behaviour) fault(pay string, at recID) (error, *gate) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var g *gate
	if b.gate != nil && b.gate.at == at && !b.gate.isEntered() {
		g = b.gate
	}
	switch {
	case b.poisoned[pay]:
		return consumer.Permanent(errPoisoned), g
	case b.flaky[pay] > 0:
		b.flaky[pay]--
		return consumer.Retryable(errFlaky), g
	}
	return nil, g
}

func (b *behaviour) handler(table string) consumer.Handler[pgx.Tx] {
	return consumer.HandlerFunc[pgx.Tx](func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		var pl payload
		if err := json.Unmarshal(m.Value, &pl); err != nil || pl.Pay == "" {
			return consumer.Permanent(fmt.Errorf("bad payload %q: %v", m.Value, err))
		}
		if _, err := tx.Exec(ctx, `INSERT INTO `+table+` (pay, part, off, value) VALUES ($1, $2, $3, $4)`,
			pl.Pay, m.Partition, m.Offset, string(m.Value)); err != nil {
			return err
		}
		ferr, g := b.fault(pl.Pay, recID{m.Partition, m.Offset})
		if g != nil {
			g.once.Do(func() { close(g.entered) })
			select {
			case <-g.open:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return ferr
	})
}
