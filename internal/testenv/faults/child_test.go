package faults_test

// The child process: this test binary, re-executed with childEnv set to a
// JSON childSpec, runs the payments consumer instead of the tests. Its
// failpoints wrap the Source, the Store and the handler; the engine has
// none.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"runtime/metrics"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/adapters/kafka"
	"github.com/idemkit/idem/adapters/rocketmq"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/source"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/pgstore"
	"github.com/idemkit/idem/examples/payments"
)

const childEnv = "IDEM_FAULTS_CHILD"

// childSpec is what one child consumes and how it misbehaves.
type childSpec struct {
	Broker  string   // "kafka", "kafka-cluster", "rocketmq" or "rocketmq-cluster"
	Brokers []string // Kafka brokers or RocketMQ name servers
	Topic   string
	Group   string

	PgURL  string
	Schema string // holds the payments tables, the audit table and idem's dedup table
	App    string // application_name of the consumer's connections

	Tenants    bool // the tenant header is part of the key's scope; tenant tables in Schema_<tenant>
	BatchSize  int
	Attempts   int           // Retry.MaxAttempts; default 10, the consumer's default
	MaxElapsed time.Duration // Retry.MaxElapsed; default 2m, the consumer's default
	Grace      time.Duration // SIGTERM: how long Stop may take
	StatsFile  string        // where the child writes its counters
	AckLog     string        // where the child records every message it acks: "lane partition offset" lines
	Fail       failpoints
	KafkaClose time.Duration // kafka.Config.CloseTimeout
	StopLane   bool          // consumer.StopLaneOnExhausted instead of dead-lettering
	Orderly    bool          // RocketMQ orderly mode
	Reconsume  int           // rocketmq.Config.MaxReconsumeTimes; default the adapter's
	KeyLanes   int           // consumer.Config.KeyLanes
	Offsets    bool          // consumer.Config.Offsets: offsets in the store, business keys beside them
	// RetryDelays, when set, make the child's retries NonBlocking: the
	// source's Config.RetryDelays (kafka, rocketmq) and NonBlocking.Delays
	// (the retry topics exist), NonBlocking.Attempts RetryAttempts (0: the
	// default 3).
	RetryDelays   []time.Duration
	RetryAttempts int
	KeyOrdered    bool // NonBlocking.KeyOrdered (with RetryDelays)
	// NoParking hides the store's dedup.Parking from the consumer: it
	// keeps KeyOrdered's holds in its memory (scenario 25's control).
	NoParking bool
}

// failpoints are the faults a child injects into itself. Keys are txn_ids.
type failpoints struct {
	// KillInAck: SIGKILL inside Source.Ack once this many messages were
	// acked — after their database commit, before the offset commit.
	KillInAck int
	// KillWithKey: SIGKILL before COMMIT of the transaction whose handler
	// applied this key (with SlowKeys, a transaction open for longer than
	// RocketMQ's 5-second offset persistence).
	KillWithKey string
	// CommitLostEvery: every n-th transaction commits for real, then reports
	// a lost connection (the outcome is unknown to the consumer).
	CommitLostEvery int
	// RollbackLostEvery: every n-th transaction (not one of CommitLostEvery)
	// loses its connection before COMMIT reaches the server: rolled back,
	// and a real pgx connection error.
	RollbackLostEvery int

	PanicOnce   []string // panic on the first attempt only
	PanicAlways []string
	Transient   []string // always a Retryable error: retries are used up
	// Outage: a Retryable error for these keys for as long as the file
	// OutageOver does not exist (the parent creates it when the outage
	// ends; it survives a SIGKILL and a restart).
	Outage     []string
	OutageOver string
	Constraint []string // a CHECK violation after the effects, returned
	Swallowed  []string // a CHECK violation after the effects, swallowed: COMMIT becomes ROLLBACK

	Slow     time.Duration // every handler call sleeps this long
	SlowKeys []string      // only these keys sleep SlowFor
	SlowFor  time.Duration
}

// childStats is what a child reports in its stats file.
type childStats struct {
	Pid          int
	Stats        consumer.Stats
	Acked        int64
	Txs          int64
	CommitLost   int64 // transactions that committed and reported a lost connection
	RollbackLost int64 // transactions that lost their connection before COMMIT
	Panics       int64
	OffsetSkips  int64 // duplicates skipped by the stored offsets (no key claimed), with Offsets
	StopErr      string
	StopTook     time.Duration
	Stopped      bool
	// Lanes is the source's report of its lanes (consumer.Health.Lanes),
	// refreshed every second: a lane that stalls acks nothing.
	Lanes []source.LaneStatus
	// The process, refreshed every second with Lanes (make soak samples
	// them): its goroutines, its heap (runtime/metrics: heap objects
	// bytes), its pool's open connections and the 99th percentile of the
	// last handlerWindow handler calls (inside the transaction).
	Goroutines int
	HeapBytes  uint64
	PoolConns  int32
	HandlerP99 time.Duration
}

// childState is the child's counters, written to the stats file.
type childState struct {
	spec  *childSpec
	c     *consumer.Consumer[pgx.Tx]
	mu    sync.Mutex
	acked atomic.Int64
	txs   atomic.Int64
	lost  atomic.Int64
	rlost atomic.Int64
	pan   atomic.Int64
	skips atomic.Int64
	lanes []source.LaneStatus // the last report, under mu
	pool  *pgxpool.Pool
	proc  struct {
		goroutines int
		heap       uint64
		conns      int32
		p99        time.Duration
	} // the last sample, under mu
	calls handlerTimes
	stop  struct {
		err     string
		took    time.Duration
		stopped bool
	}
}

// write writes the counters atomically (temp file and rename), so that the
// parent never reads half a file, even after a SIGKILL.
func (s *childState) write() {
	if s.spec.StatsFile == "" {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	st := childStats{Pid: os.Getpid(), Acked: s.acked.Load(), Txs: s.txs.Load(), CommitLost: s.lost.Load(),
		RollbackLost: s.rlost.Load(), Panics: s.pan.Load(), OffsetSkips: s.skips.Load(),
		StopErr: s.stop.err, StopTook: s.stop.took, Stopped: s.stop.stopped}
	if s.c != nil {
		st.Stats = s.c.Stats()
	}
	st.Lanes = s.lanes
	st.Goroutines, st.HeapBytes, st.PoolConns, st.HandlerP99 = s.proc.goroutines, s.proc.heap, s.proc.conns, s.proc.p99
	b, _ := json.Marshal(st)
	tmp := s.spec.StatsFile + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err == nil {
		_ = os.Rename(tmp, s.spec.StatsFile)
	}
}

// report writes the stats with the source's lane report (when it has one)
// and a sample of the process every second until ctx ends.
func (s *childState) report(ctx context.Context, src source.Source) {
	lanesOf := src.Describe().Lanes
	heap := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		var lanes []source.LaneStatus
		if lanesOf != nil {
			lanes = lanesOf()
		}
		metrics.Read(heap)
		g, p99 := runtime.NumGoroutine(), s.calls.p99()
		s.mu.Lock()
		s.lanes = lanes
		s.proc.goroutines, s.proc.p99 = g, p99
		if heap[0].Value.Kind() == metrics.KindUint64 {
			s.proc.heap = heap[0].Value.Uint64()
		}
		if s.pool != nil {
			s.proc.conns = s.pool.Stat().TotalConns()
		}
		s.mu.Unlock()
		s.write()
	}
}

// handlerWindow is how many of the last handler calls HandlerP99 is of.
const handlerWindow = 1024

// handlerTimes keeps how long the last handlerWindow handler calls took.
type handlerTimes struct {
	mu sync.Mutex
	d  [handlerWindow]time.Duration
	n  int // calls recorded, all time
}

func (h *handlerTimes) add(d time.Duration) {
	h.mu.Lock()
	h.d[h.n%handlerWindow] = d
	h.n++
	h.mu.Unlock()
}

// p99 is the 99th percentile of the calls kept, 0 before the first.
func (h *handlerTimes) p99() time.Duration {
	h.mu.Lock()
	ds := slices.Clone(h.d[:min(h.n, handlerWindow)])
	h.mu.Unlock()
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	return ds[(len(ds)*99+99)/100-1] // the ceil(0.99n)-th
}

// leakEnv is a test-only knob of the child: IDEM_SOAK_LEAK=N leaks N
// goroutines and N×64 KiB of memory (written, so resident) every minute,
// for make soak to show that its growth check fails on a leak.
const leakEnv = "IDEM_SOAK_LEAK"

// leaked holds what leak leaks.
var leaked [][]byte

// leak leaks n goroutines and n×64 KiB every minute until the process
// ends.
func leak(n int) {
	for range time.Tick(time.Minute) {
		for range n {
			go func() { select {} }()
			b := make([]byte, 64<<10)
			for i := range b {
				b[i] = 1
			}
			leaked = append(leaked, b)
		}
	}
}

func die() {
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // SIGKILL cannot be caught; wait for it
}

func (spec *childSpec) run() error {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	st := &childState{spec: spec}
	ctx := context.Background()

	cfg, err := pgxpool.ParseConfig(spec.PgURL)
	if err != nil {
		return err
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = spec.App
	cfg.ConnConfig.RuntimeParams["search_path"] = spec.Schema
	cfg.ConnConfig.ConnectTimeout = 5 * time.Second
	cfg.MaxConns = 10
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	st.pool = pool
	ps, err := pgstore.New(pool, pgstore.Config{Schema: spec.Schema})
	if err != nil {
		return err
	}
	store := &faultStore{Store: ps, fp: &spec.Fail, st: st}

	var src source.Source
	var dl consumer.DeadLetter
	switch spec.Broker {
	case "kafka", "kafka-cluster":
		closeTimeout := spec.KafkaClose
		if closeTimeout == 0 {
			closeTimeout = 3 * time.Second
		}
		s, err := kafka.New(kafka.Config{
			Brokers: spec.Brokers, Topics: []string{spec.Topic}, Group: spec.Group,
			MaxWait: 100 * time.Millisecond, RequestTimeout: 3 * time.Second, ReconnectBackoff: 500 * time.Millisecond,
			SessionTimeout: 3 * time.Second, HeartbeatInterval: 200 * time.Millisecond,
			RebalanceTimeout: 10 * time.Second, JoinGroupBackoff: 200 * time.Millisecond,
			DeadLetterTimeout: 5 * time.Second, CloseTimeout: closeTimeout, Logger: log,
			RetryDelays: spec.RetryDelays,
		})
		if err != nil {
			return err
		}
		src, dl = s, s
	case "rocketmq", "rocketmq-cluster":
		// The client's warnings (pulls that failed, queues dropped, flow
		// control) go with the child's output, which a failed scenario
		// keeps: what the client did with a queue that stalled.
		rocketmq.SetClientLogger(log.With(slog.String("from", "rocketmq-client")), slog.LevelWarn)
		s, err := rocketmq.New(rocketmq.Config{NameServers: spec.Brokers, Group: spec.Group, Topics: []string{spec.Topic},
			Orderly: spec.Orderly, MaxReconsumeTimes: spec.Reconsume, CloseTimeout: 5 * time.Second, Logger: log,
			RetryDelays: spec.RetryDelays})
		if err != nil {
			return err
		}
		src, dl = s, s
	default:
		return fmt.Errorf("unknown broker %q", spec.Broker)
	}

	attempts := spec.Attempts
	if attempts == 0 {
		attempts = 10 // the default
	}
	fsrc := &faultSource{Source: src, fp: &spec.Fail, st: st}
	if spec.AckLog != "" {
		f, err := os.OpenFile(spec.AckLog, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
		if err != nil {
			return err
		}
		defer f.Close()
		fsrc.ackLog = f
	}
	ccfg := consumer.Config[pgx.Tx]{
		Name:            "payments",
		Source:          fsrc,
		Store:           store,
		Handler:         spec.handler(st),
		DeadLetter:      dl,
		Key:             consumer.ByJSONField(payments.KeyField),
		MaxPayloadBytes: payments.MaxPayload,
		BatchSize:       spec.BatchSize,
		Retry:           consumer.RetryPolicy{Initial: 20 * time.Millisecond, Max: 500 * time.Millisecond, MaxAttempts: attempts, MaxElapsed: spec.MaxElapsed},
		Logger:          log,
		KeyLanes:        spec.KeyLanes,
	}
	if len(spec.RetryDelays) > 0 {
		sink, ok := src.(consumer.RetrySink)
		if !ok {
			return fmt.Errorf("%s: no retry sink for RetryDelays", spec.Broker)
		}
		ccfg.Retries = consumer.NonBlocking{Attempts: spec.RetryAttempts, Delays: spec.RetryDelays, Sink: sink, KeyOrdered: spec.KeyOrdered}
	}
	if spec.Tenants {
		ccfg.Tenant = consumer.ByHeader(tenantHeader)
	}
	if spec.StopLane {
		ccfg.OnExhausted = consumer.StopLaneOnExhausted
	}
	if spec.Offsets {
		ccfg.Offsets = ps
		ccfg.OnDuplicate = func(_ context.Context, d consumer.Duplicate) {
			if d.FirstAt.IsZero() { // below the stored offset: no key was claimed
				st.skips.Add(1)
			}
		}
	}
	if spec.NoParking {
		ccfg.Store = noParking{store}
	}
	c, err := consumer.New(ccfg)
	if err != nil {
		return err
	}
	st.mu.Lock()
	st.c = c
	st.mu.Unlock()
	go st.report(ctx, src)
	if n, _ := strconv.Atoi(os.Getenv(leakEnv)); n > 0 {
		go leak(n)
	}

	// SIGTERM: a graceful stop within the grace period.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM)
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		if _, ok := <-sigs; !ok {
			return
		}
		grace := spec.Grace
		if grace == 0 {
			grace = 20 * time.Second
		}
		sctx, cancel := context.WithTimeout(ctx, grace)
		defer cancel()
		began := time.Now()
		err := c.Stop(sctx)
		st.mu.Lock()
		st.stop.took, st.stop.stopped = time.Since(began), true
		if err != nil {
			st.stop.err = err.Error()
		}
		st.mu.Unlock()
	}()
	err = c.Run(ctx)
	signal.Stop(sigs)
	close(sigs)
	<-stopped // a SIGTERM's Stop records how it went
	st.write()
	if err != nil {
		return fmt.Errorf("consumer: %w", err)
	}
	return nil
}

// tenantHeader carries the tenant (a header the platform sets).
const tenantHeader = "tenant"

// tenantSchema is where a tenant's payments tables live.
func tenantSchema(base, tenant string) string { return base + "_" + tenant }

// handler is the payments handler with the handler failpoints around it,
// and an append-only audit row per applied effect (no unique constraint: a
// double effect would show as a second row).
func (spec *childSpec) handler(st *childState) consumer.Handler[pgx.Tx] {
	inner := payments.Handler(func(tx pgx.Tx) payments.DB { return payments.Pgx(tx) })
	key := consumer.ByJSONField(payments.KeyField)
	set := func(keys []string) map[string]bool {
		m := map[string]bool{}
		for _, k := range keys {
			m[k] = true
		}
		return m
	}
	fp := &spec.Fail
	panicOnce, panicAlways := set(fp.PanicOnce), set(fp.PanicAlways)
	transient, constraint, swallowed, slow := set(fp.Transient), set(fp.Constraint), set(fp.Swallowed), set(fp.SlowKeys)
	outage := set(fp.Outage)
	var mu sync.Mutex
	panicked := map[string]bool{}
	audit := pgx.Identifier{spec.Schema, "effects_audit"}.Sanitize()
	pid := os.Getpid()

	return consumer.HandlerFunc[pgx.Tx](func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		defer func(began time.Time) { st.calls.add(time.Since(began)) }(time.Now())
		txn, _ := key(m)
		tenant := ""
		if spec.Tenants {
			v, _ := m.Header(tenantHeader)
			tenant = string(v)
			if _, err := tx.Exec(ctx, `SELECT set_config('search_path', $1, true)`, tenantSchema(spec.Schema, tenant)); err != nil {
				return err
			}
		}
		if fp.Slow > 0 {
			time.Sleep(fp.Slow)
		}
		if slow[txn] {
			time.Sleep(fp.SlowFor)
		}
		mu.Lock()
		first := !panicked[txn]
		panicked[txn] = true
		mu.Unlock()
		if panicAlways[txn] || panicOnce[txn] && first {
			st.pan.Add(1)
			panic("faults: handler panic for " + txn)
		}
		if transient[txn] {
			return consumer.Retryable(errors.New("faults: payment channel API timed out"))
		}
		if outage[txn] {
			if _, err := os.Stat(fp.OutageOver); err != nil {
				return consumer.Retryable(errors.New("faults: payment channel down"))
			}
		}
		if err := inner.Handle(ctx, tx, m); err != nil {
			return err
		}
		if mark, ok := ctx.Value(killMark{}).(*atomic.Bool); ok && txn == fp.KillWithKey {
			mark.Store(true)
		}
		if constraint[txn] || swallowed[txn] {
			cb, _ := payments.Decode(m.Value)
			_, err := tx.Exec(ctx, `UPDATE orders SET amount = -1 WHERE id = $1`, cb.OrderID) // CHECK (amount > 0)
			if constraint[txn] {
				return err
			}
			// Swallowed: the transaction is aborted, the handler says nothing.
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+audit+` (tenant, txn_id, lane, part, off, pid, rkey) VALUES ($1, $2, $3, $4, $5, $6, $7)`,
			tenant, txn, m.Lane, m.Partition, m.Offset, pid, string(m.Key))
		if swallowed[txn] {
			return nil
		}
		return err
	})
}

// faultSource wraps the broker's Source: Ack is where the database commit
// is done and the offset commit is not. It records every ack in the ack log
// before it passes the ack on: the parent checks the broker's committed
// offsets against it.
type faultSource struct {
	source.Source
	fp *failpoints
	st *childState

	logMu  sync.Mutex
	ackLog *os.File // nil: none
}

func (s *faultSource) Ack(ctx context.Context, msgs []*consumer.Message) error {
	n := s.st.acked.Add(int64(len(msgs)))
	if k := s.fp.KillInAck; k > 0 && n >= int64(k) {
		s.st.acked.Add(-int64(len(msgs))) // not acknowledged to the broker
		s.st.write()
		die()
	}
	s.logAcks(msgs)
	err := s.Source.Ack(ctx, msgs)
	s.st.write()
	return err
}

// logAcks appends msgs to the ack log in one write, one line each. The
// child exits when it cannot: an ack the log does not show would make the
// parent's offset check report a committed offset ahead of the acks.
func (s *faultSource) logAcks(msgs []*consumer.Message) {
	if s.ackLog == nil {
		return
	}
	var b []byte
	for _, m := range msgs {
		b = appendAck(b, m.Lane, int(m.Partition), m.Offset)
	}
	s.logMu.Lock()
	defer s.logMu.Unlock()
	if _, err := s.ackLog.Write(b); err != nil {
		fmt.Fprintln(os.Stderr, "child: ack log:", err)
		os.Exit(3)
	}
}

// appendAck appends the ack log's line for a message (ackLog reads it).
func appendAck(b []byte, lane string, part int, off int64) []byte {
	return fmt.Appendf(b, "%s %d %d\n", lane, part, off)
}

// killMark is the context key under which faultStore tells the handler
// which transaction to mark for KillWithKey.
type killMark struct{}

// faultStore wraps pgstore: COMMIT is where its failpoints are.
type faultStore struct {
	*pgstore.Store
	fp *failpoints
	st *childState
}

// noParking is a store without its dedup.Parking (childSpec.NoParking):
// only the dedup.Store methods are seen.
type noParking struct{ dedup.Store[pgx.Tx] }

// errCommitLost is what a COMMIT that went through looks like when the
// connection broke before its answer came back (Temporal's
// ExecuteAndTimeout): io.ErrUnexpectedEOF, as pgx reports a broken read.
var errCommitLost = fmt.Errorf("faults: connection lost waiting for COMMIT's answer: %w", io.ErrUnexpectedEOF)

func (s *faultStore) InTx(ctx context.Context, fn func(context.Context, pgx.Tx) error) error {
	n := s.st.txs.Add(1)
	fp := s.fp
	switch {
	case fp.KillWithKey != "":
		mark := new(atomic.Bool)
		return s.Store.InTx(context.WithValue(ctx, killMark{}, mark), func(ctx context.Context, tx pgx.Tx) error {
			if err := fn(ctx, tx); err != nil {
				return err
			}
			if mark.Load() {
				s.st.write()
				die()
			}
			return nil
		})
	case fp.CommitLostEvery > 0 && n%int64(fp.CommitLostEvery) == 0:
		if err := s.Store.InTx(ctx, fn); err != nil {
			return err
		}
		s.st.lost.Add(1)
		return errCommitLost
	case fp.RollbackLostEvery > 0 && n%int64(fp.RollbackLostEvery) == 0:
		wrote := false
		err := s.Store.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
			if err := fn(ctx, tx); err != nil {
				return err
			}
			wrote = true
			// The connection dies before COMMIT reaches the server: Postgres
			// rolls back, pgx's COMMIT fails on the closed connection.
			cctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			_ = tx.Conn().PgConn().Close(cctx)
			return nil
		})
		if wrote {
			s.st.rlost.Add(1)
		}
		return err
	}
	return s.Store.InTx(ctx, fn)
}

var _ dedup.Store[pgx.Tx] = (*faultStore)(nil)

// readStats reads a child's stats file; zero when there is none.
func readStats(path string) childStats {
	var st childStats
	b, err := os.ReadFile(path)
	if err == nil {
		_ = json.Unmarshal(b, &st)
	}
	return st
}
