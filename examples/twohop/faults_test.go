package twohop_test

// The relay's faults, on Kafka and RocketMQ, each followed by the two-hop
// reconciliation: every payment booked once, every paid order shipped once
// by its payment's event, nothing left in the outbox.

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/internal/testenv/relaytest"
	"github.com/idemkit/idem/internal/testenv/rmqtest"
	"github.com/idemkit/idem/outbox"
)

// book runs the first hop over msgs in the background: each callback
// delivered one to three times, with lost acks.
func (w *world) book(t *testing.T, topic string, msgs []*consumer.Message) <-chan consumertest.Result {
	done := make(chan consumertest.Result, 1)
	cfg := w.paymentsConfig(t, topic)
	go func() {
		res, err := consumertest.Drive(context.Background(), cfg,
			consumertest.Script{MinDeliveries: 1, MaxDeliveries: 3, ReorderWindow: 4, CrashAfterCommitEvery: 5, Seed: 7}, msgs...)
		if err != nil {
			res.DeadLetters = append(res.DeadLetters, consumer.Letter{Reason: err})
		}
		done <- res
	}()
	return done
}

func waitBooked(t *testing.T, done <-chan consumertest.Result) consumertest.Result {
	t.Helper()
	select {
	case res := <-done:
		for _, l := range res.DeadLetters {
			if l.Message == nil {
				t.Fatalf("first hop: %v", l.Reason)
			}
		}
		return res
	case <-time.After(3 * time.Minute):
		t.Fatal("the first hop did not settle within 3 minutes")
		return consumertest.Result{}
	}
}

// TestRelayKilledBetweenPublishAndMark: relay processes are killed with
// SIGKILL right after the broker acknowledged a batch and before the relay
// marked it, twice; then two relays at once finish. The killed batches are
// on the topic twice — the relay did republish, with the same identities —
// and shipping skipped the copies: each paid order shipped once.
func TestRelayKilledBetweenPublishAndMark(t *testing.T) {
	for _, name := range brokers {
		t.Run(name, func(t *testing.T) {
			b := newBroker(t, name)
			pool, schema := testenv.SchemaPool(t)
			w := newWorld(t, pool, schema, 300, 21)
			topic := b.newTopic(t)
			ship := startShipping(t, w, b.source(t, topic))
			booked := w.book(t, topic, w.callbacks())

			dir := t.TempDir()
			spec := childSpec{Broker: b.name(), Addrs: b.addrs(), PgURL: testenv.PostgresURL(t), Schema: schema,
				App: testenv.Name(t, "relay"), BatchSize: 40}
			var killed []string
			for i, after := range []int{30, 80} {
				spec.KillAfter, spec.KilledLog = after, filepath.Join(dir, "killed-"+strconv.Itoa(i))
				startRelayChild(t, spec).waitKilled(t, 3*time.Minute)
				ids := readLines(t, spec.KilledLog)
				t.Logf("relay %d killed after publishing %d records, the last %d unmarked", i+1, after, len(ids))
				killed = append(killed, ids...)
			}
			spec.KillAfter = 0
			a, c := startRelayChild(t, spec), startRelayChild(t, spec)
			waitBooked(t, booked)
			testenv.WaitUntilProgress(t, 3*time.Minute, "the outbox drained", func() (bool, string) {
				n := relaytest.Pending(t, pool, w.ob)
				return n == 0, fmt.Sprintf("%d pending", n)
			})
			a.terminate(t)
			c.terminate(t)

			copies := ship.waitShipped(t, w, b, topic)
			republished := check(t, w, ship, copies)
			if len(killed) == 0 {
				t.Fatal("the killed relays published nothing unmarked: the test proves nothing")
			}
			for _, id := range killed {
				if copies[id] < 2 {
					t.Errorf("event %s, published by a killed relay and never marked, is on the topic %d time(s): not republished", id, copies[id])
				}
			}
			if republished < len(killed) {
				t.Errorf("%d copies on the topic for %d unmarked events", republished, len(killed))
			}
		})
	}
}

// TestRelayBrokerDown: the broker is killed (SIGKILL) while the relay
// works, and half of the payments are booked while it is down: their
// events wait in the outbox, retried with backoff, and are published once
// it is back. Kafka: the shared broker, under testenv.KafkaExclusive;
// RocketMQ: a private name server and broker.
func TestRelayBrokerDown(t *testing.T) {
	for _, name := range brokers {
		t.Run(name, func(t *testing.T) {
			var b broker
			var kill, restart func()
			switch name {
			case "kafka":
				k := relaytest.NewKafka(t, testenv.KafkaExclusive(t))
				testenv.Script(t, "kafka", "status")
				t.Cleanup(func() { testenv.Script(t, "kafka", "start") }) // whatever happened, leave a broker running
				b = &kafkaBroker{k: k}
				kill = func() { testenv.Script(t, "kafka", "kill") }
				restart = func() { testenv.Script(t, "kafka", "start"); k.CloseIdle() }
			default:
				testenv.RocketMQNamesrv(t) // skips (fails under CI) without RocketMQ
				p := rmqtest.NewPrivate(t)
				b = &rocketBroker{r: rmqtest.Open(t, p.NameServers())}
				kill, restart = p.KillBroker, p.StartBroker
			}
			pool, schema := testenv.SchemaPool(t)
			w := newWorld(t, pool, schema, 300, 31)
			topic := b.newTopic(t)
			ship := startShipping(t, w, b.source(t, topic))
			relay := relaytest.StartRelay(t, outbox.RelayConfig{Outbox: w.ob, Publisher: b.publisher(t), BatchSize: 40,
				PublishTimeout: 10 * time.Second, Backoff: consumer.RetryPolicy{Initial: 50 * time.Millisecond, Max: time.Second}})

			msgs := w.callbacks()
			half := len(msgs) / 2
			first := waitBooked(t, w.book(t, topic, msgs[:half]))
			testenv.WaitUntilProgress(t, 2*time.Minute, "the first half's events published", func() (bool, string) {
				n := relaytest.Pending(t, pool, w.ob)
				return n == 0, fmt.Sprintf("%d pending", n)
			})
			kill()
			second := waitBooked(t, w.book(t, topic, msgs[half:]))
			if n := first.Stats.Applied + second.Stats.Applied; n != int64(len(w.stream.Expected)) {
				t.Fatalf("first hop applied %d of %d payments", n, len(w.stream.Expected))
			}
			waiting := relaytest.Pending(t, pool, w.ob)
			failed := relay.Stats().Failed
			testenv.WaitUntilProgress(t, 2*time.Minute, "the relay tries and fails while the broker is down", func() (bool, string) {
				st := relay.Stats()
				return st.Failed >= failed+int64(waiting), fmt.Sprintf("stats %+v, %d waiting", st, waiting)
			})
			if n := relaytest.Pending(t, pool, w.ob); waiting == 0 || n != waiting || len(relaytest.DeadLetters(t, pool, w.ob)) != 0 {
				t.Fatalf("%d events booked while the broker was down, %d pending now, dead letters %v: they must wait",
					waiting, n, relaytest.DeadLetters(t, pool, w.ob))
			}
			t.Logf("%d events waited out the broker, %d failed publishes", waiting, relay.Stats().Failed)
			restart()
			testenv.WaitUntilProgress(t, 3*time.Minute, "the outbox drained after the broker came back", func() (bool, string) {
				n := relaytest.Pending(t, pool, w.ob)
				return n == 0, fmt.Sprintf("%d pending, stats %+v", n, relay.Stats())
			})
			check(t, w, ship, ship.waitShipped(t, w, b, topic))
		})
	}
}

// gate is a Publisher that, armed, holds the next Publish until released,
// then publishes and records what that call sent.
type gate struct {
	inner   outbox.Publisher
	armed   atomic.Bool
	entered chan struct{}
	release chan struct{}

	mu   sync.Mutex
	sent []string
}

func (g *gate) Publish(ctx context.Context, recs []outbox.Record, errs []error) {
	held := g.armed.CompareAndSwap(true, false)
	if held {
		g.entered <- struct{}{}
		<-g.release
	}
	g.inner.Publish(ctx, recs, errs)
	if held {
		g.mu.Lock()
		defer g.mu.Unlock()
		for i := range recs {
			if errs[i] == nil {
				g.sent = append(g.sent, recs[i].ID)
			}
		}
	}
}

// TestRelayPostgresRestart: Postgres crashes (immediate shutdown) while a
// relay holds a batch it has read and not yet published; the batch is
// published, marking it fails, and the relay resumes once Postgres is back
// and publishes it again. Then a fast shutdown and restart while shipping
// consumes. A private cluster: the others' tests share the test
// environment's.
func TestRelayPostgresRestart(t *testing.T) {
	for _, name := range brokers {
		t.Run(name, func(t *testing.T) {
			b := newBroker(t, name)
			pg := testenv.NewPrivatePostgres(t)
			ctx := testenv.Context(t, time.Minute)
			cfg, err := pgxpool.ParseConfig(pg.URL())
			if err != nil {
				t.Fatal(err)
			}
			cfg.ConnConfig.RuntimeParams["search_path"] = "twohop"
			cfg.ConnConfig.ConnectTimeout = 5 * time.Second
			cfg.MaxConns = 10
			pool, err := pgxpool.NewWithConfig(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pool.Close)
			if _, err := pool.Exec(ctx, `CREATE SCHEMA twohop`); err != nil {
				t.Fatal(err)
			}
			w := newWorld(t, pool, "twohop", 300, 41)
			topic := b.newTopic(t)
			waitBooked(t, w.book(t, topic, w.callbacks()))
			g := &gate{inner: b.publisher(t), entered: make(chan struct{}), release: make(chan struct{})}
			g.armed.Store(true)
			relay := relaytest.StartRelay(t, outbox.RelayConfig{Outbox: w.ob, Publisher: g, BatchSize: 40, PublishTimeout: 3 * time.Minute,
				Backoff: consumer.RetryPolicy{Initial: 50 * time.Millisecond, Max: time.Second}})
			select {
			case <-g.entered:
			case <-time.After(3 * time.Minute):
				t.Fatal("the relay never published")
			}
			pg.Stop("immediate")
			pg.Start()
			pool.Reset()
			close(g.release)
			testenv.WaitUntilProgress(t, 3*time.Minute, "the relay resumed and drained the outbox", func() (bool, string) {
				var n int
				err := pool.QueryRow(ctx, `SELECT count(*) FROM `+w.ob.Table()).Scan(&n)
				return err == nil && n == 0, fmt.Sprintf("%d pending (%v), stats %+v", n, err, relay.Stats())
			})
			if st := relay.Stats(); st.MarkFailures == 0 {
				t.Fatalf("stats %+v: the held batch's mark did not fail, the restart proved nothing", st)
			}

			ship := startShipping(t, w, b.source(t, topic))
			testenv.WaitUntilProgress(t, 2*time.Minute, "shipping under way", func() (bool, string) {
				return ship.c.Stats().Applied >= 50, ""
			})
			pg.Stop("fast")
			pg.Start()
			pool.Reset()
			copies := ship.waitShipped(t, w, b, topic)
			check(t, w, ship, copies)
			g.mu.Lock()
			defer g.mu.Unlock()
			if len(g.sent) == 0 {
				t.Fatal("the held batch published nothing")
			}
			for _, id := range g.sent {
				if copies[id] < 2 {
					t.Errorf("event %s, published while Postgres restarted and never marked, is on the topic %d time(s)", id, copies[id])
				}
			}
		})
	}
}
