package refunds_test

import (
	"context"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/examples/refunds"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/internal/testenv/kafkatest"
	"github.com/idemkit/idem/internal/testenv/pgtest"
	"github.com/idemkit/idem/internal/testenv/provider"
)

func TestMain(m *testing.M) {
	testenv.ChildMain(childEnv, (*childSpec).run)
	os.Exit(m.Run())
}

const (
	partitions = 4
	refusedOne = 25 // every 25th refund asks too much: the channel refuses it
)

// nRefunds is how many refunds a run asks for: 300 in make test, 2,000 in
// make test-faults (IDEM_TEST_REFUNDS).
var nRefunds = refundsWanted()

func refundsWanted() int {
	v := os.Getenv("IDEM_TEST_REFUNDS")
	if v == "" {
		return 300
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 2*refusedOne {
		panic(fmt.Sprintf("IDEM_TEST_REFUNDS=%q: want a number of refunds, at least %d", v, 2*refusedOne))
	}
	return n
}

// world is one run's services: Postgres, a topic, the provider.
type world struct {
	t      *testing.T
	spec   childSpec
	admin  *kafkatest.Admin
	p      *provider.Server
	store  interface{ dedup.Journal }
	count  func() int // booked refunds
	faults sync.Map
}

func setup(t *testing.T) *world {
	brokers := testenv.KafkaBrokers(t)
	pool, schema := testenv.SchemaPool(t)
	store := pgtest.Store(t, pool, schema)
	ctx := testenv.Context(t, time.Minute)
	if _, err := pool.Exec(ctx, refunds.Schema); err != nil {
		t.Fatal(err)
	}
	admin := kafkatest.NewAdmin(t, brokers)
	topic := testenv.Name(t, "refunds")
	admin.CreateTopic(t, topic, partitions)
	admin.CreateTopic(t, topic+".dlq", partitions)
	// Faults at random, 15% of requests, reproducibly.
	var mu sync.Mutex
	rng := rand.New(rand.NewPCG(39, 2))
	faults := []provider.Fault{provider.TimeoutAfterCommit, provider.DropAfterCommit, provider.Error500AfterCommit, provider.Error500, provider.DropBefore}
	p := provider.Start(t, provider.Config{KeyTTL: keyTTL, ReadLagFor: readLagFor, Fault: func(provider.Request) provider.Fault {
		mu.Lock()
		defer mu.Unlock()
		if rng.Float64() < 0.15 {
			return faults[rng.IntN(len(faults))]
		}
		return provider.None
	}})
	w := &world{t: t, admin: admin, p: p, store: store,
		spec: childSpec{Brokers: brokers, Topic: topic, Group: testenv.Name(t, "g"), PgURL: testenv.PostgresURL(t), Schema: schema, ProviderURL: p.URL()}}
	w.count = func() int {
		var n int
		if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM refunds`).Scan(&n); err != nil {
			t.Logf("count refunds: %v", err)
		}
		return n
	}
	return w
}

func refund(i int) refunds.Request {
	r := refunds.Request{RefundID: fmt.Sprintf("rf-%03d", i), TradeNo: fmt.Sprintf("T-rf-%03d", i), Amount: int64(100 + i)}
	if i%refusedOne == 0 {
		r.Amount = -1
	}
	return r
}

func message(r refunds.Request, partition int) kafkago.Message {
	return kafkago.Message{Partition: partition, Key: []byte(r.RefundID),
		Value: fmt.Appendf(nil, `{"refund_id":%q,"trade_no":%q,"amount":%d}`, r.RefundID, r.TradeNo, r.Amount)}
}

func home(id string) int {
	h := fnv.New32a()
	h.Write([]byte(id))
	return int(h.Sum32() % partitions)
}

// produce sends every refund one to three times to its partition; it
// returns how many messages it sent.
func (w *world) produce(seed uint64) int {
	rng := rand.New(rand.NewPCG(seed, 1))
	var msgs []kafkago.Message
	for i := 1; i <= nRefunds; i++ {
		r := refund(i)
		for range 1 + rng.IntN(3) {
			msgs = append(msgs, message(r, home(r.RefundID)))
		}
	}
	w.admin.Produce(w.t, w.spec.Topic, msgs...)
	return len(msgs)
}

// resend re-sends n refunds at random, each to a random partition: the
// copy runs concurrently with the original's lane.
func (w *world) resend(seed uint64, n int) {
	rng := rand.New(rand.NewPCG(seed, 2))
	var msgs []kafkago.Message
	for range n {
		msgs = append(msgs, message(refund(1+rng.IntN(nRefunds)), rng.IntN(partitions)))
	}
	w.admin.Produce(w.t, w.spec.Topic, msgs...)
}

func (w *world) child(mod func(*childSpec)) *testenv.Child {
	spec := w.spec
	if mod != nil {
		mod(&spec)
	}
	return testenv.StartChild(w.t, testenv.SpecEnv(w.t, childEnv, spec))
}

// byTrade counts the provider's executions per trade.
func (w *world) byTrade() map[string]int {
	n := map[string]int{}
	for _, e := range w.p.Ledger() {
		n[e.TradeNo]++
	}
	return n
}

// TestRefundsExactlyOnce: 300 refund requests (2,000 in make test-faults)
// with duplicates and re-sends, through real Kafka to consumers that die
// by SIGKILL before a call, during it, between the answer and its record,
// and before the business commit, one frozen mid-call as a zombie, the provider
// faulting on 15% of requests and restarted once. On the provider's own
// ledger, every refund is executed exactly once and the refused ones
// never; the zombie's late request is refused by its fencing token; every
// refund is booked once; the journal has no unresolved step.
func TestRefundsExactlyOnce(t *testing.T) {
	w := setup(t)
	sent := w.produce(1)
	// Four children at once, one partition each, each dying at its
	// failpoint: one rebalance to wait out, not four.
	var killed []*testenv.Child
	for i, kill := range []string{killBefore, killDuring, killAfter, killCommit} {
		killed = append(killed, w.child(func(s *childSpec) { s.Kill, s.KillAt = kill, 3+i*2 }))
	}
	for i, c := range killed {
		if !c.WaitExit(90 * time.Second) {
			t.Fatalf("child %d did not reach its failpoint:\n%s", i, c.Out)
		}
		if !c.Killed() {
			t.Fatalf("child %d ended with %v, not SIGKILL:\n%s", i, c.Err(), c.Out)
		}
	}
	w.resend(2, 40)
	// The zombie: a refund the stream ends with, frozen before its first
	// request leaves.
	zombie := refunds.Request{RefundID: "rf-zombie", TradeNo: "T-rf-zombie", Amount: 7}
	w.admin.Produce(t, w.spec.Topic, message(zombie, home(zombie.RefundID)))
	mark := filepath.Join(t.TempDir(), "frozen")
	z := w.child(func(s *childSpec) { s.ZombieTrade, s.ZombieMark = zombie.TradeNo, mark })
	testenv.WaitUntil(t, 2*time.Minute, "the zombie child to freeze mid-call", func() bool {
		_, err := os.Stat(mark)
		return err == nil || z.Exited()
	})
	if z.Exited() {
		t.Fatalf("the zombie child exited: %v\n%s", z.Err(), z.Out)
	}
	last := w.child(nil)
	testenv.WaitUntil(t, 2*time.Minute, "the next holder to execute the zombie's refund", func() bool {
		return w.byTrade()[zombie.TradeNo] > 0
	})
	w.p.Restart(t)
	z.Signal(syscall.SIGCONT)
	// The zombie's late request must be refused by its token; checked
	// without stopping, so that the ledger is checked in any case.
	for deadline := time.Now().Add(30 * time.Second); w.p.Stats().Stale == 0; {
		if time.Now().After(deadline) || z.Exited() {
			t.Errorf("the provider refused no stale token: the zombie's late request went through or never left (%+v, zombie exited %v)\n%s",
				w.p.Stats(), z.Exited(), w.zombieReport(z, zombie))
			break
		}
		time.Sleep(20 * time.Millisecond) // polling the provider's count
	}
	z.Kill()
	testenv.WaitUntilProgress(t, 3*time.Minute, "every refund booked", func() (bool, string) {
		n := w.count()
		return n == nRefunds+1, fmt.Sprintf("%d of %d booked", n, nRefunds+1)
	})
	last.Signal(syscall.SIGTERM)
	if !last.WaitExit(time.Minute) || last.Err() != nil {
		t.Fatalf("the last child did not stop cleanly: %v\n%s", last.Err(), last.Out)
	}

	exec := w.byTrade()
	var twice, lost []string
	for i := 1; i <= nRefunds+1; i++ {
		r := refund(i)
		if i > nRefunds {
			r = zombie
		}
		want := 1
		if r.Amount <= 0 {
			want = 0
		}
		switch got := exec[r.TradeNo]; {
		case got > want:
			twice = append(twice, fmt.Sprintf("%s×%d", r.TradeNo, got))
		case got < want:
			lost = append(lost, r.TradeNo)
		}
	}
	if len(twice) > 0 || len(lost) > 0 {
		t.Errorf("the provider executed %d refunds more than once (%v) and lost %d (%v)", len(twice), twice, len(lost), lost)
	}
	ctx := testenv.Context(t, time.Minute)
	if open, err := w.store.Steps(ctx, dedup.StepFilter{}); err != nil || len(open) > 0 {
		t.Errorf("unresolved steps after the run: %v (%+v)", err, open)
	}
	by, expired, err := w.store.CountSteps(ctx)
	if err != nil {
		t.Fatal(err)
	}
	refused := nRefunds / refusedOne
	if by[dedup.StepSucceeded] != int64(nRefunds-refused+1) || by[dedup.StepFailed] != int64(refused) || expired != 0 {
		t.Errorf("steps by state %v (%d expired), want %d succeeded and %d failed", by, expired, nRefunds-refused+1, refused)
	}
	st := w.p.Stats()
	if st.Found == 0 {
		t.Errorf("no read-back found an execution: no unknown outcome was resolved by one, the faults did not bite (%+v)", st)
	}
	var fs []string
	for f, n := range st.Faults {
		if f != provider.None {
			fs = append(fs, fmt.Sprintf("%v %d", f, n))
		}
	}
	sort.Strings(fs)
	t.Logf("%d messages (+40 re-sends, +1 zombie) for %d refunds; 4 children killed at their failpoints, 1 frozen as a zombie, the provider restarted once; "+
		"provider: %d requests, faults: %s, %d refused as in flight, %d stale tokens, %d read-backs (%d found the execution); executed once each: %d, refused: %d",
		sent, nRefunds+1, st.Requests, strings.Join(fs, ", "), st.InFlight, st.Stale, st.Queries, st.Found, len(exec), refused)
}

// zombieReport says where the zombie's refund stands — its executions on
// the provider's ledger, its step in the journal, the zombie's process
// state — then has the zombie print its goroutines (SIGQUIT) and returns
// the zombie's output.
func (w *world) zombieReport(z *testenv.Child, r refunds.Request) string {
	var b strings.Builder
	for _, e := range w.p.Ledger() {
		if e.TradeNo == r.TradeNo {
			fmt.Fprintf(&b, "ledger: %s executed with token %d at %s\n", e.OutRequestNo, e.Token, e.At.Format(time.RFC3339Nano))
		}
	}
	ctx := testenv.Context(w.t, 10*time.Second)
	steps, err := w.store.Steps(ctx, dedup.StepFilter{States: []dedup.StepState{dedup.StepPending, dedup.StepSucceeded, dedup.StepFailed, dedup.StepUnknown, dedup.StepInDoubt}, Limit: 1000})
	if err != nil {
		fmt.Fprintf(&b, "journal: %v\n", err)
	}
	for _, st := range steps {
		if st.Ref.Key.ID == r.RefundID {
			fmt.Fprintf(&b, "journal: %s %s token %d, %d attempts, error %q\n", st.Ref.Key, st.State, st.Token, st.Attempts, st.Error)
		}
	}
	if stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", z.Cmd.Process.Pid)); err == nil {
		fmt.Fprintf(&b, "zombie process: %s\n", stat)
	}
	if !z.Exited() {
		z.Signal(syscall.SIGCONT)
		z.Signal(syscall.SIGQUIT)
		z.WaitExit(10 * time.Second)
	}
	b.WriteString(z.Out.String())
	return b.String()
}

// TestRefundsWithoutJournalPayTwice is the negative control: the same
// stream and faults, the refund called directly with a fresh request
// number per attempt as handlers without a journal do. The consumer still
// books each refund once, but the provider executes some twice.
func TestRefundsWithoutJournalPayTwice(t *testing.T) {
	w := setup(t)
	w.produce(1)
	c := w.child(func(s *childSpec) { s.Naive = true })
	testenv.WaitUntilProgress(t, 3*time.Minute, "every refund booked", func() (bool, string) {
		n := w.count()
		return n == nRefunds, fmt.Sprintf("%d of %d booked", n, nRefunds)
	})
	c.Signal(syscall.SIGTERM)
	c.WaitExit(time.Minute)
	var twice, extra int
	for _, n := range w.byTrade() {
		if n > 1 {
			twice++
			extra += n - 1
		}
	}
	if twice == 0 {
		t.Fatalf("without the journal no refund was executed twice: the faults did not bite, the control proves nothing")
	}
	t.Logf("without the journal: %d of %d refunds executed more than once (%d extra executions) over %d provider requests",
		twice, nRefunds, extra, w.p.Stats().Requests)
}
