package faults_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/pgstore"
	"github.com/idemkit/idem/examples/payments"
	"github.com/idemkit/idem/internal/testenv"
)

// broker is what a scenario needs of Kafka or RocketMQ.
type broker interface {
	name() string
	// addrs are the Kafka brokers or the RocketMQ name servers.
	addrs() []string
	// newTopic creates a topic with n partitions (queues) and its
	// dead-letter topic, and returns it with a fresh group name.
	newTopic(t *testing.T, n int) (topic, group string)
	produce(t *testing.T, topic string, msgs []outMsg)
	// deadLetters reads topic's dead-letter topic until it holds at least
	// want distinct messages and returns all of its letters.
	deadLetters(t *testing.T, topic string, want int) []letter
	// waitNoLag waits until group has consumed topic to its end.
	waitNoLag(t *testing.T, topic, group string)
	// offsets returns group's committed offset of each partition (queue)
	// of topic; a partition without one is missing.
	offsets(ctx context.Context, topic, group string) (map[int]int64, error)
	// positions returns where each message produced to topic landed.
	positions(t *testing.T, topic string) map[string]pos
}

// pos is a message's partition (queue) and offset.
type pos struct {
	Part int
	Off  int64
}

// outMsg is a message to produce. ID is unique per message (the record key,
// RocketMQ KEYS): letters are matched to it.
type outMsg struct {
	ID     string
	Value  []byte
	Part   int
	Tenant string
	// Key is the record key; default the ID. A message keyed otherwise
	// carries its ID in the idHeader header (Kafka).
	Key string
}

// letter is a dead letter read back from the broker.
type letter struct {
	ID       string // the original's ID (record key / KEYS)
	Reason   string
	Attempts string
	Key      string // the dedup key's ID, empty when none was derived
	Scope    string
}

// rig is one scenario's world: a schema with the payments tables, a topic,
// the child consumers and what was sent.
type rig struct {
	t            *testing.T
	b            broker
	scenario     string
	began        time.Time
	topic, group string
	parts        int
	dir          string

	pgURL  string
	base   *pgxpool.Pool // no search_path: checks, pg_stat_activity
	pool   *pgxpool.Pool // search_path = schema
	schema string
	app    string // application_name of the children's connections

	tenants  []string                       // nil: one tenant-less stream
	pools    map[string]*pgxpool.Pool       // per tenant ("" without tenants)
	expected map[string][]payments.Expected // per tenant: valid payments sent
	wantDLQ  map[string]string              // message ID -> substring of the reason
	sent     int
	values   map[string][]byte // message ID -> payload, of what was produced

	mu       sync.Mutex
	children []*child
	nChild   int
	sampler  *offsetSampler

	report row
}

var uniq atomic.Int64

// newRig sets up a scenario on the shared Postgres: schema, tables,
// topic. tenants, when given, get one schema of payments tables each.
func newRig(t *testing.T, b broker, scenario string, parts int, tenants ...string) *rig {
	t.Helper()
	base := testenv.Pool(t)
	return newRigOn(t, b, scenario, parts, base, testenv.PostgresURL(t), tenants...)
}

// newRigOn sets up a scenario on the database of base; the children connect
// with childURL.
func newRigOn(t *testing.T, b broker, scenario string, parts int, base *pgxpool.Pool, childURL string, tenants ...string) *rig {
	t.Helper()
	r := &rig{t: t, b: b, scenario: scenario, began: time.Now(), parts: parts, dir: t.TempDir(),
		pgURL: childURL, expected: map[string][]payments.Expected{}, wantDLQ: map[string]string{},
		pools: map[string]*pgxpool.Pool{}, tenants: tenants, base: base}
	r.report = row{Scenario: scenario, Broker: b.name()}
	t.Cleanup(func() {
		r.report.Passed = !t.Failed()
		r.report.Took = time.Since(r.began)
		record(r.report)
	})
	r.schema = testenv.Schema(t, r.base)
	r.app = fmt.Sprintf("idem-faults-%d-%d", os.Getpid(), uniq.Add(1))
	r.setupDB(t)
	r.topic, r.group = b.newTopic(t, parts)
	return r
}

// setupDB creates the payments tables (per tenant), the audit table and
// idem's dedup table in r.schema.
func (r *rig) setupDB(t *testing.T) {
	t.Helper()
	ctx := testenv.Context(t, time.Minute)
	url := r.base.Config().ConnString()
	r.pool = schemaPool(t, url, r.schema)
	if _, err := r.pool.Exec(ctx, `CREATE TABLE effects_audit (
		id bigserial PRIMARY KEY, tenant text NOT NULL, txn_id text NOT NULL, lane text NOT NULL,
		part int NOT NULL, off bigint NOT NULL, pid int NOT NULL, rkey text NOT NULL,
		at timestamptz NOT NULL DEFAULT clock_timestamp())`); err != nil {
		t.Fatal(err)
	}
	if err := migrate(ctx, r.pool, r.schema); err != nil {
		t.Fatal(err)
	}
	if len(r.tenants) == 0 {
		r.pools[""] = r.pool
	}
	for _, tn := range r.tenants {
		s := tenantSchema(r.schema, tn)
		if _, err := r.base.Exec(ctx, `CREATE SCHEMA `+pgx.Identifier{s}.Sanitize()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_, _ = r.base.Exec(context.Background(), `DROP SCHEMA `+pgx.Identifier{s}.Sanitize()+` CASCADE`)
		})
		r.pools[tn] = schemaPool(t, url, s)
	}
	for _, p := range r.pools {
		if err := payments.Setup(ctx, payments.Pgx(p)); err != nil {
			t.Fatal(err)
		}
	}
}

func schemaPool(t *testing.T, url, schema string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 4
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// stream is a generated payment stream, split in what is sent first and the
// conflicting re-uses of a txn_id with another amount, sent once the first
// part is applied (RocketMQ's concurrent mode does not keep queue order,
// and a conflicting callback that overtook its original would be applied
// instead of it).
type stream struct {
	first, conflicts []outMsg
	dups             int // deliveries the generator made duplicates (gateway retries, channel re-sends)
}

var msgSeq atomic.Int64

// Reasons of the dead letters, as the sentinel errors spell them.
var (
	reasonTooLarge = consumer.ErrPayloadTooLarge.Error()
	reasonBadJSON  = consumer.ErrBadPayload.Error()
	reasonNoKey    = consumer.ErrNoKey.Error()
	reasonMismatch = dedup.ErrFingerprintMismatch.Error()
)

// newStream generates n payments for tenant (""), creates their orders and
// records what must come of each message.
func (r *rig) newStream(tenant string, n int, seed uint64) stream {
	r.t.Helper()
	s := payments.Generate(n, seed)
	// One transaction: on a durable cluster (PrivatePostgres), a commit per
	// row is an fsync per row.
	ctx := testenv.Context(r.t, 5*time.Minute)
	if err := pgx.BeginFunc(ctx, r.pools[tenant], func(tx pgx.Tx) error {
		return payments.CreateOrders(ctx, payments.Pgx(tx), s.Orders)
	}); err != nil {
		r.t.Fatal(err)
	}
	r.expected[tenant] = append(r.expected[tenant], s.Expected...)
	st := stream{dups: s.GatewayRetries + 3*s.ChannelResends}
	// A conflict is known by its amount, not by its place: Generate appends
	// each conflict, then inserts bad messages anywhere, the tail included,
	// so on a long stream a few conflicts are not among the last
	// s.Conflicting (3 of 288 at 57,600 payments, make soak).
	amount := map[string]int64{}
	for _, e := range s.Expected {
		amount[e.TxnID] = e.Amount
	}
	for _, p := range s.Payloads {
		m := r.msg(tenant, p)
		if reason := badReason(p); reason != "" {
			r.wantDLQ[m.ID] = reason
		} else if cb, err := payments.Decode(p); err == nil && cb.Amount != amount[cb.TxnID] {
			r.wantDLQ[m.ID] = reasonMismatch
			st.conflicts = append(st.conflicts, m)
			continue
		}
		st.first = append(st.first, m)
	}
	if len(st.conflicts) != s.Conflicting {
		r.t.Fatalf("%d conflicting callbacks found in the stream, Generate made %d", len(st.conflicts), s.Conflicting)
	}
	return st
}

// badReason is why the consumer must refuse payload before the handler
// runs, "" when it must not.
func badReason(p []byte) string {
	if len(p) > payments.MaxPayload {
		return reasonTooLarge
	}
	_, err := consumer.ByJSONField(payments.KeyField)(&consumer.Message{Value: p})
	switch {
	case errors.Is(err, consumer.ErrBadPayload):
		return reasonBadJSON
	case errors.Is(err, consumer.ErrNoKey):
		return reasonNoKey
	case err != nil:
		return err.Error()
	}
	return ""
}

// msg builds the message for payload: partitioned by order, as a producer
// keyed by order ID would.
func (r *rig) msg(tenant string, payload []byte) outMsg {
	part := 0
	for _, c := range payments.PartitionKey(payload) {
		part = (part*31 + int(c)) % r.parts
	}
	return outMsg{ID: fmt.Sprintf("m%d", msgSeq.Add(1)), Value: payload, Part: part, Tenant: tenant}
}

// callback builds a valid callback for an order of tenant.
func callback(txn string, o payments.Order) []byte {
	b, _ := json.Marshal(payments.Callback{TxnID: txn, OrderID: o.ID, Amount: o.Amount, Channel: "card", Status: "SUCCESS"})
	return b
}

func (r *rig) produce(msgs []outMsg) {
	r.t.Helper()
	r.b.produce(r.t, r.topic, msgs)
	r.produced(msgs)
}

// produced records msgs, which are on the topic.
func (r *rig) produced(msgs []outMsg) {
	r.mu.Lock()
	if r.values == nil {
		r.values = map[string][]byte{}
	}
	for _, m := range msgs {
		r.values[m.ID] = m.Value
	}
	r.mu.Unlock()
	r.sent += len(msgs)
	r.report.Messages = r.sent
}

// unexpect removes txn from the expected payments of tenant: it must not
// be applied (its message is dead-lettered).
func (r *rig) unexpect(tenant, txn string) {
	es := r.expected[tenant][:0]
	for _, e := range r.expected[tenant] {
		if e.TxnID != txn {
			es = append(es, e)
		}
	}
	r.expected[tenant] = es
}

// wantLetter expects the message carrying txn (first wave) to be
// dead-lettered with reason.
func (r *rig) wantLetter(msgs []outMsg, txn, reason string) {
	r.t.Helper()
	found := false
	for _, m := range msgs {
		if id, err := consumer.ByJSONField(payments.KeyField)(&consumer.Message{Value: m.Value}); err == nil && id == txn {
			r.wantDLQ[m.ID] = reason
			found = true
		}
	}
	if !found {
		r.t.Fatalf("no message carries %s", txn)
	}
}

// --- children -------------------------------------------------------------

// child is a consumer process.
type child struct {
	*testenv.Child
	n     int
	spec  childSpec
	began time.Time
}

// start runs a child consumer with failpoints fp.
func (r *rig) start(fp failpoints, mods ...func(*childSpec)) *child {
	r.t.Helper()
	r.mu.Lock()
	r.nChild++
	n := r.nChild
	r.mu.Unlock()
	dir := filepath.Join(r.dir, fmt.Sprintf("child-%d", n))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		r.t.Fatal(err)
	}
	spec := childSpec{
		Broker: r.b.name(), Brokers: r.b.addrs(), Topic: r.topic, Group: r.group,
		PgURL: r.pgURL, Schema: r.schema, App: r.app, Tenants: len(r.tenants) > 0,
		BatchSize: 50, StatsFile: filepath.Join(dir, "stats.json"), AckLog: filepath.Join(dir, ackLogName), Fail: fp,
	}
	for _, m := range mods {
		m(&spec)
	}
	c := &child{Child: testenv.StartChild(r.t, testenv.SpecEnv(r.t, childEnv, spec)), n: n, spec: spec, began: time.Now()}
	r.mu.Lock()
	r.children = append(r.children, c)
	r.mu.Unlock()
	r.t.Cleanup(func() {
		if r.t.Failed() && !c.Exited() {
			// A hung consumer: SIGQUIT makes the Go runtime print every
			// goroutine's stack.
			c.Signal(syscall.SIGQUIT)
			c.WaitExit(5 * time.Second)
		}
		c.Kill()
		if r.t.Failed() {
			out := c.Out.String()
			if dir := os.Getenv("IDEM_FAULTS_KEEP"); dir != "" {
				f := filepath.Join(dir, fmt.Sprintf("%s-child-%d.log", strings.ReplaceAll(r.t.Name(), "/", "_"), c.n))
				_ = os.WriteFile(f, []byte(out), 0o644)
				r.t.Logf("child %d output: %s", c.n, f)
			}
			r.t.Logf("child %d output (last 4 KiB):\n%s", c.n, tail(out, 4096))
		}
	})
	return c
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// term sends SIGTERM: the child stops gracefully within its grace period.
func (c *child) term() { c.Signal(syscall.SIGTERM) }

// waitExit waits until the child exited, failing the test after d.
func (c *child) waitExit(t *testing.T, d time.Duration, what string) {
	t.Helper()
	if !c.WaitExit(d) {
		t.Fatalf("child %d did not exit within %v after %s", c.n, d, what)
	}
}

// stop stops the child gracefully and fails unless it exited cleanly.
func (c *child) stop(t *testing.T) {
	t.Helper()
	if c.Exited() {
		return
	}
	c.term()
	c.waitExit(t, 60*time.Second, "SIGTERM")
	if err := c.Err(); err != nil {
		t.Errorf("child %d exited with %v after SIGTERM", c.n, err)
	}
}

func (c *child) stats() childStats { return readStats(c.spec.StatsFile) }

// requireAlive fails the test when the child has exited.
func (c *child) requireAlive(t *testing.T) {
	t.Helper()
	if c.Exited() {
		t.Fatalf("child %d exited: %v\n%s", c.n, c.Err(), tail(c.Out.String(), 4096))
	}
}

// --- waiting and checking -------------------------------------------------

// ledgerRows counts the ledger rows of all tenants.
func (r *rig) ledgerRows() int64 {
	var total int64
	for _, p := range r.pools {
		var n int64
		if err := p.QueryRow(context.Background(), `SELECT count(*) FROM ledger`).Scan(&n); err == nil {
			total += n
		}
	}
	return total
}

func (r *rig) wantPayments() int {
	n := 0
	for _, es := range r.expected {
		n += len(es)
	}
	return n
}

// waitApplied waits until at least n payments are in the ledger, failing
// when a child in alive died.
func (r *rig) waitApplied(n int64, alive ...*child) {
	r.t.Helper()
	r.waitAppliedFor(waitApplyFor, n, alive...)
}

// waitAppliedFor is waitApplied with a wait of d.
func (r *rig) waitAppliedFor(d time.Duration, n int64, alive ...*child) {
	r.t.Helper()
	defer func() {
		if r.t.Failed() {
			r.diagnose()
		}
	}()
	testenv.WaitUntilProgress(r.t, d, fmt.Sprintf("%d payments applied", n), func() (bool, string) {
		for _, c := range alive {
			c.requireAlive(r.t)
		}
		got := r.ledgerRows()
		return got >= n, fmt.Sprintf("%d applied", got)
	})
}

// activeChildren returns the children that still run.
func (r *rig) activeChildren() []*child {
	r.mu.Lock()
	defer r.mu.Unlock()
	var cs []*child
	for _, c := range r.children {
		if !c.Exited() {
			cs = append(cs, c)
		}
	}
	return cs
}

// duplicates sums the children's skipped duplicates.
func (r *rig) duplicates() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	var n int64
	for _, c := range r.children {
		n += c.stats().Stats.Duplicates
	}
	return n
}

// finish waits until the stream is consumed, stops the children and checks
// everything: the four tables and the dedup table reconcile for every
// tenant, no effect twice in the audit, the dead letters are exactly the
// expected ones with their reasons, the group has no lag, committed offsets
// kept the broker's rule (see offsetSampler), no transaction of the
// consumer is left open, no race in the children.
func (r *rig) finish() {
	t := r.t
	t.Helper()
	want := r.wantPayments()
	r.waitApplied(int64(want), r.activeChildren()...)
	letters := r.b.deadLetters(t, r.topic, len(r.wantDLQ))
	r.b.waitNoLag(t, r.topic, r.group)
	for _, c := range r.activeChildren() {
		c.stop(t)
	}
	r.check(letters)
}

// check runs the checks of finish once the children are stopped.
func (r *rig) check(letters []letter) {
	t := r.t
	t.Helper()
	// Reconcile reads each expected payment with a query of its own: 57,600
	// of them (the soak's) took more than two minutes at load 10, so the
	// bound grows by 5 ms a payment.
	ctx := testenv.Context(t, 2*time.Minute+time.Duration(r.wantPayments())*5*time.Millisecond)
	// Reconciliation, per tenant.
	for _, tn := range r.tenantList() {
		scope := "payments"
		if tn != "" {
			scope += "/" + tn
		}
		rep, err := payments.Reconcile(ctx, payments.Pgx(r.pools[tn]), pgx.Identifier{r.schema, "idem_dedup"}.Sanitize(), scope, r.expected[tn])
		if err != nil {
			t.Fatal(err)
		}
		r.report.Effects += rep.Payments
		r.report.Lost += rep.Lost
		r.report.Double += rep.DoubleApplied
		if !rep.OK() || rep.Payments != int64(len(r.expected[tn])) {
			t.Errorf("tenant %q: %v (%d payments, want %d)", tn, rep, rep.Payments, len(r.expected[tn]))
		}
	}
	// The audit: one row per applied payment.
	var doubled int64
	if err := r.pool.QueryRow(ctx, `SELECT count(*) FROM (SELECT 1 FROM effects_audit GROUP BY tenant, txn_id HAVING count(*) > 1) d`).Scan(&doubled); err != nil {
		t.Fatal(err)
	}
	r.report.Double += doubled
	if doubled != 0 {
		t.Errorf("%d payments applied more than once (effects_audit)", doubled)
	}
	// Dead letters: exactly the expected messages, with their reasons.
	got := map[string]letter{}
	for _, l := range letters {
		got[l.ID] = l
	}
	r.report.DeadLetters = len(got)
	for id, reason := range r.wantDLQ {
		l, ok := got[id]
		switch {
		case !ok:
			t.Errorf("message %s was not dead-lettered (want reason %q)", id, reason)
		case !strings.Contains(l.Reason, reason):
			t.Errorf("message %s dead-lettered with %q, want %q", id, l.Reason, reason)
		}
	}
	for id, l := range got {
		if _, ok := r.wantDLQ[id]; !ok {
			t.Errorf("message %s dead-lettered unexpectedly: %q", id, l.Reason)
		}
	}
	r.report.Duplicates = r.duplicates()
	if r.sampler != nil {
		r.sampler.check(t)
	}
	r.checkNoOpenTx(t)
	r.mu.Lock()
	for _, c := range r.children {
		c.CheckRaces(t)
	}
	r.mu.Unlock()
}

func (r *rig) tenantList() []string {
	if len(r.tenants) == 0 {
		return []string{""}
	}
	ts := append([]string(nil), r.tenants...)
	sort.Strings(ts)
	return ts
}

// checkNoOpenTx fails unless the consumer's backends are gone: none idle in
// a transaction, none at all once the children exited.
func (r *rig) checkNoOpenTx(t *testing.T) {
	t.Helper()
	testenv.WaitUntilProgress(t, 30*time.Second, "no backend of the consumer is left", func() (bool, string) {
		rows, err := r.base.Query(context.Background(),
			`SELECT pid, state, coalesce(left(query, 60), '') FROM pg_stat_activity WHERE application_name = $1`, r.app)
		if err != nil {
			return false, err.Error()
		}
		defer rows.Close()
		var left []string
		for rows.Next() {
			var pid int
			var state, q string
			if err := rows.Scan(&pid, &state, &q); err != nil {
				return false, err.Error()
			}
			left = append(left, fmt.Sprintf("pid %d %s %q", pid, state, q))
		}
		return len(left) == 0, strings.Join(left, "; ")
	})
}

// idleInTx counts the consumer's backends idle in a transaction.
func (r *rig) idleInTx() int {
	var n int
	_ = r.base.QueryRow(context.Background(),
		`SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND state LIKE 'idle in transaction%'`, r.app).Scan(&n)
	return n
}

// midReconcile checks what can be checked in the middle of a stream: every
// ledger row has its dedup row and the reverse, balances agree with the
// ledger (no partial or double effect).
func (r *rig) midReconcile(when string) {
	r.t.Helper()
	for _, tn := range r.tenantList() {
		scope := "payments"
		if tn != "" {
			scope += "/" + tn
		}
		rep, err := payments.Reconcile(testenv.Context(r.t, time.Minute), payments.Pgx(r.pools[tn]),
			pgx.Identifier{r.schema, "idem_dedup"}.Sanitize(), scope, nil)
		if err != nil {
			r.t.Fatal(err)
		}
		if rep.DoubleApplied+rep.LedgerNoDedup+rep.DedupNoLedger+rep.PaidNoLedger+rep.LedgerNotPaid != 0 {
			r.t.Fatalf("%s: tables disagree: %+v", when, rep)
		}
	}
}

// migrate creates idem's dedup table in schema.
func migrate(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	st, err := pgstore.New(pool, pgstore.Config{Schema: schema})
	if err != nil {
		return err
	}
	return st.Migrate(ctx)
}

func pid() int { return os.Getpid() }

// sentValues returns the payloads produced, by message ID.
func (r *rig) sentValues() map[string][]byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.values
}

// txnOf returns the payload's txn_id, "" when it has none.
func txnOf(p []byte) string {
	id, _ := consumer.ByJSONField(payments.KeyField)(&consumer.Message{Value: p})
	return id
}

// waitApplyFor bounds the wait for a stream to be applied.
var waitApplyFor = 2 * time.Minute

// diagnose logs what became of the expected payments that are missing:
// their dedup rows, where their messages are, the committed offsets.
func (r *rig) diagnose() {
	t := r.t
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	values := r.sentValues()
	for _, tn := range r.tenantList() {
		for _, e := range r.expected[tn] {
			var n int
			if err := r.pools[tn].QueryRow(ctx, `SELECT count(*) FROM ledger WHERE txn_id = $1`, e.TxnID).Scan(&n); err != nil || n == 1 {
				continue
			}
			var outcome, reason, source string
			err := r.pool.QueryRow(ctx, `SELECT outcome, coalesce(reason, ''), coalesce(source, '') FROM `+
				pgx.Identifier{r.schema, "idem_dedup"}.Sanitize()+` WHERE key = $1`, e.TxnID).Scan(&outcome, &reason, &source)
			var ids []string
			for id, v := range values {
				if txnOf(v) == e.TxnID {
					ids = append(ids, id)
				}
			}
			pos := r.b.positions(t, r.topic)
			var where []string
			for _, id := range ids {
				where = append(where, fmt.Sprintf("%s@%d/%d", id, pos[id].Part, pos[id].Off))
			}
			t.Logf("missing %q txn %s: ledger rows %d, dedup row: %q %q %q (%v), messages %v", tn, e.TxnID, n, outcome, reason, source, err, where)
		}
	}
	got, err := r.b.offsets(ctx, r.topic, r.group)
	t.Logf("committed offsets: %v (%v)", got, err)
	for _, c := range r.activeChildren() {
		st := c.stats()
		h := consumer.Health{Lanes: st.Lanes}
		t.Logf("child %d (pid %d) lanes: %+v; stalled for 30s: %q", c.n, st.Pid, st.Lanes, h.StalledLanes(time.Now(), 30*time.Second))
	}
}

// --- committed offsets ----------------------------------------------------
//
// What a group's committed offsets must respect depends on the broker.
//
// Kafka fences offset commits by generation: the adapter commits only inside
// the generation that delivered the messages, so a partition's committed
// offset never goes down, nor disappears.
//
// RocketMQ has no such fencing. A client keeps its queues' offsets in memory,
// sends them with its pulls and persists them every 5 s and when it lets a
// queue go; the broker takes whatever offset comes, lower ones included (it
// logs "[NOTIFYME]update consumer offset less than store"). A queue's new
// owner starts from the offset the broker has, which can be older than what
// the previous owner had settled, and commits below what the previous owner
// committed on its way out. That is redelivery, which the dedup store
// absorbs, not loss. What must hold is that a committed offset is never
// ahead of what the consumers settled: every message below a queue's
// committed offset was acked by a consumer (applied, skipped as a duplicate
// or dead-lettered; the children record every ack before they pass it on)
// or given back to the broker (its copy is in %RETRY%<group>).

// queueNumberer is a broker whose partition numbers are not the queue
// numbers its consumers see (a RocketMQ cluster, whose queue q exists on
// each broker): partOf returns the partition number of queue q of the
// consumer's lane (RocketMQ: topic/broker/queue), false when the lane is
// not one of the broker's.
type queueNumberer interface {
	partOf(lane string, q int) (int, bool)
}

// givingBackBroker is a broker whose offset commits are not fenced
// (RocketMQ): the offset sampler checks that the committed offsets are never
// ahead of what the consumers settled, instead of that they never go down.
type givingBackBroker interface {
	broker
	// givenBack returns the IDs of the messages group gave back to the
	// broker for a later redelivery (RocketMQ: the copies in
	// %RETRY%<group>).
	givenBack(t *testing.T, group string) map[string]bool
}

// offsetSampler samples a group's committed offsets every 100ms. For Kafka
// it records any that went down or disappeared; for RocketMQ the messages a
// committed offset passed that no consumer had acked (checked against the
// retry topic at the end).
type offsetSampler struct {
	*testenv.OffsetSampler
	b            broker
	t            *testing.T
	topic, group string
	ackLogs      func() []string // the files the consumers record their acks in
	fenced       bool

	mu    sync.Mutex
	acks  ackLog
	errs  []string          // not fenced: the ack logs could not be read
	ahead map[string]string // not fenced: message ID -> the committed offset that passed it unacked
}

// sampleOffsets samples the group's committed offsets for the rest of the
// test; rig.check fails the test if one broke the broker's rule.
func (r *rig) sampleOffsets() {
	// The children's directories, not r.children: a child's directory
	// exists before the child starts, so a sample never misses the ack log
	// of a child that acked before the sample's offsets were read.
	r.sampler = newOffsetSampler(r.t, r.b, r.topic, r.group, func() []string {
		files, _ := filepath.Glob(filepath.Join(r.dir, "child-*", ackLogName))
		return files
	})
}

// ackLogName is the name of a child's ack log in its directory.
const ackLogName = "acked"

// newOffsetSampler starts sampling; ackLogs lists the consumers' ack logs
// (read only for a givingBackBroker).
func newOffsetSampler(t *testing.T, b broker, topic, group string, ackLogs func() []string) *offsetSampler {
	_, givesBack := b.(givingBackBroker)
	s := &offsetSampler{b: b, t: t, topic: topic, group: group, ackLogs: ackLogs, fenced: !givesBack, ahead: map[string]string{}}
	if qn, ok := b.(queueNumberer); ok {
		s.acks.partOf = qn.partOf
	}
	var each func(map[int]int64)
	if !s.fenced {
		each = s.checkAcked
	}
	s.OffsetSampler = testenv.SampleOffsets(t, 100*time.Millisecond,
		func(ctx context.Context) (map[int]int64, error) { return b.offsets(ctx, topic, group) }, each)
	return s
}

// checkAcked records the messages below the committed offsets got that no
// consumer had acked. The committed offsets were read first: what was
// acked before they were committed is in the ack logs by the time they are
// read.
func (s *offsetSampler) checkAcked(got map[int]int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.acks.update(s.ackLogs(), s.topic); err != nil {
		if !slices.Contains(s.errs, err.Error()) {
			s.errs = append(s.errs, err.Error())
		}
		return
	}
	for id, why := range unackedBelow(got, s.b.positions(s.t, s.topic), s.acks.acked) {
		if _, seen := s.ahead[id]; !seen {
			s.ahead[id] = why
		}
	}
}

// unackedBelow returns the messages below their queue's committed offset
// that were not acked, by message ID, each with what passed it.
func unackedBelow(committed map[int]int64, positions map[string]pos, acked map[pos]bool) map[string]string {
	out := map[string]string{}
	for id, p := range positions {
		if c, ok := committed[p.Part]; ok && p.Off < c && !acked[p] {
			out[id] = fmt.Sprintf("queue %d: committed offset %d passed message %s at offset %d, which no consumer had acked", p.Part, c, id, p.Off)
		}
	}
	return out
}

// ackLog is what the consumers recorded in their ack logs (childSpec.AckLog)
// so far: the queue and offset of every message of the topic they acked.
type ackLog struct {
	read   map[string]int64 // file -> bytes parsed
	acked  map[pos]bool
	partOf func(lane string, q int) (int, bool) // nil: the partition is the queue (queueNumberer)
}

// update reads what was appended to files since the last update. A line
// without its newline yet is left for the next one: its ack has not been
// passed on.
func (a *ackLog) update(files []string, topic string) error {
	if a.read == nil {
		a.read, a.acked = map[string]int64{}, map[pos]bool{}
	}
	for _, name := range files {
		f, err := os.Open(name)
		if errors.Is(err, os.ErrNotExist) {
			continue // nothing acked yet
		}
		if err != nil {
			return fmt.Errorf("ack log: %w", err)
		}
		_, err = f.Seek(a.read[name], io.SeekStart)
		var b []byte
		if err == nil {
			b, err = io.ReadAll(f)
		}
		f.Close()
		if err != nil {
			return fmt.Errorf("ack log %s: %w", name, err)
		}
		b = b[:bytes.LastIndexByte(b, '\n')+1]
		for _, line := range strings.Split(strings.TrimSuffix(string(b), "\n"), "\n") {
			if line == "" {
				continue
			}
			fields := strings.Fields(line) // lane partition offset
			var p pos
			var err1, err2 error
			if len(fields) == 3 {
				p.Part, err1 = strconv.Atoi(fields[1])
				p.Off, err2 = strconv.ParseInt(fields[2], 10, 64)
			}
			if len(fields) != 3 || err1 != nil || err2 != nil {
				return fmt.Errorf("ack log %s: bad line %q", name, line)
			}
			if !strings.HasPrefix(fields[0], topic+"/") {
				continue
			}
			if a.partOf != nil {
				var ok bool
				if p.Part, ok = a.partOf(fields[0], p.Part); !ok {
					return fmt.Errorf("ack log %s: lane %q of no known broker", name, fields[0])
				}
			}
			a.acked[p] = true
		}
		a.read[name] += int64(len(b))
	}
	return nil
}

// problems stops sampling and returns what broke the broker's rule: for
// Kafka, committed offsets that went down or disappeared; for RocketMQ, the
// messages a committed offset passed unacked that the group did not give
// back to the retry topic either.
func (s *offsetSampler) problems(t *testing.T) []string {
	t.Helper()
	s.Stop()
	s.mu.Lock()
	defer s.mu.Unlock()
	var probs []string
	if s.fenced {
		probs = s.Decreases()
	} else {
		probs = slices.Clone(s.errs)
	}
	n := s.Samples()
	if n == 0 {
		probs = append(probs, "no committed offset was sampled")
	}
	if s.fenced {
		return probs
	}
	down, gone := 0, 0
	for _, d := range s.Decreases() {
		if strings.HasSuffix(d, "disappeared") {
			gone++ // a broker of a cluster down: its queues' offsets are not read
		} else {
			down++
		}
	}
	t.Logf("%d offset samples, %d acks logged; committed offsets seen going down %d times (redelivery), missing %d times",
		n, len(s.acks.acked), down, gone)
	if len(s.ahead) == 0 {
		return probs
	}
	back := s.b.(givingBackBroker).givenBack(t, s.group)
	ids := slices.Sorted(maps.Keys(s.ahead))
	given := 0
	for _, id := range ids {
		if back[id] {
			given++
			continue
		}
		probs = append(probs, s.ahead[id]+", nor given back to the retry topic")
	}
	t.Logf("committed offsets passed %d messages before their acks were seen; given back to the retry topic: %d", len(ids), given)
	return probs
}

// check stops sampling and fails the test for every problem.
func (s *offsetSampler) check(t *testing.T) {
	t.Helper()
	for _, p := range s.problems(t) {
		t.Error(p)
	}
}
