package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/pgstore"
	"github.com/idemkit/idem/internal/testenv"
)

// faultRig is a consumer on real Postgres with an append-only effects table.
type faultRig struct {
	app    string        // the consumer's application_name, unique to this process
	pool   *pgxpool.Pool // the consumer's: its backends may be killed
	check  *pgxpool.Pool // the test's own, for counting
	st     *pgstore.Store
	schema string
	table  string
}

func newFaultRig(t *testing.T, appName string) faultRig {
	t.Helper()
	base := testenv.Pool(t)
	schema := testenv.Schema(t, base)
	cfg, err := pgxpool.ParseConfig(testenv.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	// Unique to the process: a killer in another test process (another
	// checkout's tests on the same server) must not hit this rig.
	appName = fmt.Sprintf("%s-%d", appName, os.Getpid())
	cfg.ConnConfig.RuntimeParams["application_name"] = appName
	cfg.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	st, err := pgstore.New(pool, pgstore.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return faultRig{app: appName, pool: pool, check: base, st: st, schema: schema, table: effectsTable(t, base, schema)}
}

func (r faultRig) messages(n int) []*consumer.Message {
	var msgs []*consumer.Message
	for i := range n {
		msgs = append(msgs, consumertest.Message("payments", int32(i%4), int64(i/4), "", fmt.Sprintf(`{"txn_id":"T%05d","amount":%d}`, i, i+1)))
	}
	return msgs
}

func (r faultRig) checkOnce(t *testing.T, n int) {
	t.Helper()
	var rows, distinct int64
	if err := r.check.QueryRow(context.Background(), `SELECT count(*), count(DISTINCT txn_id) FROM `+r.table).Scan(&rows, &distinct); err != nil {
		t.Fatal(err)
	}
	if rows != int64(n) || distinct != int64(n) {
		t.Fatalf("%d effects (%d distinct), want %d: lost or applied twice", rows, distinct, n)
	}
}

// TestBackendsTerminatedRepeatedly kills the consumer's Postgres backends
// every 20 ms while it works: every message is still applied once, none is
// dead-lettered over a database fault. A kill waits for the consumer to have
// committed something since the last one, so that the test holds on a busy
// machine, where a fixed kill rate outran the consumer (60 s passed with a
// third of the stream left).
func TestBackendsTerminatedRepeatedly(t *testing.T) {
	rig := newFaultRig(t, "idem-fault-terminate")
	killer := testenv.Pool(t)
	stop := make(chan struct{})
	var kills atomic.Int64
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		var last int64 = -1
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				var applied, n int64
				if err := killer.QueryRow(context.Background(), `SELECT count(*) FROM `+rig.table).Scan(&applied); err != nil || applied == last {
					continue
				}
				last = applied
				if err := killer.QueryRow(context.Background(),
					`SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1`, rig.app).Scan(&n); err == nil {
					kills.Add(n)
				}
			}
		}
	})
	const n = 600
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	res, err := consumertest.Drive(ctx, consumer.Config[pgx.Tx]{
		Name: "payments", Store: rig.st, Handler: insertEffect(rig.table), Key: consumer.ByJSONField("txn_id"),
		BatchSize: 10, Logger: quiet,
		Clock: testenv.ShortClock{}, // real waits, short: the pool must reconnect between attempts
	}, consumertest.Script{MinDeliveries: 1, MaxDeliveries: 2}, rig.messages(n)...)
	close(stop)
	wg.Wait()
	t.Log(res, "backends killed:", kills.Load())
	if err != nil {
		t.Fatalf("consumer: %v (%v)", err, res)
	}
	if kills.Load() == 0 {
		t.Fatal("no backend was terminated: the test proved nothing")
	}
	rig.checkOnce(t, n)
	if len(res.DeadLetters) != 0 {
		t.Fatalf("%d messages dead-lettered over database faults", len(res.DeadLetters))
	}
}

// unknownCommit makes COMMIT's outcome unknown to the consumer, both ways:
// every third transaction really commits and every fifth really rolls back,
// and both report a lost connection (Temporal's ExecuteAndTimeout fault).
type unknownCommit struct {
	*pgstore.Store
	n                     atomic.Int64
	committed, rolledBack atomic.Int64
}

var errConnLostAtCommit = errors.New("connection lost during COMMIT")

func (u *unknownCommit) InTx(ctx context.Context, fn func(context.Context, pgx.Tx) error) error {
	k := u.n.Add(1)
	switch {
	case k%3 == 0:
		if err := u.Store.InTx(ctx, fn); err != nil {
			return err
		}
		u.committed.Add(1)
		return errConnLostAtCommit
	case k%5 == 0:
		err := u.Store.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
			if err := fn(ctx, tx); err != nil {
				return err
			}
			return errConnLostAtCommit // rolled back
		})
		if errors.Is(err, errConnLostAtCommit) {
			u.rolledBack.Add(1)
		}
		return err
	}
	return u.Store.InTx(ctx, fn)
}

func (u *unknownCommit) ClassifyError(err error) dedup.ErrorClass {
	if errors.Is(err, errConnLostAtCommit) {
		return dedup.ClassUnavailable
	}
	return u.Store.ClassifyError(err)
}

// TestCommitOutcomeUnknown: when the consumer cannot know whether COMMIT
// happened, it does not ack; the retry's claim finds the row (committed:
// skipped) or not (rolled back: applied). Every effect exists once.
func TestCommitOutcomeUnknown(t *testing.T) {
	rig := newFaultRig(t, "idem-fault-commit")
	st := &unknownCommit{Store: rig.st}
	src := consumertest.NewSource(consumertest.Script{})
	const n = 500
	res := consumertest.Run(t, consumer.Config[pgx.Tx]{
		Name: "payments", Source: src, Store: st, Handler: insertEffect(rig.table), Key: consumer.ByJSONField("txn_id"),
		BatchSize: 7, Logger: quiet,
	}, consumertest.Script{}, rig.messages(n)...)
	t.Log(res, "committed-but-unknown:", st.committed.Load(), "rolled-back-but-unknown:", st.rolledBack.Load())
	if st.committed.Load() == 0 || st.rolledBack.Load() == 0 {
		t.Fatal("the fault did not fire both ways")
	}
	rig.checkOnce(t, n)
	if res.Source.AckCalls == 0 || len(res.DeadLetters) != 0 {
		t.Fatalf("acks %d, dead letters %d", res.Source.AckCalls, len(res.DeadLetters))
	}
	if res.Stats.Duplicates == 0 {
		t.Fatal("no retry found its own committed row: the committed-but-unknown path was not exercised")
	}
}

// TestHandlerNetworkErrorsAreBounded: a handler whose downstream HTTP call
// fails (a net.Error, io.EOF) is retried within Retry.MaxAttempts and then
// dead-lettered; only the store's own lost connection is waited out.
func TestHandlerNetworkErrorsAreBounded(t *testing.T) {
	rig := newFaultRig(t, "idem-fault-handler-net")
	effect := insertEffect(rig.table)
	var calls atomic.Int64
	h := consumer.HandlerFunc[pgx.Tx](func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if id, _ := consumer.ByJSONField("txn_id")(m); id == "T00001" {
			calls.Add(1)
			return &url.Error{Op: "Post", URL: "http://127.0.0.1:1/notify", Err: io.ErrUnexpectedEOF}
		}
		return effect(ctx, tx, m)
	})
	res := consumertest.Run(t, consumer.Config[pgx.Tx]{
		Name: "payments", Store: rig.st, Handler: h, Key: consumer.ByJSONField("txn_id"),
		Retry: consumer.RetryPolicy{MaxAttempts: 3}, Logger: quiet,
	}, consumertest.Script{}, rig.messages(3)...)
	if calls.Load() != 3 || len(res.DeadLetters) != 1 || res.DeadLetters[0].Key.ID != "T00001" {
		t.Fatalf("handler ran %d times, dead letters %+v; want 3 runs and T00001 dead-lettered", calls.Load(), res.DeadLetters)
	}
	var n int64
	if err := rig.check.QueryRow(context.Background(), `SELECT count(*) FROM `+rig.table).Scan(&n); err != nil || n != 2 {
		t.Fatalf("effects %d (%v), want the other 2", n, err)
	}
}

// classSpy records how the store classified each error the consumer saw.
type classSpy struct {
	*pgstore.Store
	mu   sync.Mutex
	seen []string
}

func (s *classSpy) ClassifyError(err error) dedup.ErrorClass {
	c := s.Store.ClassifyError(err)
	s.mu.Lock()
	s.seen = append(s.seen, fmt.Sprintf("%v: %v", c, err))
	s.mu.Unlock()
	return c
}

func (s *classSpy) log() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.seen...)
}

// TestHandlerTimeoutIsBounded: a handler under consumer.Timeout whose SQL
// statement overruns the deadline loses its connection (pgx's default context
// watcher interrupts a statement by setting a deadline on the socket, which
// closes it). That is the handler's doing, not the database going away: the
// message is retried within Retry.MaxAttempts and dead-lettered, and the
// message behind it in its partition is applied.
func TestHandlerTimeoutIsBounded(t *testing.T) {
	rig := newFaultRig(t, "idem-fault-handler-timeout")
	st := &classSpy{Store: rig.st}
	effect := insertEffect(rig.table)
	const maxAttempts = 3
	var calls, closed atomic.Int64
	h := consumer.HandlerFunc[pgx.Tx](func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if id, _ := consumer.ByJSONField("txn_id")(m); id != "T00001" {
			return effect(ctx, tx, m)
		}
		if calls.Add(1) > 3*maxAttempts {
			return consumer.Permanent(errors.New("retried without bound")) // end the run; the checks below fail
		}
		_, err := tx.Exec(ctx, `SELECT pg_sleep(5)`)
		if tx.Conn().IsClosed() {
			closed.Add(1)
		}
		return err
	})
	// T00001 and T00005 share partition 1.
	res := consumertest.Run(t, consumer.Config[pgx.Tx]{
		Name: "payments", Store: st, Handler: h, Key: consumer.ByJSONField("txn_id"),
		Middleware: []consumer.Middleware[pgx.Tx]{consumer.Timeout[pgx.Tx](200 * time.Millisecond)},
		Retry:      consumer.RetryPolicy{MaxAttempts: maxAttempts}, Logger: quiet,
	}, consumertest.Script{}, rig.messages(8)...)
	t.Log(res, "handler runs:", calls.Load())
	seen := st.log()
	for _, s := range seen {
		t.Log("classified", s)
	}
	if closed.Load() == 0 {
		t.Fatal("the timeout did not close the connection: the test proved nothing")
	}
	for _, s := range seen {
		if strings.HasPrefix(s, dedup.ClassUnavailable.String()) {
			t.Errorf("a handler's timeout was classified as the database being unavailable: %s", s)
		}
	}
	if calls.Load() != maxAttempts || len(res.DeadLetters) != 1 || res.DeadLetters[0].Key.ID != "T00001" || res.DeadLetters[0].Attempts != maxAttempts {
		t.Fatalf("handler ran %d times, dead letters %+v; want %d runs and T00001 dead-lettered", calls.Load(), res.DeadLetters, maxAttempts)
	}
	if !errors.Is(res.DeadLetters[0].Reason, context.DeadlineExceeded) {
		t.Errorf("dead letter reason %v, want the deadline", res.DeadLetters[0].Reason)
	}
	var n int64
	if err := rig.check.QueryRow(context.Background(), `SELECT count(*) FROM `+rig.table+` WHERE txn_id <> 'T00001'`).Scan(&n); err != nil || n != 7 {
		t.Fatalf("effects %d (%v), want the other 7", n, err)
	}
}

// TestHandlerTimeoutDuringOutageIsWaitedOut: a handler's statement that hangs
// because the database went away ends at the handler's deadline, which
// looks like the handler overrunning. The store pings before it blames the
// message: the database does not answer, so it is a lost connection, waited
// out, and the message is applied once the database is back — with
// Retry.MaxAttempts 1, where any attempt counted against it dead-letters it.
// The outage lasts until the hung statement has been judged, however long
// closing the hung connection takes on a loaded machine.
func TestHandlerTimeoutDuringOutageIsWaitedOut(t *testing.T) {
	o := newOutageRig(t, "idem-fault-timeout-outage")
	o.run(t, func(gc *gatedConn) {
		go func() {
			o.waitJudged(t)
			o.down.Store(false)
			gc.hang.Store(false)
		}()
	})
}

// TestHandlerTimeoutAfterShortOutageIsWaitedOut: the outage is over before
// the handler's deadline, so the ping after it finds the database back. The
// hung statement's connection was still broken by the outage, and so was
// another transaction's: the store judges by that evidence, not by when its
// ping happens to run. (Before, this dead-lettered the message: the verdict
// depended on the timing.)
func TestHandlerTimeoutAfterShortOutageIsWaitedOut(t *testing.T) {
	o := newOutageRig(t, "idem-fault-short-outage")
	o.run(t, func(gc *gatedConn) {
		// Another transaction meets the outage and loses its connection...
		err := o.spy.InTx(context.Background(), func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `SELECT 1`)
			return err
		})
		if o.spy.Store.ClassifyError(err) != dedup.ClassUnavailable {
			panic(fmt.Sprintf("a transaction during the outage: %v, want a lost connection", err))
		}
		// ...and the database is back before the hung statement's deadline;
		// its answer never comes.
		o.down.Store(false)
		go func() {
			o.waitJudged(t)
			gc.hang.Store(false)
		}()
	})
}

// outageRig is a consumer whose store's connections go through gatedConns:
// the test takes the database away without a reset.
type outageRig struct {
	faultRig
	down atomic.Bool
	spy  *classSpy
}

func newOutageRig(t *testing.T, app string) *outageRig {
	o := &outageRig{faultRig: newFaultRig(t, app)}
	cfg, err := pgxpool.ParseConfig(testenv.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	dial := cfg.ConnConfig.DialFunc
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if o.down.Load() {
			return nil, errors.New("dial: connection refused (the database is gone)")
		}
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &gatedConn{Conn: c, down: &o.down}, nil
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	st, err := pgstore.New(pool, pgstore.Config{Schema: o.schema})
	if err != nil {
		t.Fatal(err)
	}
	o.spy = &classSpy{Store: st}
	return o
}

// run consumes 8 payments; the first run of T00001's handler hangs its own
// statement, takes the database away and calls outage to plan the way back.
// The handler's deadline (consumer.Timeout) applies to that run only: the
// others get a generous one, so that a slow statement on a loaded machine
// is not taken for the fault.
func (o *outageRig) run(t *testing.T, outage func(gc *gatedConn)) {
	t.Helper()
	effect := insertEffect(o.table)
	var hung atomic.Bool
	h := consumer.HandlerFunc[pgx.Tx](func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if id, _ := consumer.ByJSONField("txn_id")(m); id == "T00001" && hung.CompareAndSwap(false, true) {
			gc, ok := tx.Conn().PgConn().Conn().(*gatedConn)
			if !ok {
				return consumer.Permanent(fmt.Errorf("the connection is a %T, not the test's", tx.Conn().PgConn().Conn()))
			}
			gc.hang.Store(true) // this statement gets no answer
			o.down.Store(true)
			outage(gc)
			ctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
			defer cancel()
			if _, err := tx.Exec(ctx, `SELECT 1`); err != nil {
				return err
			}
		}
		return effect(ctx, tx, m)
	})
	res := consumertest.Run(t, consumer.Config[pgx.Tx]{
		Name: "payments", Store: o.spy, Handler: h, Key: consumer.ByJSONField("txn_id"),
		Middleware: []consumer.Middleware[pgx.Tx]{consumer.Timeout[pgx.Tx](30 * time.Second)},
		Retry:      consumer.RetryPolicy{MaxAttempts: 1}, Logger: quiet,
	}, consumertest.Script{}, o.messages(8)...)
	if !hung.Load() {
		t.Fatal("the handler never hung: the test proved nothing")
	}
	seen := o.spy.log()
	judged := slices.IndexFunc(seen, isDeadlineVerdict)
	if judged < 0 || !strings.HasPrefix(seen[judged], dedup.ClassUnavailable.String()) {
		t.Errorf("the hung statement was not judged unavailable: %q", seen)
	}
	if len(res.DeadLetters) != 0 {
		t.Fatalf("dead-lettered over an outage: %+v; classified: %q", res.DeadLetters, seen)
	}
	o.checkOnce(t, 8)
}

// isDeadlineVerdict: the classification of the hung statement.
func isDeadlineVerdict(s string) bool { return strings.Contains(s, context.DeadlineExceeded.Error()) }

// waitJudged waits until the consumer classified the hung statement's error.
func (o *outageRig) waitJudged(t *testing.T) {
	for end := time.Now().Add(time.Minute); !slices.ContainsFunc(o.spy.log(), isDeadlineVerdict); {
		if time.Now().After(end) {
			t.Error("the hung statement was not judged within a minute")
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// gatedConn is a connection to a database that may be gone. While down is
// set, writes fail and no dial succeeds; a connection with hang set gets no
// answer: its reads hang until the deadline pgx sets when the statement's
// context ends.
type gatedConn struct {
	net.Conn
	down     *atomic.Bool
	hang     atomic.Bool
	deadline atomic.Pointer[time.Time] // the read deadline pgx last set
}

var errGone = errors.New("connection reset (the database is gone)")

func (c *gatedConn) Read(b []byte) (int, error) {
	for c.hang.Load() {
		if d := c.deadline.Load(); d != nil && !d.IsZero() && time.Now().After(*d) {
			return 0, os.ErrDeadlineExceeded
		}
		time.Sleep(time.Millisecond)
	}
	return c.Conn.Read(b)
}

func (c *gatedConn) Write(b []byte) (int, error) {
	if c.down.Load() && !c.hang.Load() {
		return 0, errGone
	}
	return c.Conn.Write(b)
}

func (c *gatedConn) SetDeadline(t time.Time) error {
	c.deadline.Store(&t)
	return c.Conn.SetDeadline(t)
}

func (c *gatedConn) SetReadDeadline(t time.Time) error {
	c.deadline.Store(&t)
	return c.Conn.SetReadDeadline(t)
}

// TestOverrunsDoNotExcuseEachOther: a transaction whose handler overran on a
// healthy database is judged lost only on evidence — its own connection
// dying, a failed ping, another transaction's connection dying meanwhile —
// and such a verdict is no evidence for others. Before (found by review), it
// counted as a loss itself: after one unrelated dropped connection, handlers
// that always overrun excused each other for ever and their lanes never
// moved on.
func TestOverrunsDoNotExcuseEachOther(t *testing.T) {
	rig := newFaultRig(t, "idem-fault-overrun-chain")
	const maxAttempts, ceiling, lanes = 3, 30, 4
	var mu sync.Mutex
	calls := map[string]int{}
	var dropOnce sync.Once
	dropped := make(chan bool, 1)
	h := consumer.HandlerFunc[pgx.Tx](func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		id, _ := consumer.ByJSONField("txn_id")(m)
		mu.Lock()
		calls[id]++
		n, all := calls[id], len(calls) == lanes
		mu.Unlock()
		if n > ceiling {
			return consumer.Permanent(errors.New("retried without bound")) // ends the run; the check below fails
		}
		if all {
			dropOnce.Do(func() {
				go func() { // one unrelated connection dies while the handlers overrun
					err := rig.st.InTx(context.Background(), func(ctx context.Context, tx pgx.Tx) error {
						_, err := tx.Exec(ctx, `SELECT pg_terminate_backend(pg_backend_pid())`)
						return err
					})
					dropped <- rig.st.ClassifyError(err) == dedup.ClassUnavailable
				}()
			})
		}
		_, err := tx.Exec(ctx, `SELECT pg_sleep(5)`)
		return err
	})
	var msgs []*consumer.Message
	for i := range lanes {
		msgs = append(msgs, consumertest.Message("payments", int32(i), 0, "", fmt.Sprintf(`{"txn_id":"P%d"}`, i+1)))
	}
	res := consumertest.Run(t, consumer.Config[pgx.Tx]{
		Name: "payments", Store: rig.st, Handler: h, Key: consumer.ByJSONField("txn_id"),
		Middleware: []consumer.Middleware[pgx.Tx]{consumer.Timeout[pgx.Tx](300 * time.Millisecond)},
		Retry:      consumer.RetryPolicy{MaxAttempts: maxAttempts}, Logger: quiet,
	}, consumertest.Script{}, msgs...)
	if !<-dropped {
		t.Fatal("the unrelated connection was not lost: the test proved nothing")
	}
	mu.Lock()
	defer mu.Unlock()
	for id, n := range calls {
		// One overrun may be excused by the drop; the rest count.
		if n > maxAttempts+1 {
			t.Errorf("%s: handler ran %d times for Retry.MaxAttempts %d", id, n, maxAttempts)
		}
	}
	if len(res.DeadLetters) != lanes {
		t.Errorf("%d dead letters, want the %d overrunning messages", len(res.DeadLetters), lanes)
	}
}
