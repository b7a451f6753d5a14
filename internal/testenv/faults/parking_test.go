package faults_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/adapters/kafka"
	"github.com/idemkit/idem/adapters/rocketmq"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/pgstore"
	"github.com/idemkit/idem/internal/testenv"
)

// parkingOn: set false to watch key-parked fail — its children then hide
// the store's dedup.Parking from the consumer, which keeps the holds in
// its memory: the members that take over do not know the parked keys, and
// a key's later payments overtake its head.
var parkingOn = true

// parkDelays are key-parked's retry delays: 4 m 20 s in all, room for the
// SIGKILL, the new members (on RocketMQ, after the dead member's orderly
// queue locks expire, 60 s) and the rebalances while the keys stay parked,
// with no failing payment dead-lettered.
var parkDelays = []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second,
	15 * time.Second, 25 * time.Second, 35 * time.Second, 45 * time.Second, 60 * time.Second, 65 * time.Second}

// 25. Issue 40: NonBlocking.KeyOrdered with the hold in the store. Of a
// stream of 800 payments on 4 partitions (queues), 100 fail (a Retryable
// error, an outage that lasts until the parent ends it), each with a
// record key of its own and the next two payments of that key produced
// after it (keyFollowers): the failing payments go to the retry
// destinations, their keys are parked, the followers follow them there
// untried. While the keys are parked the consumer is SIGKILLed, a new one
// starts, a second member joins (partitions move), copies come back to the
// new members and follow their heads again, and the first new member
// stops by SIGTERM (partitions move again). Only then is the outage over.
// Asserted: no follower applied while its key was parked; every key's
// payments applied in production order (0 violations over the 100 keys);
// every payment once, nothing lost, no dead letter but the stream's own
// (rig.finish). Runs in make test-faults only (the Makefile's SKIP).
func keyParked(t *testing.T, b, title string) {
	r := newRig(t, env(t, b), title, 4)
	switch br := r.b.(type) {
	case *kafkaBroker:
		for _, d := range parkDelays {
			br.CreateTopic(t, kafka.RetryTopic(r.topic, d), r.parts)
		}
	case *rocketBroker:
		br.CreateTopic(t, rocketmq.RetryTopic(r.topic), r.parts)
	default:
		t.Fatalf("key-parked runs on Kafka and RocketMQ, not %s", b)
	}
	s := r.newStream("", 800, 25)
	failing := map[string]bool{}
	for i, e := range r.expected[""] {
		if i%8 == 3 {
			failing[e.TxnID] = true
		}
	}
	following := map[string]bool{}
	keyed := r.keyFollowers(s, failing, following)
	if len(keyed) < 100 || len(following) < len(keyed)*3/2 {
		t.Fatalf("%d keys with %d followers, want 100 keys with about two each", len(keyed), len(following))
	}
	over := filepath.Join(r.dir, "outage-over")
	fp := failpoints{OutageOver: over}
	for txn := range failing {
		fp.Outage = append(fp.Outage, txn)
	}
	slices.Sort(fp.Outage)
	mod := func(sp *childSpec) {
		sp.RetryDelays, sp.RetryAttempts = parkDelays, 1
		sp.KeyOrdered = true
		sp.Orderly = sp.Broker == "rocketmq" // KeyOrdered needs queue order
		sp.NoParking = !parkingOn
	}
	c := r.start(fp, mod)
	r.waitConsuming(c)
	r.produce(s.first)

	others := int64(r.wantPayments() - len(failing) - len(following))
	r.waitApplied(others, c)
	testenv.WaitUntilProgress(t, time.Minute, "failing payments and their followers written to the retry destinations", func() (bool, string) {
		c.requireAlive(t)
		n := c.stats().Stats.RetriedLater
		return n >= int64(len(failing)+len(following)), fmt.Sprintf("%d retried later", n)
	})
	t.Logf("%d payments applied, %d copies in retry", r.ledgerRows(), c.stats().Stats.RetriedLater)
	if parkingOn {
		// RetriedLater counts the copies of duplicate deliveries too: a
		// failing head may still be on its way to retry.
		testenv.WaitUntilProgress(t, time.Minute, "every failing key parked in the store", func() (bool, string) {
			c.requireAlive(t)
			n := r.parkedKeys()
			return n >= len(keyed), fmt.Sprintf("%d of %d keys parked", n, len(keyed))
		})
	}

	// SIGKILL with the keys parked; a new member, then a second one.
	c.Kill()
	r.midReconcile("after the kill")
	c2 := r.start(fp, mod)
	r.waitMembers(1, c2) // RocketMQ: after the dead member's orderly locks expire (60 s)
	c3 := r.start(fp, mod)
	r.waitMembers(2, c2, c3)
	// Copies come back to the new members, and follow their heads again
	// (or, without the store's parking, are applied).
	testenv.WaitUntilProgress(t, 2*time.Minute, "followers back from retry on the new members", func() (bool, string) {
		n := c2.stats().Stats.RetriedLater + c3.stats().Stats.RetriedLater
		early := r.ledgerRows() - others
		return n+early >= int64(len(following)), fmt.Sprintf("%d retried later, %d followers applied", n, early)
	})
	c2.stop(t)
	r.waitMembers(1, c3)
	if n := r.ledgerRows(); n != others {
		t.Errorf("%d payments applied while their keys were parked, want the %d of the other keys: followers overtook their heads", n, others)
	}

	if err := os.WriteFile(over, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("outage over")
	// A follower is written to the delay its head was last sent to: it
	// comes back up to the longest delay after the head.
	r.waitAppliedFor(waitApplyFor+2*slices.Max(parkDelays), int64(r.wantPayments()), c3)
	if parkingOn {
		// Copies of applied payments still in retry (a redelivered
		// original failed again before the outage ended, RocketMQ's
		// redeliveries after the kill) park their key again when they
		// come back behind another message, and are settled as
		// duplicates when their turn comes: the keys drain within the
		// longest delay or two — while a member consumes the retry
		// destinations, so before finish stops it.
		r.waitReleased(2*slices.Max(parkDelays)+time.Minute, c3)
	}
	r.produce(s.conflicts)
	r.finish()

	ctx := testenv.Context(t, time.Minute)
	rows, err := r.pool.Query(ctx, `SELECT txn_id, min(at) FROM effects_audit GROUP BY txn_id`)
	if err != nil {
		t.Fatal(err)
	}
	applied, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (struct {
		txn string
		at  time.Time
	}, error) {
		var v struct {
			txn string
			at  time.Time
		}
		return v, row.Scan(&v.txn, &v.at)
	})
	if err != nil {
		t.Fatal(err)
	}
	at := map[string]time.Time{}
	for _, a := range applied {
		at[a.txn] = a.at
	}
	checkKeyOrder(t, keyed, at)
}

// waitReleased waits until no key is parked in the rig's store, alive
// consuming, and logs the keys left when it gives up.
func (r *rig) waitReleased(d time.Duration, alive ...*child) {
	t := r.t
	t.Helper()
	released := false
	defer func() {
		if !released {
			r.logParked() // gave up: t.Fatal unwinds through here
		}
	}()
	testenv.WaitUntilProgress(t, d, "every key released", func() (bool, string) {
		for _, c := range alive {
			c.requireAlive(t)
		}
		n := r.parkedKeys()
		return n == 0, fmt.Sprintf("%d keys parked", n)
	})
	released = true
}

// parkedKeys counts the keys parked in the rig's store.
func (r *rig) parkedKeys() int {
	r.t.Helper()
	ctx := testenv.Context(r.t, 30*time.Second)
	st, err := pgstore.New(r.pool, pgstore.Config{Schema: r.schema})
	if err != nil {
		r.t.Fatal(err)
	}
	p, ok := any(st).(dedup.Parking)
	if !ok {
		r.t.Fatalf("pgstore keeps no parked keys (%T does not implement dedup.Parking)", st)
	}
	s, err := p.ParkStats(ctx)
	if err != nil {
		r.t.Fatalf("parked keys: %v", err)
	}
	return s.Keys
}

// waitMembers waits until n members consume the topic: Kafka's group is
// stable with n, or (RocketMQ) each of alive holds a queue of the topic.
func (r *rig) waitMembers(n int, alive ...*child) {
	t := r.t
	t.Helper()
	testenv.WaitUntilProgress(t, 3*time.Minute, fmt.Sprintf("%d members consuming", n), func() (bool, string) {
		for _, c := range alive {
			c.requireAlive(t)
		}
		if k, ok := r.b.(*kafkaBroker); ok {
			got := k.StableMembers(r.group)
			return got == n, fmt.Sprintf("%d stable members", got)
		}
		held := 0
		for _, c := range alive {
			for _, l := range c.stats().Lanes {
				if strings.HasPrefix(l.Lane, r.topic+"/") {
					held++
					break
				}
			}
		}
		return held == n, fmt.Sprintf("%d of %d members hold a queue", held, n)
	})
}

// logParked logs the parked keys' messages (at most 20 rows), to say
// which were left.
func (r *rig) logParked() {
	ctx := testenv.Context(r.t, 30*time.Second)
	rows, err := r.pool.Query(ctx, `SELECT convert_from(k.key, 'UTF8'), k.head, k.depth, k.expired, p.id, p.pos
FROM `+pgx.Identifier{r.schema, "idem_dedup_parked_keys"}.Sanitize()+` k
JOIN `+pgx.Identifier{r.schema, "idem_dedup_parked"}.Sanitize()+` p USING (scope, topic, key)
ORDER BY k.key, p.pos LIMIT 20`)
	if err != nil {
		r.t.Logf("parked keys: %v", err)
		return
	}
	defer rows.Close()
	for rows.Next() {
		var key, head, id string
		var depth int
		var expired bool
		var pos int64
		if err := rows.Scan(&key, &head, &depth, &expired, &id, &pos); err != nil {
			r.t.Logf("parked keys: %v", err)
			return
		}
		r.t.Logf("parked: key %s head %s depth %d expired %v: %s at %d", key, head, depth, expired, id, pos)
	}
}
