package faults_test

import (
	"context"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"

	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/internal/testenv/rmqtest"
)

// rocketCluster is the two-broker RocketMQ of
// scripts/testenv/rocketmq-cluster.sh (one name server, two broker groups
// of one master each, idem-rmq-a and idem-rmq-b), which one test at a time
// has to itself: it kills brokers and starts them again. A topic of n
// partitions has n/2 queues on each broker; partition p is queue p/2 of
// broker p%2 (brokers[p%2]), so that the consumers' queue q of broker i is
// partition 2q+i (partOf).
//
// The rig's producer sends each message to its partition's queue. When the
// send fails (that broker is down) it sends the batch to the same queue
// number of the other broker, as a producer choosing queues by itself would
// have to: the message is not lost, and its position is where it was
// stored. A failed send the broker stored before it died is stored twice;
// the consumers' dedup absorbs the copy.
type rocketCluster struct {
	t       *testing.T
	ns      []string
	brokers []*rmqtest.Broker // rocketmq-cluster.sh's broker N at N-1
	prod    rigProducer
	resent  atomic.Int64 // batches sent to the other broker after a failed send

	mu   sync.Mutex
	pos  map[string]map[string]pos // per topic: message ID -> partition and offset
	down map[int]bool              // broker index -> killed
}

// rocketClusterBrokers are the brokers' names, by index.
var rocketClusterBrokers = []string{"idem-rmq-a", "idem-rmq-b"}

// newRocketCluster takes the cluster for the test, waits until the name
// server lists both brokers and, when the test ends, starts whatever broker
// it left down.
func newRocketCluster(t *testing.T) *rocketCluster {
	t.Helper()
	ns := testenv.RocketMQClusterExclusive(t)
	c := &rocketCluster{t: t, ns: ns, pos: map[string]map[string]pos{}, down: map[int]bool{}}
	c.waitMasters("the start of the test", len(rocketClusterBrokers))
	brokers, err := rmqtest.ConnectAll(ns)
	if err != nil {
		t.Fatal(err)
	}
	c.brokers = brokers
	t.Cleanup(func() {
		for _, b := range c.brokers {
			_ = b.Close()
		}
	})
	if len(brokers) != len(rocketClusterBrokers) {
		t.Fatalf("the name server lists brokers %v, want %v", names(brokers), rocketClusterBrokers)
	}
	for i, b := range brokers {
		if b.Name != rocketClusterBrokers[i] {
			t.Fatalf("the name server lists brokers %v, want %v", names(brokers), rocketClusterBrokers)
		}
	}
	p, err := startRigProducer(ns, testenv.Name(t, "pg"), testenv.Name(t, "pi"))
	if err != nil {
		t.Fatal(err)
	}
	c.prod = p
	t.Cleanup(func() {
		_ = p.Shutdown()
		if len(c.down) > 0 {
			c.script("start")
			clear(c.down)
		}
	})
	return c
}

func names(bs []*rmqtest.Broker) []string {
	var out []string
	for _, b := range bs {
		out = append(out, b.Name)
	}
	return out
}

func (c *rocketCluster) script(args ...string) string {
	c.t.Helper()
	return testenv.Script(c.t, "rocketmq-cluster", args...)
}

// waitMasters waits until the name server lists n master brokers.
func (c *rocketCluster) waitMasters(when string, n int) {
	c.t.Helper()
	testenv.WaitUntilProgress(c.t, 2*time.Minute, fmt.Sprintf("the name server lists %d brokers at %s", n, when), func() (bool, string) {
		ms, err := rmqtest.Masters(c.ns[0])
		if err != nil {
			return false, err.Error()
		}
		return len(ms) == n, fmt.Sprint(ms)
	})
}

// kill SIGKILLs broker i (rocketmq-cluster.sh's broker i+1) and waits until
// the name server no longer lists it (it sees the connection close).
func (c *rocketCluster) kill(i int) {
	c.t.Helper()
	began := time.Now()
	c.mu.Lock()
	c.down[i] = true // before the script: the cleanup starts it even when the script fails after the kill
	c.mu.Unlock()
	c.script("kill", strconv.Itoa(i+1))
	c.waitMasters(fmt.Sprintf("the kill of %s", c.brokers[i].Name), len(c.brokers)-1)
	c.t.Logf("broker %s killed; the name server dropped it after %v", c.brokers[i].Name, time.Since(began).Round(100*time.Millisecond))
}

// start starts broker i again and waits until the name server lists it and
// it answers for every queue of topic (its store loaded). The admin client's
// route of topic is cached from CreateTopicOn, so it says nothing here; the
// clients find the broker at their next route refresh (30 s), and a send to
// it before then is retried and, failing, goes to the other broker.
func (c *rocketCluster) start(i int, topic string) {
	c.t.Helper()
	began := time.Now()
	c.script("start", strconv.Itoa(i+1))
	c.mu.Lock()
	delete(c.down, i)
	c.mu.Unlock()
	name := c.brokers[i].Name
	c.waitMasters(fmt.Sprintf("the restart of %s", name), len(c.brokers))
	testenv.WaitUntilProgress(c.t, 2*time.Minute, "every queue of "+topic+" served by "+name, func() (bool, string) {
		for q := range c.brokers[i].Queues(topic) {
			if _, err := c.brokers[i].MaxOffset(topic, q); err != nil {
				return false, fmt.Sprintf("queue %d: %v", q, err)
			}
		}
		return true, ""
	})
	c.t.Logf("broker %s back, listed and serving %s after %v", name, topic, time.Since(began).Round(100*time.Millisecond))
}

func (c *rocketCluster) isDown(i int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.down[i]
}

func (c *rocketCluster) name() string    { return "rocketmq-cluster" }
func (c *rocketCluster) addrs() []string { return c.ns }

// split returns the broker index and queue of partition p.
func (c *rocketCluster) split(p int) (int, int) { return p % len(c.brokers), p / len(c.brokers) }

// partOf returns the partition of queue q of the broker a lane
// (topic/broker/queue) names.
func (c *rocketCluster) partOf(lane string, q int) (int, bool) {
	parts := strings.Split(lane, "/")
	if len(parts) < 3 {
		return 0, false
	}
	return c.part(parts[len(parts)-2], q)
}

func (c *rocketCluster) part(broker string, q int) (int, bool) {
	for i, b := range c.brokers {
		if b.Name == broker {
			return q*len(c.brokers) + i, true
		}
	}
	return 0, false
}

func (c *rocketCluster) newTopic(t *testing.T, n int) (string, string) {
	t.Helper()
	if n%len(c.brokers) != 0 {
		t.Fatalf("%d partitions do not spread evenly over %d brokers", n, len(c.brokers))
	}
	topic, group := testenv.Name(t, "t"), testenv.Name(t, "g")
	per := n / len(c.brokers)
	rmqtest.CreateTopicOn(t, c.brokers, topic, per)
	rmqtest.CreateTopicOn(t, c.brokers, topic+"_DLQ", per)
	// The group's retry topic on both: the client sends a message back to
	// the broker it came from, and when that fails, to any that has the
	// retry topic.
	rmqtest.CreateTopicOn(t, c.brokers, "%RETRY%"+group, 1)
	return topic, group
}

func (c *rocketCluster) produce(t *testing.T, topic string, msgs []outMsg) {
	t.Helper()
	ctx := testenv.Context(t, 3*time.Minute)
	out := make([]*primitive.Message, len(msgs))
	for i, m := range msgs {
		b, q := c.split(m.Part)
		out[i] = rocketMessage(topic, m, c.brokers[b].Name, q)
	}
	stored := make([]pos, 0, len(msgs))
	for len(out) > 0 {
		n := rmqtest.BatchLen(out)
		res := c.send(t, ctx, out[:n])
		p, ok := c.part(res.MessageQueue.BrokerName, res.MessageQueue.QueueId)
		if !ok {
			t.Fatalf("stored on unknown broker %s", res.MessageQueue.BrokerName)
		}
		for i := range n {
			stored = append(stored, pos{Part: p, Off: res.QueueOffset + int64(i)})
		}
		out = out[n:]
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.pos[topic] == nil {
		c.pos[topic] = map[string]pos{}
	}
	for i, m := range msgs {
		c.pos[topic][m.ID] = stored[i]
	}
}

// send sends batch (messages for one queue) until a broker stored it. A
// failed send goes to the same queue number of the other broker when its
// own broker is down (killed by the test), else to the same queue again
// for up to rocketRouteStale (a producer that saw a broker go finds it
// again at its next route refresh), then to the other broker.
func (c *rocketCluster) send(t *testing.T, ctx context.Context, batch []*primitive.Message) *primitive.SendResult {
	t.Helper()
	began := time.Now()
	for attempt := 0; ; attempt++ {
		res, err := c.prod.SendSync(ctx, batch...)
		if err == nil && res.Status == primitive.SendOK {
			return res
		}
		if ctx.Err() != nil {
			t.Fatalf("send to %s: %v (%v); gave up: %v", batch[0].Queue, err, res, ctx.Err())
		}
		from := batch[0].Queue
		p, _ := c.part(from.BrokerName, from.QueueId)
		b, _ := c.split(p)
		if c.isDown(b) || time.Since(began) > rocketRouteStale {
			to := &primitive.MessageQueue{Topic: from.Topic, BrokerName: c.brokers[(b+1)%len(c.brokers)].Name, QueueId: from.QueueId}
			for _, m := range batch {
				m.Queue = to
			}
			began = time.Now()
			if c.resent.Add(1) <= 3 {
				t.Logf("send of %d messages to %s/%d failed (%v, %v); sending them to %s", len(batch), from.BrokerName, from.QueueId, err, res, to.BrokerName)
			}
		}
		time.Sleep(time.Duration(min(attempt+1, 10)) * 100 * time.Millisecond)
	}
}

// rocketRouteStale bounds how long a producer may keep a stale route: the
// client polls the name server every 30 s.
const rocketRouteStale = 40 * time.Second

func (c *rocketCluster) positions(_ *testing.T, topic string) map[string]pos {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.pos[topic])
}

// count sums the messages topic holds on the brokers.
func (c *rocketCluster) count(topic string) (int64, error) {
	var n int64
	for _, b := range c.brokers {
		m, err := b.Count(topic)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", b.Name, err)
		}
		n += m
	}
	return n, nil
}

// offsets returns the group's committed offsets on the brokers that are
// up: while one is down, those of the other.
func (c *rocketCluster) offsets(_ context.Context, topic, group string) (map[int]int64, error) {
	out := map[int]int64{}
	for i, b := range c.brokers {
		if c.isDown(i) {
			continue
		}
		for q := range b.Queues(topic) {
			off, ok, err := b.ConsumerOffset(group, topic, q)
			if err != nil {
				return nil, fmt.Errorf("%s queue %d: %w", b.Name, q, err)
			}
			if ok {
				p, _ := c.part(b.Name, q)
				out[p] = off
			}
		}
	}
	return out, nil
}

// lag sums, over topic's queues and the group's retry topic on both
// brokers, how far the group's committed offsets are behind the queues'
// ends.
func (c *rocketCluster) lag(topic, group string) (int64, string, error) {
	var total int64
	var detail []string
	for _, b := range c.brokers {
		for _, tq := range []string{topic, "%RETRY%" + group} {
			for q := range b.Queues(tq) {
				hi, err := b.MaxOffset(tq, q)
				if err != nil {
					return 0, "", fmt.Errorf("%s: %w", b.Name, err)
				}
				off, ok, err := b.ConsumerOffset(group, tq, q)
				if err != nil {
					return 0, "", fmt.Errorf("%s: %w", b.Name, err)
				}
				if !ok {
					off = 0
				}
				total += hi - off
				detail = append(detail, fmt.Sprintf("%s/%s/%d %d/%d", tq, b.Name, q, off, hi))
			}
		}
	}
	return total, fmt.Sprint(detail), nil
}

func (c *rocketCluster) waitNoLag(t *testing.T, topic, group string) {
	t.Helper()
	waitRocketNoLag(t, func() (int64, string, error) { return c.lag(topic, group) })
}

func (c *rocketCluster) deadLetters(t *testing.T, topic string, want int) []letter {
	t.Helper()
	return rocketDeadLetters(t, c.brokers[0], c.count, topic, want)
}

func (c *rocketCluster) givenBack(t *testing.T, group string) map[string]bool {
	t.Helper()
	return rocketGivenBack(t, c.brokers[0], c.count, group)
}

var (
	_ givingBackBroker = (*rocketCluster)(nil)
	_ queueNumberer    = (*rocketCluster)(nil)
)

// appliedSince counts, per partition, the payments applied (audit rows)
// after the audit row mark, from topic's lanes.
func (c *rocketCluster) appliedSince(r *rig, mark int64) map[int]int {
	r.t.Helper()
	rows, err := r.pool.Query(context.Background(), `SELECT lane, part, count(*) FROM effects_audit
		WHERE id > $1 AND strpos(lane, '%RETRY%') = 0 GROUP BY lane, part`, mark)
	if err != nil {
		r.t.Fatal(err)
	}
	defer rows.Close()
	out := map[int]int{}
	for rows.Next() {
		var lane string
		var q, n int
		if err := rows.Scan(&lane, &q, &n); err != nil {
			r.t.Fatal(err)
		}
		if p, ok := c.partOf(lane, q); ok {
			out[p] += n
		}
	}
	if err := rows.Err(); err != nil {
		r.t.Fatal(err)
	}
	return out
}

// auditMark returns the last audit row's id.
func (r *rig) auditMark() int64 {
	r.t.Helper()
	var id int64
	if err := r.pool.QueryRow(context.Background(), `SELECT coalesce(max(id), 0) FROM effects_audit`).Scan(&id); err != nil {
		r.t.Fatal(err)
	}
	return id
}

// rocketOutageAtLeast is how long broker-lost-and-back keeps the broker
// down at least: longer than the clients' route refresh
// (rocketmq-client-go polls the name server every 30 s), so that the
// consumers rebalance onto the other broker's queues alone (dropping what
// they had prefetched from the dead one and not yet applied), and the
// producers stop routing to it.
const rocketOutageAtLeast = 35 * time.Second

// 22. A broker group lost and back: on a topic with 4 queues on each of two
// brokers, the master that holds most of the first part of the stream is
// SIGKILLed once 100 payments are applied. The second part is produced
// while it is down (the rig's producer sends a batch whose broker is down
// to the same queue number of the other one), and the consumers keep
// applying the other broker's queues: at least 200 payments from them
// while it is down, which it stays for at least rocketOutageAtLeast. It is
// started again on its store, the third part of the stream is produced to
// all eight queues, and every queue of the restarted broker resumes
// (payments applied from each after the restart). At the end, as always:
// nothing lost, nothing applied twice, the dead letters exactly the
// expected ones, no lag, the committed offsets never ahead of what the
// consumers settled.
func rocketClusterBrokerLost(t *testing.T, _, title string) {
	c := newRocketCluster(t)
	r := newRig(t, c, title, 8)
	r.sampleOffsets()
	s := r.newStream("", 1200, 22)
	parts := [][]outMsg{s.first[:len(s.first)*2/5], s.first[len(s.first)*2/5 : len(s.first)*7/10], s.first[len(s.first)*7/10:]}
	r.produce(parts[0])
	fp := failpoints{Slow: 5 * time.Millisecond}
	c1, c2 := r.start(fp), r.start(fp)
	r.waitApplied(100, c1, c2)
	victim := 0
	load := map[int]int{}
	for _, p := range c.positions(t, r.topic) {
		b, _ := c.split(p.Part)
		load[b]++
	}
	if load[1] > load[0] {
		victim = 1
	}
	live := 1 - victim
	c.kill(victim)
	killed, killMark := time.Now(), r.auditMark()
	at := r.ledgerRows()
	t.Logf("%d payments applied when %s was killed (messages by broker %v)", at, c.brokers[victim].Name, load)
	r.produce(parts[1])
	if c.resent.Load() == 0 {
		t.Error("no send failed over to the other broker: the producer never met the dead one")
	}
	liveApplied := func() int {
		n := 0
		for p, k := range c.appliedSince(r, killMark) {
			if b, _ := c.split(p); b == live {
				n += k
			}
		}
		return n
	}
	testenv.WaitUntilProgress(t, waitApplyFor, "200 payments applied from "+c.brokers[live].Name+" while the other is down", func() (bool, string) {
		c1.requireAlive(t)
		c2.requireAlive(t)
		n := liveApplied()
		return n >= 200, fmt.Sprintf("%d applied", n)
	})
	if d := time.Until(killed.Add(rocketOutageAtLeast)); d > 0 {
		time.Sleep(d)
	}
	t.Logf("while %s was down (%v): %d payments applied, %d of them from %s's queues",
		c.brokers[victim].Name, time.Since(killed).Round(time.Second), r.ledgerRows()-at, liveApplied(), c.brokers[live].Name)
	restartMark := r.auditMark()
	c.start(victim, r.topic)
	restarted := time.Now()
	r.produce(parts[2])
	want := int64(r.wantPayments())
	r.waitApplied(want, c1, c2)
	since := c.appliedSince(r, restartMark)
	t.Logf("the stream applied %v after the restart; payments applied since, by partition: %v; batches sent to the other broker: %d",
		time.Since(restarted).Round(100*time.Millisecond), since, c.resent.Load())
	for q := range c.brokers[victim].Queues(r.topic) {
		if p, _ := c.part(c.brokers[victim].Name, q); since[p] == 0 {
			t.Errorf("nothing was applied from queue %d of %s after its restart", q, c.brokers[victim].Name)
		}
	}
	r.produce(s.conflicts)
	r.finish()
}
