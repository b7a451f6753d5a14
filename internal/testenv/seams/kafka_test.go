package seams_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime/pprof"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	kafkago "github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/idemkit/idem/adapters/kafka"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/pgstore"
	"github.com/idemkit/idem/dedup/redisfront"
	"github.com/idemkit/idem/effect"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/internal/testenv/kafkatest"
	"github.com/idemkit/idem/internal/testenv/retrytest"
)

// The Kafka mode (issue 37): each seed draws a configuration (config_test.go)
// and runs the real kafka.Source, consumer.Consumer and pgstore against a
// Kafka of its own — an in-process kfake cluster, or with
// IDEM_SEAMS_KAFKA=real the test environment's broker — so that retry
// topics, start offsets, generations and rebalances are the real code's.
// Its ops produce and re-send payments, crash processes in flight, and
// after a retry copy is durable and before the original's commit, lose a
// COMMIT's outcome, restart with a changed configuration, add and remove
// a second member, redrive dead letters (an operator's redrive through
// the idem command's plan too: operator_test.go) and flush the Redis
// front; after
// each the model checks that no payment was applied twice, and after the
// last that every payment not dead-lettered was applied once.

// kafkaSettle bounds a step's wait for its messages to settle, and the
// drain's: a hang, not a measure.
const kafkaSettle = time.Minute

// kpay is the model of one payment in the Kafka mode.
type kpay struct {
	id        string
	part      int
	tenant    string
	value     []byte
	poisoned  bool // the handler fails permanently for it, until a redrive fixes it
	flaky     int  // it fails transiently this many times first
	uncertain bool // the COMMITs of its first record's transactions are reported failed
	copies    int  // retry copies the consumer set out to write (one cut short may be durable)
	letters   int  // dead letters written
	// dead: its latest record was dead-lettered and not redriven since;
	// it need not be applied.
	dead     bool
	redrives int
	// the entity dimension: its account and version (entity_test.go)
	ent string
	ver int64
	// rkey is its record key: its ID, or with the parking dimension its
	// order, shared with other payments (parking_test.go)
	rkey string
}

// kproc is one consumer process: a kafka.Source and a Consumer on it.
type kproc struct {
	src    *kafka.Source
	cancel context.CancelFunc
	done   chan error
}

type kafkaRunner struct {
	t    testing.TB
	rep  *reporter
	cfg  config // the configuration the processes run now
	real bool

	brokers []string
	admin   *kafkatest.Admin
	topic   string
	group   string

	pool *pgxpool.Pool
	pg   *pgstore.Store
	// journal is the store's effect journal on a pool of its own: Do's
	// transactions must not wait for a connection the handlers' open
	// transactions hold.
	journal *pgstore.Store
	lying   *retrytest.LyingStore
	store   dedup.Store[pgx.Tx]
	front   *redisfront.Store[pgx.Tx]
	rdb     *redis.Client
	table   string
	// pgURL and schema are the store's, for the idem command
	// (operator_test.go).
	pgURL, schema string
	beh           *behaviour
	prov          *provider // the payment provider of the step dimension
	dlq           *dlq
	log           *slog.Logger

	mu     sync.Mutex
	pays   map[string]*kpay
	order  []string
	counts map[string]int

	procs [2]*kproc
	// crashArmed: the next retry copy written kills its process once the
	// copy is durable, before the original is committed; crashed names
	// the process it killed.
	crashArmed atomic.Bool
	crashed    chan int
	// freshNext: the next payment produced, with the entity dimension,
	// gets a version above every other, so that it is handled (an op that
	// needs its handler to fail)
	freshNext bool
	// The parking dimension (parking_test.go): holdsLost, a process
	// killed or a rebalance with in-memory holds; unordered, a
	// configuration without KeyOrdered ran; expired, the keys a
	// parked_too_long letter found past the limits, by their ParkedAt.
	holdsLost bool
	unordered bool
	expired   map[dedup.ParkKey]time.Time
	lastKill  time.Time // a process's last kill or a rebalance
}

func newKafkaRunner(t testing.TB, cfg config, rep *reporter) *kafkaRunner {
	r := &kafkaRunner{t: t, rep: rep, cfg: cfg, beh: newBehaviour(), dlq: &dlq{},
		pays: map[string]*kpay{}, counts: map[string]int{}, crashed: make(chan int, 2),
		expired: map[dedup.ParkKey]time.Time{}}
	r.prov = newProvider(cfg.step, rep.seed, rep, r.count)
	r.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	if os.Getenv("IDEM_TEST_LOG") != "" {
		r.log = testenv.Logger(t)
	}
	r.topic, r.group = topic, "seams"
	if os.Getenv("IDEM_SEAMS_KAFKA") == "real" {
		r.real = true
		r.brokers = testenv.KafkaBrokers(t)
		r.topic = fmt.Sprintf("seams-%d-%d-%d", rep.seed, os.Getpid(), time.Now().UnixNano()%1e6)
		r.group = r.topic
	} else {
		c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.GroupMinSessionTimeout(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		r.brokers = c.ListenAddrs()
	}
	r.admin = kafkatest.NewAdmin(t, r.brokers)
	r.admin.CreateTopic(t, r.topic, partitions)
	r.admin.CreateTopic(t, r.topic+".dlq", partitions)
	for _, d := range retryDelayPool {
		r.admin.CreateTopic(t, kafka.RetryTopic(r.topic, d), partitions)
	}
	r.precommit(r.group, r.topic)
	// The operator's redrive group (operator_test.go) starts at the first
	// letter, as a new group does; committed, because kfake answers an
	// offset fetch of a group it does not know with GROUP_ID_NOT_FOUND
	// where Kafka answers "no offset".
	r.precommit(r.redriveGroup(), r.topic+".dlq")

	ctx := context.Background()
	r.pool = pool(t)
	schema := testenv.Schema(t, r.pool)
	r.pgURL, r.schema = testenv.PostgresURL(t), schema
	pcfg := pgstore.Config{Schema: schema, LockTimeout: 2 * time.Second}
	if cfg.store == "pg-partitioned" {
		pcfg.PartitionWidth = 24 * time.Hour
	}
	st, err := pgstore.New(r.pool, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	r.pg = st
	if r.journal, err = pgstore.New(pool(t), pcfg); err != nil {
		t.Fatal(err)
	}
	r.lying = retrytest.NewLyingStore(st)
	r.store = r.lying
	r.table = pgx.Identifier{schema, "business"}.Sanitize()
	if _, err := r.pool.Exec(ctx, `CREATE TABLE `+r.table+` (id bigserial PRIMARY KEY, pay text NOT NULL,
		topic text NOT NULL, part int NOT NULL, off bigint NOT NULL, ent text NOT NULL DEFAULT '', ver bigint NOT NULL DEFAULT 0)`); err != nil {
		t.Fatal(err)
	}
	if cfg.redis {
		rds := testenv.NewPrivateRedis(t)
		r.rdb = redis.NewClient(&redis.Options{Addr: rds.Addr(), ContextTimeoutEnabled: true, DialTimeout: time.Second})
		t.Cleanup(func() { r.rdb.Close() })
		f, err := redisfront.New[pgx.Tx](st, redisfront.Config{Client: r.rdb, Logger: r.log,
			Timeout: 10 * time.Second, RetryAfter: time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		r.front, r.store = f, f
	}
	if cfg.park.memory && r.front == nil {
		r.store = heldInMemory{Store: r.lying, Watermarks: r.lying, Journal: r.lying}
	}
	r.start(0)
	return r
}

// precommit commits offset 0 of topic's partitions for group: the
// group has been running (with StartFrom LastOffset, a partition without
// a committed offset starts at its end, and skips what was produced
// before — the setting's documented meaning, not a hole). The product's
// own topics (retry topics) are left without one, as a new group has them.
func (r *kafkaRunner) precommit(group, topic string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var commits []kafkago.OffsetCommit
	for p := range partitions {
		commits = append(commits, kafkago.OffsetCommit{Partition: p, Offset: 0})
	}
	tr := &kafkago.Transport{}
	defer tr.CloseIdleConnections()
	c := &kafkago.Client{Addr: kafkago.TCP(r.brokers...), Transport: tr}
	for {
		res, err := c.OffsetCommit(ctx, &kafkago.OffsetCommitRequest{
			Addr: kafkago.TCP(r.brokers...), GroupID: group, GenerationID: -1,
			Topics: map[string][]kafkago.OffsetCommit{topic: commits},
		})
		if err == nil {
			for _, ps := range res.Topics {
				for _, p := range ps {
					if p.Error != nil {
						err = p.Error
					}
				}
			}
		}
		if err == nil {
			return
		}
		if ctx.Err() != nil {
			r.t.Fatalf("seams: commit %s's first offsets of %s: %v", group, topic, err)
		}
		time.Sleep(100 * time.Millisecond) // the coordinator is loading
	}
}

// start starts process i with the runner's configuration.
func (r *kafkaRunner) start(i int) {
	c := r.cfg
	kc := kafka.Config{
		Brokers: r.brokers, Topics: []string{r.topic}, Group: r.group,
		StartFrom: c.startFrom, RetryDelays: c.readDelays,
		MaxWait: 50 * time.Millisecond, RequestTimeout: 3 * time.Second, ReconnectBackoff: 200 * time.Millisecond,
		SessionTimeout: 6 * time.Second, HeartbeatInterval: 100 * time.Millisecond, RebalanceTimeout: 10 * time.Second,
		JoinGroupBackoff: 100 * time.Millisecond, PartitionWatchInterval: -1, CloseTimeout: 10 * time.Second,
		Logger: r.log,
	}
	if c.startAt {
		kc.StartOffsets = kafka.StoreOffsets(r.pg, consumerName)
	}
	src, err := kafka.New(kc)
	if err != nil {
		r.t.Fatalf("seams: %v: %v", c, err)
	}
	cc := consumer.Config[pgx.Tx]{
		Name: consumerName, Source: src, Store: r.store, Handler: r.handler(),
		DeadLetter: letterSink{r: r, src: src},
		Key:        c.keyFunc(), Tenant: c.tenantFunc(), KeyLanes: c.keyLanes, BatchSize: c.batch,
		Entity: c.entityFunc(), Stale: c.entity.stale,
		Retry:  consumer.RetryPolicy{Initial: time.Millisecond, Max: 5 * time.Millisecond, MaxAttempts: 5},
		Logger: r.log,
	}
	if c.offsets {
		cc.Offsets = r.pg
	}
	ctx, cancel := context.WithCancel(context.Background())
	if c.nonBlocking {
		depth, wait := c.park.limits(c.delays)
		cc.Retries = consumer.NonBlocking{Attempts: c.attempts, Delays: c.delays, KeyOrdered: c.keyOrdered,
			MaxParkedDepth: depth, MaxParkedWait: wait,
			Sink: copySink{r: r, src: src, slot: i, cancel: cancel}}
	}
	if !c.nonBlocking || !c.keyOrdered {
		r.unordered = true
	}
	cons, err := consumer.New(cc)
	if err != nil {
		cancel()
		r.t.Fatalf("seams: %v: %v", c, err)
	}
	done := make(chan error, 1)
	go func() { done <- cons.Run(ctx) }()
	r.procs[i] = &kproc{src: src, cancel: cancel, done: done}
}

// kill stops process i hard: what it has in flight rolls back.
func (r *kafkaRunner) kill(i int) {
	p := r.procs[i]
	if p == nil {
		return
	}
	r.parkedNow(context.Background(), "kills")
	p.cancel()
	select {
	case err := <-p.done:
		if err != nil && !errors.Is(err, context.Canceled) {
			r.rep.violation(checkConsumer, "run", "consumer %s stopped: %v", slotName(i), err)
		}
	case <-time.After(kafkaSettle):
		// The stacks say where it hangs.
		var stacks strings.Builder
		_ = pprof.Lookup("goroutine").WriteTo(&stacks, 2)
		r.t.Logf("goroutines:\n%s", stacks.String())
		r.t.Fatalf("seams: seed=%d mode=kafka step=%d: consumer %s did not stop", r.rep.seed, r.rep.stepNow(), slotName(i))
	}
	r.procs[i] = nil
}

func (r *kafkaRunner) stopAll() {
	for i := range r.procs {
		r.kill(i)
	}
}

// --- sinks and the handler ----------------------------------------------------

// copySink is the Source's RetrySink, watched: it counts each copy, and
// when the runner armed it, kills the process once the copy is durable
// and before the original's commit.
type copySink struct {
	r      *kafkaRunner
	src    *kafka.Source
	slot   int
	cancel context.CancelFunc // the process's
}

func (s copySink) Retry(ctx context.Context, l consumer.RetryLetter) error {
	// Counted before the write: a write cut short (the process killed in
	// flight) may have made the copy durable all the same.
	s.r.note(l.Message.Value, func(p *kpay) { p.copies++ })
	if err := s.src.Retry(ctx, l); err != nil {
		return err
	}
	if s.r.crashArmed.CompareAndSwap(true, false) {
		s.cancel() // the process dies here: the copy is durable, the original not committed
		s.r.crashed <- s.slot
		<-ctx.Done()
		return ctx.Err()
	}
	return nil
}

// letterSink is the Source's DeadLetter, watched.
type letterSink struct {
	r   *kafkaRunner
	src *kafka.Source
}

func (s letterSink) DeadLetter(ctx context.Context, l consumer.Letter) error {
	if err := s.src.DeadLetter(ctx, l); err != nil {
		return err
	}
	_ = s.r.dlq.DeadLetter(ctx, l)
	s.r.note(l.Message.Value, func(p *kpay) { p.letters++; p.dead = true })
	var pl payload
	_ = json.Unmarshal(l.Message.Value, &pl)
	s.r.prov.checkLetter(pl.Pay, l)
	if l.Cause == consumer.CauseParkedTooLong {
		s.r.checkParkedLetter(ctx, l)
	}
	if l.Cause == consumer.CauseStale {
		s.r.count("stale letters")
		// Not ctx: the sink runs in the consumer's lane, whose ctx a kill
		// ends; a query failing on it would end the lane's goroutine with
		// t.Fatal, and the consumer would never stop.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), kafkaSettle)
		defer cancel()
		s.r.checkStaleLetter(cctx, l)
	}
	return nil
}

// note applies f to the payment value carries.
func (r *kafkaRunner) note(value []byte, f func(*kpay)) {
	var pl payload
	_ = json.Unmarshal(value, &pl)
	r.mu.Lock()
	defer r.mu.Unlock()
	if p := r.pays[pl.Pay]; p != nil {
		f(p)
	}
}

func (r *kafkaRunner) handler() consumer.Handler[pgx.Tx] {
	return consumer.HandlerFunc[pgx.Tx](func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		var pl payload
		if err := json.Unmarshal(m.Value, &pl); err != nil || pl.Pay == "" {
			return consumer.Permanent(fmt.Errorf("bad payload %q: %v", m.Value, err))
		}
		if r.prov.cfg.on {
			// The charge first, as a handler would: its result goes with
			// the payment's row.
			if _, err := effect.Do(ctx, r.journal, m, r.prov.step(pl.Pay)); err != nil {
				return err
			}
		}
		if _, err := tx.Exec(ctx, `INSERT INTO `+r.table+` (pay, topic, part, off, ent, ver) VALUES ($1, $2, $3, $4, $5, $6)`,
			pl.Pay, m.Topic, m.Partition, m.Offset, pl.Ent, pl.Ver); err != nil {
			return err
		}
		r.mu.Lock()
		uncertain := r.pays[pl.Pay] != nil && r.pays[pl.Pay].uncertain
		r.mu.Unlock()
		if uncertain && m.Topic == r.topic {
			r.lying.AddTarget(m.Ref())
		}
		err, _ := r.beh.fault(pl.Pay, recID{})
		return err
	})
}

// --- producing ------------------------------------------------------------------

func (r *kafkaRunner) record(p *kpay) kafkago.Message {
	return kafkago.Message{Partition: p.part, Key: []byte(p.rkey), Value: p.value, Headers: []kafkago.Header{
		{Key: idemKeyHeader, Value: []byte(p.id)},
		{Key: tenantHeader, Value: []byte(p.tenant)},
	}}
}

func (r *kafkaRunner) produce(np newPay, uncertain bool) {
	pl := payload{Pay: np.id, Amount: np.amount}
	tenant := "t" + np.id[len(np.id)-1:]
	if r.cfg.entity.on {
		pl.Ent, pl.Ver = entityOf(r.rep.seed, np.id)
		if r.cfg.tenant == "header" {
			pl.Ent = tenant + "/" + pl.Ent // an entity is its tenant's: the watermark is per key scope
		}
		if r.freshNext {
			pl.Ver = 1 // newer than any of its entity's: it is handled
			for _, q := range r.pays {
				if q.ent == pl.Ent && q.ver >= pl.Ver {
					pl.Ver = q.ver + 1
				}
			}
		}
	}
	r.freshNext = false
	if r.cfg.entity.status {
		pl.At, pl.Status = statusOf(pl.Ver)
	}
	v, _ := json.Marshal(pl)
	rkey := np.id
	if r.cfg.park.on {
		rkey = orderOf(r.rep.seed, np.id) // an order's payments, on its partition
	}
	p := &kpay{id: np.id, part: int(partitionOf(rkey)), value: v, poisoned: np.poisoned, flaky: np.flaky,
		uncertain: uncertain && r.front == nil, tenant: tenant, ent: pl.Ent, ver: pl.Ver, rkey: rkey}
	r.mu.Lock()
	r.pays[p.id] = p
	r.order = append(r.order, p.id)
	r.mu.Unlock()
	r.beh.set(p.id, p.poisoned, p.flaky)
	r.admin.Produce(r.t, r.topic, r.record(p))
}

func (r *kafkaRunner) resend(pay string) {
	r.mu.Lock()
	p := r.pays[pay]
	r.mu.Unlock()
	r.admin.Produce(r.t, r.topic, r.record(p))
	r.count("resends")
}

func (r *kafkaRunner) count(what string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.counts[what]++
}

// --- settling and checking ------------------------------------------------------

// rows returns how often each payment was applied.
func (r *kafkaRunner) rows(ctx context.Context) map[string]int {
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
	return rows
}

// lag returns the partitions of topic whose group offset is behind their
// end (with the offset, -1 for none), "" when none is.
func (r *kafkaRunner) lag(ctx context.Context, topic string) string {
	hwm, err := r.admin.HighWatermarks(ctx, topic)
	if err != nil {
		return err.Error()
	}
	got, err := r.admin.Committed(ctx, r.group, topic)
	if err != nil || len(got) != len(hwm) {
		return fmt.Sprintf("committed offsets unreadable: %v", err)
	}
	var s []string
	for i := range hwm {
		if hwm[i] > 0 && got[i] < hwm[i] {
			s = append(s, fmt.Sprintf("%s/%d committed %d, end %d", topic, i, got[i], hwm[i]))
		}
	}
	return strings.Join(s, "; ")
}

// unsettled says what a step still waits for: a payment neither applied,
// dead-lettered nor in retry, or a record of the topic not committed; ""
// when nothing. final: the drain — every payment applied or
// dead-lettered, every retry topic committed too.
func (r *kafkaRunner) unsettled(ctx context.Context, final bool) string {
	rows := r.rows(ctx)
	var applied map[string][]int64
	if r.cfg.entity.on {
		applied = r.entityRows(ctx)
	}
	r.mu.Lock()
	var waiting []string
	for _, id := range r.order {
		p := r.pays[id]
		if rows[id] > 0 || p.dead || !final && p.copies > 0 {
			continue
		}
		if r.cfg.entity.on && staleNow(applied, p) {
			continue // stale: it will not apply (the lag below says whether it was read)
		}
		waiting = append(waiting, id)
	}
	r.mu.Unlock()
	if len(waiting) > 0 {
		return "payments not applied: " + strings.Join(waiting, " ")
	}
	topics := []string{r.topic}
	if final {
		for _, d := range r.cfg.readDelays {
			topics = append(topics, kafka.RetryTopic(r.topic, d))
		}
	}
	for _, tp := range topics {
		if l := r.lag(ctx, tp); l != "" {
			return l
		}
	}
	return ""
}

// settle waits until the step's messages are settled; false, with what
// is left, when they are not within d.
func (r *kafkaRunner) settle(ctx context.Context, final bool, d time.Duration) (bool, string) {
	deadline := time.Now().Add(d)
	for {
		left := r.unsettled(ctx, final)
		if left == "" {
			return true, ""
		}
		if time.Now().After(deadline) {
			return false, left
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// check: no payment applied twice; with final, every payment that is not
// dead-lettered applied.
func (r *kafkaRunner) check(ctx context.Context, final bool) {
	rows := r.rows(ctx)
	var applied map[string][]int64
	if r.cfg.entity.on {
		applied = r.entityRows(ctx)
		r.checkEntities(applied)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, id := range r.order {
		p := r.pays[id]
		n := rows[id]
		if final && n == 0 && !p.dead && r.cfg.entity.on && r.checkStaleRecorded(ctx, applied, p) {
			if r.prov.cfg.on && r.prov.executed(id) {
				r.rep.violation(checkStepApplied, id, "payment %s ended stale, its charge executed by the provider, and it was not dead-lettered: the charge is booked nowhere; %s", id, r.describe(ctx, p))
			}
			continue
		}
		switch {
		case n > 1 && p.copies > 0:
			r.rep.violation(checkRetryCopyOnce, id, "payment %s applied %d times; %s", id, n, r.describe(ctx, p))
		case n > 1:
			r.rep.violation(checkAppliedOnce, id, "payment %s applied %d times; %s", id, n, r.describe(ctx, p))
		case final && n == 0 && !p.dead && p.copies > 0:
			r.rep.violation(checkRetryCopyApplied, id, "payment %s went to retry and was never applied nor dead-lettered; %s", id, r.describe(ctx, p))
		case final && n == 0 && !p.dead:
			r.rep.violation(checkAckedApplied, id, "payment %s was never applied nor dead-lettered; %s", id, r.describe(ctx, p))
		}
		if !r.prov.cfg.on {
			continue
		}
		switch {
		case n > 0 && !r.prov.executed(id):
			r.rep.violation(checkStepApplied, id, "payment %s applied %d times, its charge never executed by the provider; %s", id, n, r.describe(ctx, p))
		case final && n == 0 && !p.dead && r.prov.succeeded(id):
			r.rep.violation(checkStepApplied, id, "payment %s: its charge succeeded, and it was neither applied nor dead-lettered; %s", id, r.describe(ctx, p))
		}
	}
}

// resolveInDoubt is an operator resolving pay's steps in doubt before a
// redrive, with what the provider says happened.
func (r *kafkaRunner) resolveInDoubt(ctx context.Context, pay string) {
	if !r.prov.cfg.on {
		return
	}
	n, err := r.prov.resolveInDoubt(ctx, r.journal, pay)
	if err != nil {
		r.t.Fatalf("seams: seed=%d mode=kafka step=%d: resolve the steps of %s in doubt: %v", r.rep.seed, r.rep.stepNow(), pay, err)
	}
	for range n {
		r.count("steps in doubt resolved")
	}
}

// describe says what the model and the database know of a payment; r.mu
// is held.
func (r *kafkaRunner) describe(ctx context.Context, p *kpay) string {
	var parts []string
	for _, x := range []struct {
		on   bool
		what string
	}{{p.poisoned, "poisoned"}, {p.flaky > 0, fmt.Sprintf("flaky %d", p.flaky)}, {p.uncertain, "COMMIT outcome lost"},
		{p.copies > 0, fmt.Sprintf("%d retry copies", p.copies)}, {p.letters > 0, fmt.Sprintf("%d dead letters", p.letters)},
		{p.redrives > 0, fmt.Sprintf("%d redrives", p.redrives)}} {
		if x.on {
			parts = append(parts, x.what)
		}
	}
	res, err := r.pool.Query(ctx, `SELECT topic, part, off FROM `+r.table+` WHERE pay = $1 ORDER BY id`, p.id)
	if err == nil {
		for res.Next() {
			var tp string
			var part int
			var off int64
			if res.Scan(&tp, &part, &off) == nil {
				parts = append(parts, fmt.Sprintf("applied from %s/%d/%d", tp, part, off))
			}
		}
		res.Close()
	}
	var keys []string
	if kr, err := r.pool.Query(ctx, `SELECT scope || ' ' || key || ' ' || outcome FROM `+r.pg.Table()+` WHERE key LIKE '%' || $1 || '%'`, p.id); err == nil {
		for kr.Next() {
			var s string
			if kr.Scan(&s) == nil {
				keys = append(keys, s)
			}
		}
		kr.Close()
	}
	sort.Strings(keys)
	if len(keys) > 0 {
		parts = append(parts, "key rows: "+strings.Join(keys, ", "))
	}
	if r.prov.cfg.on {
		parts = append(parts, r.prov.describe(p.id))
	}
	return strings.Join(parts, "; ")
}

// run applies ops one by one, settling and checking after each, then
// drains with the last configuration and checks that nothing was lost.
func (r *kafkaRunner) run(ctx context.Context, ops []kop) {
	trace := os.Getenv("IDEM_SEAMS_TRACE") != ""
	for i, o := range ops {
		r.rep.at(i+1, o.String())
		if trace {
			r.t.Logf("step %d: %v", i+1, o)
		}
		o.apply(ctx, r)
		if ok, left := r.settle(ctx, false, kafkaSettle); !ok {
			r.t.Fatalf("seams: seed=%d mode=kafka step=%d [%v]: not settled after %v: %s\n\tconfig: %v\n\treplay: go test -race -count=1 ./internal/testenv/seams/ -run 'TestSeamsKafka/^seed=%d$' -seams.seed=%d",
				r.rep.seed, i+1, o, kafkaSettle, left, r.cfg, r.rep.seed, r.rep.seed)
		}
		r.check(ctx, false)
	}
	r.rep.at(len(ops)+1, "drain")
	r.crashArmed.Store(false)
	// Copies wait out their delays, and may go to retry again: wait for
	// the longest run of trips, then some.
	wait := 20 * time.Second
	for _, d := range r.cfg.readDelays {
		wait += 3 * d
	}
	ok, left := r.settle(ctx, true, wait)
	r.check(ctx, true)
	r.checkKeyOrder(ctx)
	if ok {
		r.checkReleased(ctx)
	}
	switch {
	case ok, strings.HasPrefix(left, "payments not applied"): // those the check reported
	case strings.Contains(left, ".retry."):
		r.rep.violation(checkRetryTopicRead, "drain", "a retry topic not read to its end after %v: %s", wait, left)
	default:
		r.rep.violation(checkDrained, "drain", "not drained after %v: %s", wait, left)
	}
	r.stopAll()
	r.mu.Lock()
	keys := make([]string, 0, len(r.counts))
	for k := range r.counts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	fmt.Fprintf(&b, "%d payments", len(r.pays))
	for _, k := range keys {
		fmt.Fprintf(&b, ", %s %d", k, r.counts[k])
	}
	r.mu.Unlock()
	r.t.Logf("seams: seed=%d mode=kafka: %s; COMMITs reported failed %d; config at the end: %v", r.rep.seed, b.String(), r.lying.Lies(), r.cfg)
}

func TestSeamsKafka(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Postgres")
	}
	testenv.PostgresURL(t)
	expect := expectHolesOf("37")
	found := &findings{}
	seeds := seedList(t)
	if *seedFlag == 0 && *seedsFlag == "" && os.Getenv("IDEM_SEAMS_SEEDS") == "" {
		seeds = kafkaFixedSeeds
	}
	start := time.Now()
	for _, seed := range seeds {
		cfg := kafkaSeedConfig(seed)
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			t.Parallel()
			rep := newReporter(t, seed, "kafka", expect, found)
			rep.config, rep.drawn = cfg.String(), cfg.String()
			newKafkaRunner(t, cfg, rep).run(context.Background(), generateKafka(seed, cfg, steps(14)))
		})
	}
	t.Cleanup(func() {
		t.Logf("seams kafka: %v; checks that failed, by seed:\n%s", time.Since(start).Round(time.Millisecond), found.summary())
		if expect {
			expectHoles(t, found, hole37x1, hole37x2)
		}
	})
}
