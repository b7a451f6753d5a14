package channels_test

// The consumer of TestShuffledStreamSurvivesKills runs in children — the
// test binary re-executed (testenv.ChildMain) — so that the test can
// SIGKILL it mid-stream: no stop, no offset commit, transactions cut off
// wherever they were.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/signal"
	"regexp"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	kafkago "github.com/segmentio/kafka-go"

	"github.com/idemkit/idem/adapters/kafka"
	"github.com/idemkit/idem/adapters/rocketmq"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/wire"
	"github.com/idemkit/idem/dedup/pgstore"
	"github.com/idemkit/idem/examples/channels"
	"github.com/idemkit/idem/examples/payments"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/internal/testenv/pgtest"
	"github.com/idemkit/idem/internal/testenv/rmqtest"
)

// childEnv gives a child its killSpec.
const childEnv = "IDEM_CHANNELS_CHILD"

// killSpec is what a child consumes.
type killSpec struct {
	Broker  string   // "kafka" or "rocketmq"
	Brokers []string // Kafka's
	Namesrv []string // RocketMQ's
	Topic   string
	Group   string
	PgURL   string
	Schema  string
	// NoEntity runs the consumer without the channel's entity order
	// (consumer.Config.Entity nil): what the test shows failing.
	NoEntity bool
}

// run is the child's main: Alipay's consumer (channels.Config) from Kafka,
// or from RocketMQ in concurrent mode (no order within a queue), into
// Postgres, until SIGTERM or SIGKILL.
func (spec *killSpec) run() error {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	pcfg, err := pgxpool.ParseConfig(spec.PgURL)
	if err != nil {
		return err
	}
	pcfg.ConnConfig.RuntimeParams["search_path"] = spec.Schema
	pcfg.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	store, err := pgstore.New(pool, pgstore.Config{Schema: spec.Schema})
	if err != nil {
		return err
	}
	cfg := channels.Config(alipay(), func(tx pgx.Tx) payments.DB { return payments.Pgx(tx) })
	switch spec.Broker {
	case "kafka":
		src, err := kafka.New(kafka.Config{Brokers: spec.Brokers, Topics: []string{spec.Topic}, Group: spec.Group,
			MaxWait: 100 * time.Millisecond, RequestTimeout: 3 * time.Second, ReconnectBackoff: 200 * time.Millisecond,
			SessionTimeout: 6 * time.Second, HeartbeatInterval: 200 * time.Millisecond, RebalanceTimeout: 10 * time.Second,
			JoinGroupBackoff: 200 * time.Millisecond, CloseTimeout: 5 * time.Second, Logger: log})
		if err != nil {
			return err
		}
		cfg.Source, cfg.DeadLetter = src, src
	case "rocketmq":
		rocketmq.SetClientLogger(slog.New(slog.NewTextHandler(io.Discard, nil)), slog.LevelError)
		src, err := rocketmq.New(rocketmq.Config{NameServers: spec.Namesrv, Group: spec.Group, Topics: []string{spec.Topic}, Logger: log})
		if err != nil {
			return err
		}
		cfg.Source, cfg.DeadLetter = src, src
	default:
		return fmt.Errorf("no broker %q", spec.Broker)
	}
	cfg.Store, cfg.Logger = store, log
	if spec.NoEntity {
		cfg.Entity = nil
	}
	c, err := consumer.New(cfg)
	if err != nil {
		return err
	}
	return c.Run(ctx)
}

// scope is Alipay's consumer's name: the dedup scope.
const scope = "alipay-callbacks"

func alipay() channels.Alipay { return channels.Alipay{Secret: channels.TestKeys().Alipay} }

// killCopies is how many times the stream holds Alipay's scenarios (31
// orders each); IDEM_TEST_CHANNELS_KILL sets it.
func killCopies(t *testing.T) int {
	n := 12
	if v := os.Getenv("IDEM_TEST_CHANNELS_KILL"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 {
			t.Fatalf("IDEM_TEST_CHANNELS_KILL=%q: want a number of copies, at least 1", v)
		}
	}
	return n
}

// TestShuffledStreamSurvivesKills is issue 40's held-out channels test on
// real services: Alipay's notifications of a few hundred orders, every
// re-send as the channel's schedule sends it, shuffled (an order's
// payment, finish, close and partial refunds in any order) across four
// partitions, produced while the consumer — a child process — is
// SIGKILLed three times mid-stream and replaced. Once every record is
// acknowledged: every order is in the status its newest genuine event
// names; the money, ledger and dedup keys reconcile (nothing applied twice,
// nothing lost); the store recorded stale events, each at or below its
// order's watermark; and only the forged and mis-paid callbacks (and a
// partial refund that came ahead of its payment) are dead-lettered.
func TestShuffledStreamSurvivesKills(t *testing.T) {
	noEntity := os.Getenv("IDEM_TEST_CHANNELS_NO_ENTITY") != "" // shows the test failing
	for _, b := range []struct {
		name string
		bus  func(*testing.T) bus
	}{{"kafka", kafkaBus}, {"rocketmq", rocketmqBus}} {
		t.Run(b.name, func(t *testing.T) {
			f, shuffled := killStream(t, killCopies(t))
			k := runKilled(t, b.bus(t), f, shuffled, noEntity)
			k.check(t, f)
		})
	}
}

// killStream is Alipay's stream of copies times its scenarios, and the
// same deliveries shuffled (seeded: the same on every run). Lines keep
// their number in the gateway's order.
func killStream(t *testing.T, copies int) (channels.Fixture, []channels.Delivery) {
	t.Helper()
	f, err := channels.GenerateMany("alipay", channels.TestKeys(), copies, 40)
	if err != nil {
		t.Fatal(err)
	}
	shuffled := append([]channels.Delivery(nil), f.Stream...)
	rng := rand.New(rand.NewPCG(40, 50))
	rng.Shuffle(len(shuffled), func(a, b int) { shuffled[a], shuffled[b] = shuffled[b], shuffled[a] })
	t.Logf("%d orders, %d deliveries: %v", len(f.Orders), len(f.Stream), f.Expected.Fields)
	return f, shuffled
}

// killed is what a run left: its tables and its dead letters, by line.
type killed struct {
	pool       *pgxpool.Pool
	store      *pgstore.Store
	schema     string
	letters    map[int]string // line -> the letter's reason
	kills      int
	deliveries int
}

// bus is a broker's side of the test: a topic of 4 partitions (queues)
// with its dead-letter topic, and the group's progress on it.
type bus struct {
	spec killSpec // Broker, Brokers or Namesrv, Topic and Group
	// produce sends deliveries, each with its line in a header, spread
	// over the partitions by line, not by order.
	produce func(ds []channels.Delivery)
	// acknowledged returns how many records the group has committed, and
	// how many the topic holds.
	acknowledged func() (acked, produced int64, err error)
	// letters returns the dead letters' reasons by line.
	letters func() map[int]string
}

func kafkaBus(t *testing.T) bus {
	brokers := testenv.KafkaBrokers(t)
	a := newAdmin(t, brokers)
	topic := topicName(t)
	a.createTopic(t, topic, partitions)
	a.createTopic(t, topic+".dlq", 1)
	return bus{
		spec: killSpec{Broker: "kafka", Brokers: brokers, Topic: topic, Group: topic},
		produce: func(ds []channels.Delivery) {
			msgs := make([]kafkago.Message, 0, len(ds))
			for _, d := range ds {
				line := []byte(strconv.Itoa(d.Line))
				msgs = append(msgs, kafkago.Message{Key: line, Value: []byte(d.Value), Headers: []kafkago.Header{{Key: lineHeader, Value: line}}})
			}
			a.produce(t, topic, msgs)
		},
		acknowledged: func() (acked, produced int64, err error) {
			hwm, committed, err := a.offsets(timeout(t, 10*time.Second), topic, topic, partitions)
			for p := range hwm {
				produced += hwm[p]
				acked += max(committed[p], 0)
			}
			return acked, produced, err
		},
		letters: func() map[int]string {
			out := map[int]string{}
			for _, m := range a.readAll(t, topic+".dlq") {
				line, reason := letterHeader(m, wire.MetaReason)
				out[line] = reason
			}
			return out
		},
	}
}

func rocketmqBus(t *testing.T) bus {
	b := rmqtest.Shared(t)
	topic := testenv.Name(t, "channels")
	mqs := b.CreateTopic(t, topic, partitions)
	b.CreateTopic(t, topic+"_DLQ", 1)
	p := b.NewProducer(t, producer.WithQueueSelector(producer.NewManualQueueSelector()))
	group := testenv.Name(t, "group")
	return bus{
		spec: killSpec{Broker: "rocketmq", Namesrv: b.NameServers, Topic: topic, Group: group},
		produce: func(ds []channels.Delivery) {
			byQueue := make([][]*primitive.Message, len(mqs)) // in order within each queue, sent in batches
			for _, d := range ds {
				m := primitive.NewMessage(topic, []byte(d.Value))
				m.WithProperty(lineHeader, strconv.Itoa(d.Line))
				q := d.Line % len(mqs)
				m.Queue = mqs[q]
				byQueue[q] = append(byQueue[q], m)
			}
			for _, msgs := range byQueue {
				rmqtest.Send(t, p, msgs...)
			}
		},
		acknowledged: func() (acked, produced int64, err error) {
			for q := range partitions {
				hi, err := b.MaxOffset(topic, q)
				if err != nil {
					return 0, 0, err
				}
				off, ok, err := b.ConsumerOffset(group, topic, q)
				if err != nil {
					return 0, 0, err
				}
				if ok {
					acked += off
				}
				produced += hi
			}
			return acked, produced, nil
		},
		letters: func() map[int]string {
			out := map[int]string{}
			for _, m := range b.ReadAll(t, topic+"_DLQ") {
				reason, _ := m.Header(wire.MetaReason)
				out[lineOf(m)] = string(reason)
			}
			return out
		},
	}
}

// runKilled produces shuffled to the bus in four parts while a child
// consumes it, SIGKILLs the child halfway through each of the first three
// parts (by the dedup keys committed) and starts another, and waits until
// every record is acknowledged.
func runKilled(t *testing.T, b bus, f channels.Fixture, shuffled []channels.Delivery, noEntity bool) *killed {
	pool, schema := database(t, f)
	store := pgtest.Store(t, pool, schema)
	spec := b.spec
	spec.PgURL, spec.Schema, spec.NoEntity = testenv.PostgresURL(t), schema, noEntity
	start := func() *testenv.Child { return testenv.StartChild(t, testenv.SpecEnv(t, childEnv, spec)) }

	k := &killed{pool: pool, store: store, schema: schema, deliveries: len(shuffled)}
	child := start()
	alive := func() {
		if child.Exited() {
			t.Fatalf("the child consumer exited: %v\n%s", child.Err(), child.Out.String())
		}
	}
	// Progress is the dedup keys the consumers committed (the broker's
	// offsets lag: RocketMQ's client persists them every few seconds).
	claimed := func() int {
		var n int
		if err := pool.QueryRow(timeout(t, 10*time.Second), `SELECT count(*) FROM `+store.Table()+` WHERE scope = $1`, scope).Scan(&n); err != nil {
			t.Fatalf("progress: %v", err)
		}
		return n
	}
	keys := map[string]bool{} // the keys of the genuine deliveries sent
	keysUpTo := func(n int) int {
		for _, d := range shuffled[:n] {
			if d.Forged == "" && d.Wrong == "" {
				keys[d.Event] = true
			}
		}
		return len(keys)
	}
	const parts = 4
	sent := 0
	for part := range parts {
		next := len(shuffled) * (part + 1) / parts
		b.produce(shuffled[sent:next])
		// Halfway through the part's new keys.
		before := len(keys)
		target := before + (keysUpTo(next)-before)/2
		sent = next
		if part == parts-1 {
			break
		}
		// Or once the part is acknowledged: a consumer that refuses events
		// (NoEntity) commits fewer keys.
		waitUntil(t, 2*time.Minute, fmt.Sprintf("%d keys committed before kill %d", target, part+1), func() bool {
			alive()
			if claimed() >= target {
				return true
			}
			acked, produced, err := b.acknowledged()
			return err == nil && produced == int64(sent) && acked == produced
		})
		child.Kill()
		if !child.Killed() {
			t.Fatalf("child %d did not die by SIGKILL: %v", part+1, child.Err())
		}
		k.kills++
		t.Logf("kill %d: %d of the %d keys sent committed", k.kills, claimed(), len(keys))
		child = start()
	}
	waitUntil(t, 3*time.Minute, "every record is acknowledged", func() bool {
		alive()
		acked, produced, err := b.acknowledged()
		return err == nil && produced == int64(len(shuffled)) && acked == produced
	})
	child.Signal(syscall.SIGTERM)
	if !child.WaitExit(30 * time.Second) {
		t.Errorf("the last child did not stop within 30s of SIGTERM")
	}
	if err := child.Err(); err != nil {
		t.Errorf("the last child: %v\n%s", err, child.Out.String())
	}
	k.letters = b.letters()
	return k
}

// orderDependent are Reconcile's problems that depend on the order in
// which an order's events arrived (which is shuffled): the transitions an
// order went through, how many events were recorded or found stale, and
// the partial refunds (checked on their own below).
var orderDependent = regexp.MustCompile(`^(order \S+ moved |\d+ events recorded \(|\d+ stale events recorded, want |order \S+ has \d+ refunded in part|balance of )`)

// check asserts the run's end state on data.
func (k *killed) check(t *testing.T, f channels.Fixture) {
	t.Helper()
	ctx := timeout(t, time.Minute)
	ch := alipay()
	if k.kills != 3 {
		t.Errorf("%d kills, want 3", k.kills)
	}

	// Every order in the status its newest genuine event names.
	(&result{pool: k.pool}).checkNewest(t, ch, f)

	// The tables reconcile but for what the arrival order decides.
	staleTable := pgx.Identifier{k.schema, "idem_dedup_stale"}.Sanitize()
	marksTable := pgx.Identifier{k.schema, "idem_dedup_watermarks"}.Sanitize()
	report, err := channels.Reconcile(ctx, payments.Pgx(k.pool), k.store.Table(), staleTable, scope, f.Expected)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range report.Problems {
		if !orderDependent.MatchString(p) {
			t.Errorf("does not reconcile: %s", p)
		}
	}

	// Lines by what they carry.
	kind := map[int]channels.Kind{}
	order := map[int]string{}
	for _, d := range f.Stream {
		ev, err := ch.Decode([]byte(d.Value))
		if err != nil {
			t.Fatalf("line %d: %v", d.Line, err)
		}
		kind[d.Line], order[d.Line] = ev.Kind, ev.Order
	}

	// Dead letters: every forged and mis-paid callback, and else only a
	// partial refund that came ahead of its order's payment (refused:
	// nothing to refund yet).
	lateRefunds := map[string]bool{} // orders with a partial refund dead-lettered
	for _, d := range f.Stream {
		reason, lettered := k.letters[d.Line]
		switch {
		case d.Forged != "" || d.Wrong != "":
			if !lettered {
				t.Errorf("line %d (%s, forged %q, wrong %q) was not dead-lettered", d.Line, d.Event, d.Forged, d.Wrong)
			}
		case !lettered:
		case kind[d.Line] == channels.PartialRefund:
			lateRefunds[d.Order] = true
		default:
			t.Errorf("line %d (%s, attempt %d) dead-lettered: %s", d.Line, d.Event, d.Attempt, reason)
		}
	}

	// A partial refund lost that way is the only difference in money:
	// refunded in part no more than the stream's, and each account's
	// balance short by exactly the refunds lost.
	type got struct {
		ID, Account string
		Refunded    int64
	}
	rows, err := k.pool.Query(ctx, `SELECT id, account_id, refunded FROM orders`)
	if err != nil {
		t.Fatal(err)
	}
	orders, err := pgx.CollectRows(rows, pgx.RowToStructByPos[got])
	if err != nil {
		t.Fatal(err)
	}
	wantRefunded := map[string]int64{}
	for _, o := range f.Expected.Orders {
		wantRefunded[o.ID] = o.Refunded
	}
	short := map[string]int64{}
	lost := 0
	for _, o := range orders {
		if o.Refunded == wantRefunded[o.ID] {
			continue
		}
		lost++
		if o.Refunded > wantRefunded[o.ID] || !lateRefunds[o.ID] {
			t.Errorf("order %s has %d refunded in part, want %d (partial refunds dead-lettered: %v)", o.ID, o.Refunded, wantRefunded[o.ID], lateRefunds[o.ID])
		}
		short[o.Account] += wantRefunded[o.ID] - o.Refunded
	}
	for account, want := range f.Expected.Balances {
		var balance int64
		if err := k.pool.QueryRow(ctx, `SELECT balance FROM accounts WHERE id = $1`, account).Scan(&balance); err != nil {
			t.Fatal(err)
		}
		if balance != want+short[account] {
			t.Errorf("balance of %s is %d, want %d (%d of partial refunds lost ahead of their payments)", account, balance, want+short[account], short[account])
		}
	}

	// Stale events: some, each at or below its order's watermark.
	var stale, above int64
	err = k.pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE w.entity IS NULL OR (s.major, s.minor) > (w.major, w.minor))
FROM `+staleTable+` s LEFT JOIN `+marksTable+` w ON w.scope = s.scope AND w.entity = s.entity WHERE s.scope = $1`, scope).Scan(&stale, &above)
	if err != nil {
		t.Fatal(err)
	}
	if stale == 0 || above != 0 {
		t.Errorf("%d stale events recorded, %d of them above their order's watermark; want some, none above", stale, above)
	}
	t.Logf("%d deliveries, %d kills: %d events (%d applied, %d recorded), %d stale, %d lines dead-lettered, %d orders lost a partial refund ahead of its payment",
		k.deliveries, k.kills, report.Events, report.Applied, report.Recorded, stale, len(k.letters), lost)
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Error("the checks ran out of time")
	}
}
