package redisfront_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
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

// releaseRig is a consumer of payments on Postgres with the front on a
// redis-server of the test's own, which the test flushes, restarts, and
// brings back from a snapshot. Every delivery is a pair — the message the
// test is about and a filler of its own — in one batch (BatchSize 2), so
// that a batch always needs a transaction and the message under test is
// answered by Claim, as in a busy stream.
type releaseRig struct {
	t       *testing.T
	redis   *testenv.PrivateRedis
	client  *redis.Client
	pool    *pgxpool.Pool
	schema  string
	front   *redisfront.Store[pgx.Tx]
	src     *consumertest.Source
	offset  int64
	holding chan struct{} // closed when the handler of "hold" runs
	hold    chan struct{} // closed to let it return
}

const rigName = "payments"

func newReleaseRig(t *testing.T) *releaseRig {
	t.Helper()
	r := &releaseRig{t: t, redis: testenv.NewPrivateRedis(t), holding: make(chan struct{}), hold: make(chan struct{})}
	r.client = redis.NewClient(&redis.Options{Addr: r.redis.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1, DialTimeout: time.Second})
	t.Cleanup(func() { r.client.Close() })
	r.pool = testenv.Pool(t)
	r.schema = testenv.Schema(t, r.pool)
	ctx := context.Background()
	st, err := pgstore.New(r.pool, pgstore.Config{Schema: r.schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := r.pool.Exec(ctx, `CREATE TABLE `+r.table("payments")+` (id text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	cfg := frontConfig(r.client, nil)
	cfg.RetryAfter = 50 * time.Millisecond
	r.front = front(t, dedup.Store[pgx.Tx](st), cfg)
	r.src = consumertest.NewSource(consumertest.Script{})
	c, err := consumer.New(consumer.Config[pgx.Tx]{
		Name: rigName, Source: r.src, Store: r.front, Key: consumer.ByJSONField("id"),
		DeadLetter: &consumertest.DeadLetters{}, BatchSize: 2, BatchWait: time.Minute, Logger: quiet,
		Handler: consumer.HandlerFunc[pgx.Tx](func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			id, err := consumer.ByJSONField("id")(m)
			if err != nil {
				return err
			}
			if id == "hold" {
				close(r.holding)
				select {
				case <-r.hold:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			_, err = tx.Exec(ctx, `INSERT INTO `+r.table("payments")+` (id) VALUES ($1)`, id)
			return err
		}),
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := c.Run(runCtx); err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("consumer: %v", err)
		}
	}()
	t.Cleanup(func() { cancel(); wg.Wait() })
	return r
}

func (r *releaseRig) table(name string) string { return pgx.Identifier{r.schema, name}.Sanitize() }

// message is the delivery of payment id at offset (a redelivery repeats
// the offset).
func (r *releaseRig) message(id string, offset int64) *consumer.Message {
	return consumertest.Message("payments", 0, offset, "", fmt.Sprintf(`{"id":%q}`, id))
}

// filler is a new payment of its own, for the other half of a batch.
func (r *releaseRig) filler() *consumer.Message {
	r.offset++
	return r.message(fmt.Sprintf("filler-%d", r.offset), 1000+r.offset)
}

// deliver pushes m and a filler as one batch; wait waits until they settled.
func (r *releaseRig) deliver(m *consumer.Message) { r.src.Push(m, r.filler()) }

func (r *releaseRig) wait() {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := r.src.WaitIdle(ctx); err != nil {
		r.t.Fatalf("waiting until the deliveries settled: %v", err)
	}
}

// rows counts the business rows and the dedup rows of payment id.
func (r *releaseRig) rows(id string) (business, dedupRows int) {
	r.t.Helper()
	ctx := context.Background()
	if err := r.pool.QueryRow(ctx, `SELECT count(*) FROM `+r.table("payments")+` WHERE id = $1`, id).Scan(&business); err != nil {
		r.t.Fatal(err)
	}
	if err := r.pool.QueryRow(ctx, `SELECT count(*) FROM `+r.table("idem_dedup")+` WHERE scope = $1 AND key = $2`, rigName, id).Scan(&dedupRows); err != nil {
		r.t.Fatal(err)
	}
	return business, dedupRows
}

func (r *releaseRig) requireApplied(id string, when string) {
	r.t.Helper()
	if b, d := r.rows(id); b != 1 || d != 1 {
		r.t.Fatalf("%s: payment %s has %d business rows and %d dedup rows, want 1 and 1 (front %+v)", when, id, b, d, r.front.Stats())
	}
}

// release runs payment id again: its effect is undone and its dedup row
// deleted in one transaction, inside the front's Release.
func (r *releaseRig) release(id string) {
	r.t.Helper()
	ctx := context.Background()
	err := r.front.Release(ctx, []dedup.Key{{Scope: rigName, ID: id}}, func(ctx context.Context) error {
		return pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `DELETE FROM `+r.table("payments")+` WHERE id = $1`, id); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `DELETE FROM `+r.table("idem_dedup")+` WHERE scope = $1 AND key = $2`, rigName, id)
			return err
		})
	})
	if err != nil {
		r.t.Fatalf("release %s: %v", id, err)
	}
	if b, d := r.rows(id); b != 0 || d != 0 {
		r.t.Fatalf("after its release, payment %s has %d business rows and %d dedup rows", id, b, d)
	}
}

// redisBack waits until the front's client answers again after a restart
// (its broken connections dropped), and the front's back-off after a Redis
// error (RetryAfter) has passed: the next claim asks Redis.
func (r *releaseRig) redisBack() {
	r.t.Helper()
	ok := 0
	testenv.WaitUntil(r.t, 30*time.Second, "the restarted Redis answers the front's client", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if r.client.Ping(ctx).Err() != nil {
			ok = 0
			return false
		}
		ok++
		return ok >= 3
	})
	errs := r.front.Stats().Errors
	at := time.Now()
	testenv.WaitUntil(r.t, 10*time.Second, "the front's back-off after a Redis error has passed", func() bool {
		return time.Since(at) > 100*time.Millisecond && r.front.Stats().Errors == errs
	})
}

// TestReleasedKeyAfterARestoredSnapshot (issue 25, item 7a): Redis brought
// back from a snapshot taken before a release holds the released key's
// "committed" entry, and no tombstone. The redelivery after the release
// must run the payment again — it is the database, not Redis, that says
// whether the key is done.
func TestReleasedKeyAfterARestoredSnapshot(t *testing.T) {
	r := newReleaseRig(t)
	k := r.message("k", 1)
	r.deliver(k)
	r.wait()
	r.requireApplied("k", "first delivery")
	snap, err := r.redis.Snapshot()
	if err != nil {
		t.Fatal(err)
	}

	r.release("k")
	if err := r.redis.Restart(snap); err != nil {
		t.Fatal(err)
	}
	r.redisBack()

	r.deliver(k) // the redelivery the release was for
	r.wait()
	r.requireApplied("k", "redelivered after its release and a restore of Redis from an older snapshot")

	// The front answers k from Redis again: its entry was written anew.
	hits := r.front.Stats().Hits
	r.deliver(k)
	r.wait()
	r.requireApplied("k", "a duplicate after the release")
	if r.front.Stats().Hits == hits {
		t.Fatalf("a duplicate after the release was not answered from Redis: %+v", r.front.Stats())
	}
}

// TestReleasedKeyWhileATransactionHeldItsRow (issue 25, item 7b): a
// transaction reads the key's row (a duplicate that Redis did not know),
// the key is released while it is still open, and Redis loses the
// release's tombstones — flushed, or restarted without persistence —
// before that transaction commits and writes its entries. The redelivery
// after the release must run the payment again.
func TestReleasedKeyWhileATransactionHeldItsRow(t *testing.T) {
	for _, lose := range []struct {
		name string
		do   func(r *releaseRig)
	}{
		{"flushed", func(r *releaseRig) {
			if _, err := r.redis.Do("FLUSHALL"); err != nil {
				r.t.Fatal(err)
			}
		}},
		{"restarted empty", func(r *releaseRig) {
			if err := r.redis.Restart(""); err != nil {
				r.t.Fatal(err)
			}
			r.redisBack()
		}},
	} {
		t.Run(lose.name, func(t *testing.T) {
			r := newReleaseRig(t)
			k := r.message("k", 1)
			r.deliver(k)
			r.wait()
			r.requireApplied("k", "first delivery")
			// Redis forgets k (evicted, or a restart): its next duplicate
			// goes to the database.
			if _, err := r.redis.Do("FLUSHALL"); err != nil {
				t.Fatal(err)
			}

			// A duplicate of k beside a payment whose handler waits: the
			// batch's transaction has read k's row and stays open.
			r.src.Push(k, r.message("hold", 2))
			<-r.holding
			r.release("k")
			lose.do(r)
			close(r.hold)
			r.wait()
			r.requireApplied("hold", "the held payment")

			r.deliver(k) // the redelivery the release was for
			r.wait()
			r.requireApplied("k", "redelivered after its release, a transaction that read its row committing after it, Redis "+lose.name)
		})
	}
}
