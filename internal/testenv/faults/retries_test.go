package faults_test

import (
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/adapters/kafka"
	"github.com/idemkit/idem/adapters/rocketmq"
	"github.com/idemkit/idem/internal/testenv"
)

// nonBlockingOn: set false to watch nonblocking-retries fail — its
// non-blocking run then retries in the lane (Blocking), and the other keys'
// p99 is the outage's length.
var nonBlockingOn = true

// keyOrderedOn: set false to watch the key-ordered run fail — it then runs
// plain NonBlocking (still in RocketMQ's orderly mode), and a failing key's
// later payments overtake it.
var keyOrderedOn = true

// The runs of nonblocking-retries.
const (
	runFaultFree   = "fault-free"
	runBlocking    = "blocking"
	runNonBlocking = "non-blocking"
	runKeyOrdered  = "key-ordered"
)

// followers is how many later payments each failing payment's record key
// has in the key-ordered run.
const followers = 2

// retryOutage is how long the failing keys fail at least: issue 30's 90 s.
// It lasts the stream's production too (about 25 s), and in the
// non-blocking run until the other keys are applied and the consumer was
// SIGKILLed and replaced, if that takes longer.
const retryOutage = 90 * time.Second

// retryDelays are the delays of the non-blocking run (Kafka: a retry topic
// each; RocketMQ: timer messages on one retry topic): 224 s in all,
// longer than the outage with room for the restart, so that no failing
// payment is dead-lettered.
var retryDelays = []time.Duration{time.Second, 3 * time.Second, 10 * time.Second, 30 * time.Second, time.Minute, 2 * time.Minute}

// 23. Issue 30: 5% of the keys fail (a Retryable error, a payment channel
// down) for retryOutage while a stream of 500 payments (639 messages with
// the generator's duplicates and bad ones) goes out over 25 s on 4
// partitions (queues), on Kafka and on RocketMQ. Three runs of the same
// stream, one after the other: no fault, the fault with Blocking retries,
// the fault with NonBlocking retries (retry topics). Each measures the latency of the OTHER keys,
// from production to the commit of their effect (effects_audit.at), and
// reconciles as every scenario does (every payment once, none lost, no
// dead letter but the stream's own).
//
// Asserted: the non-blocking p99 is at most twice the fault-free p99 (the
// issue's target; the fault-free p99 taken as 250 ms at least, see
// latencyFloor); the blocking run stalls (its p99 is past that bound).
// The non-blocking run SIGKILLs its consumer while the failing payments
// sit on the retry topics (none of them applied yet, copies written), and
// a new consumer applies them once the outage is over, from the retry
// topics.
//
// A fourth run, key-ordered, is the non-blocking one with
// NonBlocking.KeyOrdered (on RocketMQ in orderly mode, which KeyOrdered
// needs): each failing payment's record key has followers more payments,
// produced after it on its partition (queue). Asserted: every key's
// payments are applied in production order (effects_audit.at), so none of
// the followers during the outage; its other keys' p99 is logged beside
// the non-blocking one (the cost of KeyOrdered) and held to the same
// bound, or keyOrderedFloor at least. It does not SIGKILL its consumer:
// scenario 25 (key-parked, parking_test.go) keeps the keys parked across a
// SIGKILL and rebalances. Its followers come back up to the longest delay after their head:
// it waits that much longer for the last payments.
func nonBlockingRetries(t *testing.T, b, title string) {
	p99 := map[string]time.Duration{}
	for _, run := range []string{runFaultFree, runBlocking, runNonBlocking, runKeyOrdered} {
		t.Run(run, func(t *testing.T) { p99[run] = retryRun(t, b, title+" "+run, run) })
	}
	if t.Failed() {
		return
	}
	if ko, ok := p99[runKeyOrdered]; ok && ko > 0 {
		// The cost of KeyOrdered: its p99 beside the non-blocking one's
		// (0: that run was left out).
		bound := max(2*max(p99[runFaultFree], latencyFloor), keyOrderedFloor)
		t.Logf("p99 latency of the other keys: key-ordered %v, non-blocking %v, fault-free %v (bound %v)",
			ko, p99[runNonBlocking], p99[runFaultFree], bound)
		if ko > bound {
			t.Errorf("key-ordered p99 %v of the other keys is past %v: they waited for the failing keys", ko, bound)
		}
	}
	if len(p99) < 3 || p99[runFaultFree] == 0 || p99[runBlocking] == 0 || p99[runNonBlocking] == 0 {
		return // a run was left out (-run)
	}
	ff, bl, nb := p99[runFaultFree], p99[runBlocking], p99[runNonBlocking]
	bound := 2 * max(ff, latencyFloor)
	t.Logf("p99 latency of the other keys: fault-free %v, blocking %v, non-blocking %v (bound: 2 x max(fault-free, %v) = %v)",
		ff, bl, nb, latencyFloor, bound)
	if nb > bound {
		t.Errorf("non-blocking p99 %v of the other keys is past twice the fault-free p99 (%v, at least %v)", nb, ff, latencyFloor)
	}
	if bl <= bound {
		t.Errorf("blocking p99 %v is within %v: the outage did not stall the partitions", bl, bound)
	}
}

// latencyFloor is the least fault-free p99 the bound is taken from. On two
// shared cores a p99 of ~100 ms (the fifth-worst of ~475 latencies) is the
// scheduler's: six runs at load 6-8 measured fault-free p99s of 35-117 ms
// and non-blocking p99s of 44-150 ms, twice the fault-free p99 in three of
// five (128 ms against 35 ms), and make test-faults runs another scenario
// beside this one. The stall the bound is for is the outage's length
// (seconds): a bound of 500 ms still catches it on 1% of the other keys.
const latencyFloor = 250 * time.Millisecond

// keyOrderedFloor is the least bound of the key-ordered run's p99. On
// Kafka it is within the non-blocking bound; RocketMQ's orderly mode, which
// KeyOrdered needs, measured other keys' p99s of 1.7-2.2 s on the shared
// machine, with KeyOrdered and without it (the mode's cost, not
// KeyOrdered's). A stall behind the failing keys is the outage's length.
const keyOrderedFloor = 5 * time.Second

// retryRun runs the stream once and returns the p99 latency of the keys
// that do not fail.
func retryRun(t *testing.T, b, title, run string) time.Duration {
	r := newRig(t, env(t, b), title, 4)
	nonBlocking := run == runNonBlocking && nonBlockingOn || run == runKeyOrdered
	// retryLane is what the lane of a copy from a retry topic contains.
	var retryLane string
	switch br := r.b.(type) {
	case *kafkaBroker:
		retryLane = ".retry."
		if nonBlocking {
			for _, d := range retryDelays {
				br.CreateTopic(t, kafka.RetryTopic(r.topic, d), r.parts)
			}
		}
	case *rocketBroker:
		retryLane = rocketmq.RetryTopic(r.topic) + "/"
		if nonBlocking {
			br.CreateTopic(t, rocketmq.RetryTopic(r.topic), r.parts)
		}
	default:
		t.Fatalf("nonblocking-retries runs on Kafka and RocketMQ, not %s", b)
	}
	s := r.newStream("", 500, 23)
	failing := map[string]bool{}
	for i, e := range r.expected[""] {
		if i%20 == 7 {
			failing[e.TxnID] = true
		}
	}
	// keyed: in the key-ordered run, the payments of each failing
	// payment's record key, in production order.
	var keyed map[string][]string
	following := map[string]bool{}
	if run == runKeyOrdered {
		keyed = r.keyFollowers(s, failing, following)
	}
	over := filepath.Join(r.dir, "outage-over")
	fp := failpoints{OutageOver: over}
	if run != runFaultFree {
		for txn := range failing {
			fp.Outage = append(fp.Outage, txn)
		}
		slices.Sort(fp.Outage)
	}
	mod := func(sp *childSpec) {
		switch {
		case nonBlocking:
			sp.RetryDelays, sp.RetryAttempts = retryDelays, 1
			if run == runKeyOrdered {
				sp.KeyOrdered = keyOrderedOn
				sp.Orderly = sp.Broker == "rocketmq" // KeyOrdered needs queue order
			}
		case run != runFaultFree:
			sp.Attempts, sp.MaxElapsed = 1000, 5*time.Minute // Blocking: retried in the lane for as long as the outage lasts
		}
	}
	c := r.start(fp, mod)
	r.waitConsuming(c)

	// The stream: 5 messages every 200 ms, the production time of each
	// key's first message recorded.
	produced := map[string]time.Time{}
	began := time.Now()
	const chunk = 5
	tick := time.NewTicker(200 * time.Millisecond)
	for i := 0; i < len(s.first); i += chunk {
		<-tick.C
		part := s.first[i:min(i+chunk, len(s.first))]
		now := time.Now()
		for _, m := range part {
			if txn := txnOf(m.Value); txn != "" {
				if _, ok := produced[txn]; !ok {
					produced[txn] = now
				}
			}
		}
		r.produce(part)
	}
	tick.Stop()
	t.Logf("%s: %d messages produced in %v, %d of %d payments failing", run, len(s.first), time.Since(began).Round(time.Millisecond), len(fp.Outage), r.wantPayments())

	others := int64(r.wantPayments() - len(failing) - len(following))
	if run == runKeyOrdered {
		// The other keys are applied while the failing ones fail, and
		// the failing keys' followers wait in retry behind them (the
		// order check below says whether they did).
		r.waitApplied(others, c)
		want := int64(len(failing))
		if keyOrderedOn {
			want += int64(len(following))
		}
		testenv.WaitUntilProgress(t, 30*time.Second, "failing payments (and their followers) written to the retry topics", func() (bool, string) {
			n := c.stats().Stats.RetriedLater
			return n >= want, fmt.Sprintf("%d retried later", n)
		})
		t.Logf("%s: %d payments applied %v into the outage (%d other keys'), %d copies written to retry topics",
			run, r.ledgerRows(), time.Since(began).Round(time.Millisecond), others, c.stats().Stats.RetriedLater)
	} else if nonBlocking {
		// The other keys are applied while the failing ones fail.
		r.waitApplied(others, c)
		if n := r.ledgerRows(); n != others {
			t.Fatalf("%d payments applied during the outage, want the %d of the other keys", n, others)
		}
		testenv.WaitUntilProgress(t, 30*time.Second, "failing payments written to the retry topics", func() (bool, string) {
			n := c.stats().Stats.RetriedLater
			return n >= int64(len(failing)), fmt.Sprintf("%d retried later", n)
		})
		// SIGKILL with the failing payments on the retry topics; a new
		// consumer takes over.
		c.Kill()
		t.Logf("consumer SIGKILLed %v into the outage, %d copies written to retry topics, none of the %d failing payments applied",
			time.Since(began).Round(time.Millisecond), c.stats().Stats.RetriedLater, len(failing))
		r.midReconcile("after the kill")
		c = r.start(fp, mod)
	}
	if d := time.Until(began.Add(retryOutage)); d > 0 && run != runFaultFree {
		time.Sleep(d) // the outage's end: a time, not a condition
	}
	if err := os.WriteFile(over, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: outage over after %v", run, time.Since(began).Round(time.Millisecond))
	wait := waitApplyFor
	if run == runKeyOrdered {
		// A follower is written to the delay its key's head was last sent
		// to: it comes back up to the longest delay after the head.
		wait += slices.Max(retryDelays)
	}
	r.waitAppliedFor(wait, int64(r.wantPayments()), c)
	r.produce(s.conflicts)
	r.finish()

	// Latency of the other keys: production to the commit of the effect.
	ctx := testenv.Context(t, time.Minute)
	rows, err := r.pool.Query(ctx, `SELECT txn_id, min(at), bool_or(strpos(lane, $1) > 0) FROM effects_audit GROUP BY txn_id`, retryLane)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var lat, failLat []time.Duration
	applied := map[string]time.Time{}
	fromRetry := 0
	for rows.Next() {
		var txn string
		var at time.Time
		var retried bool
		if err := rows.Scan(&txn, &at, &retried); err != nil {
			t.Fatal(err)
		}
		applied[txn] = at
		p, ok := produced[txn]
		if !ok {
			continue
		}
		if following[txn] {
			failLat = append(failLat, at.Sub(p))
			continue
		}
		if failing[txn] {
			failLat = append(failLat, at.Sub(p))
			if retried {
				fromRetry++
			}
			continue
		}
		lat = append(lat, at.Sub(p))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(lat) != int(others) {
		t.Fatalf("latencies of %d other keys, want %d", len(lat), others)
	}
	p99 := percentile(lat, 0.99)
	t.Logf("%s: other keys' latency p50 %v, p99 %v, max %v; failing keys' max %v", run,
		percentile(lat, 0.5), p99, percentile(lat, 1), percentile(failLat, 1))
	if nonBlocking {
		t.Logf("failing payments applied from a retry topic: %d of %d", fromRetry, len(failing))
		if fromRetry != len(failing) {
			t.Errorf("%d of the %d failing payments were applied from a retry topic, want all", fromRetry, len(failing))
		}
	}
	if keyed != nil {
		checkKeyOrder(t, keyed, applied)
	}
	return p99
}

// keyFollowers gives each failing payment of s a record key of its own
// (all its messages: the generator's duplicates too), and that key to the
// next followers payments produced at least 10 messages (two ticks) after
// it, moved to its partition (queue): payments whose txn_id has one
// message in s.first, none failing. It marks them in following and
// returns each key's payments in production order.
func (r *rig) keyFollowers(s stream, failing, following map[string]bool) map[string][]string {
	const gap = 10
	count := map[string]int{}
	for _, m := range s.first {
		if txn := txnOf(m.Value); txn != "" && r.wantDLQ[m.ID] == "" {
			count[txn]++
		}
	}
	keyed := map[string][]string{}
	for i, m := range s.first {
		txn := txnOf(m.Value)
		if !failing[txn] {
			continue
		}
		key := "key-" + txn
		s.first[i].Key = key
		if _, ok := keyed[key]; ok {
			continue // a duplicate of the failing payment: same key, same partition
		}
		keyed[key] = []string{txn}
		for j := i + gap; j < len(s.first) && len(keyed[key]) <= followers; j++ {
			f := &s.first[j]
			ftxn := txnOf(f.Value)
			if ftxn == "" || r.wantDLQ[f.ID] != "" || count[ftxn] != 1 || failing[ftxn] || following[ftxn] {
				continue
			}
			f.Key, f.Part = key, m.Part
			following[ftxn] = true
			keyed[key] = append(keyed[key], ftxn)
		}
	}
	return keyed
}

// checkKeyOrder checks that each key's payments were applied (applied:
// the first effect's commit) in their production order.
func checkKeyOrder(t *testing.T, keyed map[string][]string, applied map[string]time.Time) {
	t.Helper()
	outOfOrder := 0
	for _, key := range slices.Sorted(maps.Keys(keyed)) {
		txns := keyed[key]
		for k := 1; k < len(txns); k++ {
			prev, cur := applied[txns[k-1]], applied[txns[k]]
			if prev.IsZero() || cur.IsZero() {
				t.Errorf("key %s: %s or %s not applied", key, txns[k-1], txns[k])
				break
			}
			if !cur.After(prev) {
				outOfOrder++
				t.Errorf("key %s: its payment %d (%s) was applied %v before its payment %d (%s)",
					key, k+1, txns[k], prev.Sub(cur).Round(time.Millisecond), k, txns[k-1])
				break
			}
		}
	}
	t.Logf("key order: %d keys of %d payments each, %d applied out of production order", len(keyed), followers+1, outOfOrder)
}

// waitConsuming waits until c, the only consumer, consumes every partition
// (queue) of the topic, so that the latencies start with the stream, not
// with the consumer's start: Kafka's group is stable with it, RocketMQ's
// push consumer holds a process queue of each queue (its Lanes).
func (r *rig) waitConsuming(c *child) {
	t := r.t
	t.Helper()
	testenv.WaitUntilProgress(t, time.Minute, "the consumer on every partition", func() (bool, string) {
		c.requireAlive(t)
		if k, ok := r.b.(*kafkaBroker); ok {
			n := k.StableMembers(r.group)
			return n == 1, fmt.Sprintf("%d stable members", n)
		}
		n := 0
		for _, l := range c.stats().Lanes {
			if strings.HasPrefix(l.Lane, r.topic+"/") {
				n++
			}
		}
		return n == r.parts, fmt.Sprintf("%d of %d queues held", n, r.parts)
	})
}

// percentile returns the q-quantile of ds (nearest rank), 0 when empty.
func percentile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	ds = slices.Clone(ds)
	slices.Sort(ds)
	i := int(math.Ceil(q*float64(len(ds)))) - 1
	return ds[max(i, 0)].Round(time.Millisecond)
}
