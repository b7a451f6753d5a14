package faults_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/internal/testenv/kafkatest"
)

// kafkaCluster is the three-node Kafka of scripts/testenv/kafka-cluster.sh
// (each node broker and controller), which one test at a time has to
// itself: it kills nodes and starts them again. Its topics have three
// replicas and min.insync.replicas 2, so one node may be down; the
// consumers' dead-letter writer and the rig's producer wait for all
// in-sync replicas (acks=all).
type kafkaCluster struct {
	*kafkaBroker
	t     *testing.T
	nodes map[int]string // node ID (as kafka-cluster.sh numbers them) -> host:port
	down  map[int]bool
}

// newKafkaCluster takes the cluster for the test, waits until it is
// healthy and, when the test ends, starts whatever node it left down and
// waits until the cluster is healthy again.
func newKafkaCluster(t *testing.T) *kafkaCluster {
	t.Helper()
	brokers := testenv.KafkaClusterExclusive(t)
	if out, err := testenv.RunScript("kafka-cluster", "status"); err != nil {
		t.Fatalf("the cluster at %v is not running under scripts/testenv/kafka-cluster.sh: %s", brokers, out)
	}
	a := kafkatest.NewAdmin(t, brokers)
	a.ReplicationFactor = 3
	a.TopicConfigs = []kafkago.ConfigEntry{{ConfigName: "min.insync.replicas", ConfigValue: "2"}}
	c := &kafkaCluster{kafkaBroker: &kafkaBroker{Admin: a, label: "kafka-cluster"}, t: t, down: map[int]bool{}}
	c.nodes = map[int]string{}
	for _, b := range brokers {
		_, port, _ := strings.Cut(b, ":")
		p, err := strconv.Atoi(port)
		if err != nil {
			t.Fatalf("IDEM_TEST_KAFKA_CLUSTER: %q", b)
		}
		c.nodes[(p-19090)/2] = b // kafka-cluster.sh: node N on 19090+2N
	}
	t.Cleanup(func() {
		if len(c.down) > 0 {
			c.script("start")
			clear(c.down)
		}
		c.waitHealthy("the end of the test")
	})
	c.waitHealthy("the start of the test")
	return c
}

func (c *kafkaCluster) script(args ...string) string {
	c.t.Helper()
	return testenv.Script(c.t, "kafka-cluster", args...)
}

// metadata returns every partition of every topic and the live brokers,
// as a running node sees them (a fresh connection: no client's cache).
func (c *kafkaCluster) metadata() ([]kafkago.Partition, []kafkago.Broker, error) {
	var err error
	for _, id := range slices.Sorted(maps.Keys(c.nodes)) {
		if c.down[id] {
			continue
		}
		var parts []kafkago.Partition
		var brokers []kafkago.Broker
		parts, brokers, err = readMetadata(c.nodes[id])
		if err == nil {
			return parts, brokers, nil
		}
	}
	return nil, nil, err
}

func readMetadata(addr string) ([]kafkago.Partition, []kafkago.Broker, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := (&kafkago.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, nil, err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	parts, err := conn.ReadPartitions()
	if err != nil {
		return nil, nil, err
	}
	brokers, err := conn.Brokers()
	return parts, brokers, err
}

// health says what keeps the cluster from being healthy: a node missing,
// a partition without a leader or with fewer in-sync replicas than
// replicas. "" when there is nothing.
func (c *kafkaCluster) health() string {
	parts, brokers, err := c.metadata()
	if err != nil {
		return err.Error()
	}
	var probs []string
	if len(brokers) != len(c.nodes) {
		probs = append(probs, fmt.Sprintf("%d of %d brokers live", len(brokers), len(c.nodes)))
	}
	under, leaderless := 0, 0
	for _, p := range parts {
		if _, ok := c.nodes[p.Leader.ID]; !ok || p.Error != nil {
			leaderless++
		}
		if len(p.Isr) < len(p.Replicas) {
			under++
		}
	}
	if under > 0 {
		probs = append(probs, fmt.Sprintf("%d under-replicated partitions", under))
	}
	if leaderless > 0 {
		probs = append(probs, fmt.Sprintf("%d partitions without a leader", leaderless))
	}
	return strings.Join(probs, ", ")
}

// waitHealthy waits until every node is live, every partition has a
// leader and all its replicas in sync.
func (c *kafkaCluster) waitHealthy(when string) {
	c.t.Helper()
	testenv.WaitUntilProgress(c.t, 3*time.Minute, "the cluster is healthy at "+when, func() (bool, string) {
		p := c.health()
		return p == "", p
	})
}

// kill SIGKILLs node id and waits until the others took over: it is no
// longer a live broker, no partition is led by it or has it in sync.
func (c *kafkaCluster) kill(id int) {
	c.t.Helper()
	began := time.Now()
	c.script("kill", strconv.Itoa(id))
	c.down[id] = true
	testenv.WaitUntilProgress(c.t, 2*time.Minute, fmt.Sprintf("node %d's partitions are led elsewhere", id), func() (bool, string) {
		parts, brokers, err := c.metadata()
		if err != nil {
			return false, err.Error()
		}
		for _, b := range brokers {
			if b.ID == id {
				return false, "still a live broker"
			}
		}
		led, inSync := 0, 0
		for _, p := range parts {
			if p.Leader.ID == id || p.Leader.ID < 0 {
				led++
			}
			for _, b := range p.Isr {
				if b.ID == id {
					inSync++
				}
			}
		}
		return led == 0 && inSync == 0, fmt.Sprintf("%d partitions led by it or by none, in sync on %d", led, inSync)
	})
	c.t.Logf("node %d killed; its partitions led elsewhere after %v", id, time.Since(began).Round(100*time.Millisecond))
}

// start starts node id again and waits until the cluster is healthy.
func (c *kafkaCluster) start(id int) {
	c.t.Helper()
	began := time.Now()
	c.script("start", strconv.Itoa(id))
	delete(c.down, id)
	c.Transport.CloseIdleConnections()
	c.waitHealthy(fmt.Sprintf("node %d's restart", id))
	c.t.Logf("node %d back, cluster healthy after %v", id, time.Since(began).Round(100*time.Millisecond))
}

// leaders returns the leader of each partition of topic.
func (c *kafkaCluster) leaders(topic string) map[int]int {
	c.t.Helper()
	parts, _, err := c.metadata()
	if err != nil {
		c.t.Fatal(err)
	}
	out := map[int]int{}
	for _, p := range parts {
		if p.Topic == topic {
			out[p.ID] = p.Leader.ID
		}
	}
	return out
}

// busiestLeader returns the node that leads the partitions of topic with
// the most of msgs.
func (c *kafkaCluster) busiestLeader(topic string, msgs []outMsg) int {
	c.t.Helper()
	leaders := c.leaders(topic)
	load := map[int]int{}
	for _, m := range msgs {
		load[leaders[m.Part]]++
	}
	best := -1
	for _, id := range slices.Sorted(maps.Keys(load)) {
		if best < 0 || load[id] > load[best] {
			best = id
		}
	}
	c.t.Logf("messages by the leader of their partition: %v; the busiest is node %d", load, best)
	return best
}

// controller returns the quorum's leader, the active controller.
func (c *kafkaCluster) controller() int {
	c.t.Helper()
	out := strings.TrimSpace(c.script("controller"))
	lines := strings.Split(out, "\n")
	id, err := strconv.Atoi(strings.TrimSpace(lines[len(lines)-1]))
	if err != nil {
		c.t.Fatalf("kafka-cluster.sh controller: %q", out)
	}
	return id
}

// deadLettersWritten counts the records on topic's dead-letter topic.
func (c *kafkaCluster) deadLettersWritten(topic string) int64 {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	hwm, err := c.HighWatermarks(ctx, topic+".dlq")
	if err != nil {
		return -1
	}
	var n int64
	for _, h := range hwm {
		n += h
	}
	return n
}

// 16. The leader of the busiest partitions SIGKILLed mid-stream: the other
// nodes take its partitions over, the second half of the stream is
// produced and consumed while it is down, then it comes back and catches
// up (every partition fully in sync again) before the stream ends.
func clusterLeaderKill(t *testing.T, _, title string) {
	c := newKafkaCluster(t)
	r := newRig(t, c, title, 6)
	r.sampleOffsets()
	s := r.newStream("", 900, 16)
	half := len(s.first) / 2
	r.produce(s.first[:half])
	fp := failpoints{Slow: 5 * time.Millisecond}
	c1, c2 := r.start(fp), r.start(fp)
	r.waitApplied(100, c1, c2)
	victim := c.busiestLeader(r.topic, s.first)
	at := r.ledgerRows()
	c.kill(victim)
	t.Logf("%d payments applied when node %d was killed", at, victim)
	r.produce(s.first[half:])
	want := int64(r.wantPayments())
	r.waitApplied(min(at+100, want), c1, c2) // the consumers go on without it
	c.start(victim)
	r.waitApplied(want, c1, c2)
	r.produce(s.conflicts)
	r.finish()
}

// 17. A node lost for good mid-stream: the group's coordinator (the leader
// of __consumer_offsets) is SIGKILLed and stays down until the stream is
// consumed and reconciled on the two others; it is started again only
// after the checks.
func clusterBrokerLost(t *testing.T, _, title string) {
	c := newKafkaCluster(t)
	r := newRig(t, c, title, 6)
	r.sampleOffsets()
	s := r.newStream("", 900, 17)
	half := len(s.first) / 2
	r.produce(s.first[:half])
	fp := failpoints{Slow: 5 * time.Millisecond}
	c1, c2 := r.start(fp), r.start(fp)
	r.waitApplied(100, c1, c2)
	victim := c.leaders("__consumer_offsets")[0]
	at := r.ledgerRows()
	c.kill(victim)
	t.Logf("node %d (the group coordinator) lost with %d payments applied", victim, at)
	r.produce(s.first[half:])
	r.waitApplied(int64(r.wantPayments()), c1, c2)
	r.produce(s.conflicts)
	r.finish()
	c.start(victim)
}

// 18. The dead-letter writer during a leader change: one message in ten
// is bad, and the leader of most of the dead-letter topic's partitions is
// SIGKILLed while letters are being written. Every bad message ends up on
// the dead-letter topic (acks=all, retried until written), none is lost
// or settled without its letter.
func clusterDeadLetterLeaderChange(t *testing.T, _, title string) {
	c := newKafkaCluster(t)
	r := newRig(t, c, title, 6)
	r.sampleOffsets()
	s := r.newStream("", 600, 18)
	var msgs []outMsg
	for i, m := range s.first {
		msgs = append(msgs, m)
		if i%10 == 5 {
			bad := r.msg("", []byte(`{"txn_id":"trunc-`+strconv.Itoa(i)+`","order_id":`))
			bad.Part = i % r.parts
			r.wantDLQ[bad.ID] = reasonBadJSON
			msgs = append(msgs, bad)
		}
	}
	r.produce(msgs)
	fp := failpoints{Slow: 10 * time.Millisecond}
	c1, c2 := r.start(fp), r.start(fp)
	testenv.WaitUntilProgress(t, 2*time.Minute, "10 dead letters written", func() (bool, string) {
		c1.requireAlive(t)
		c2.requireAlive(t)
		n := c.deadLettersWritten(r.topic)
		return n >= 10, fmt.Sprintf("%d written", n)
	})
	victim := c.busiestLeader(r.topic+".dlq", msgs)
	before := c.deadLettersWritten(r.topic)
	c.kill(victim)
	testenv.WaitUntilProgress(t, 2*time.Minute, "dead letters written after the leader change", func() (bool, string) {
		c1.requireAlive(t)
		c2.requireAlive(t)
		n := c.deadLettersWritten(r.topic)
		return n > before+5, fmt.Sprintf("%d written, %d before the kill", n, before)
	})
	applied := r.ledgerRows()
	t.Logf("%d dead letters written before node %d was killed, %d payments applied", before, victim, applied)
	if want := int64(r.wantPayments()); applied >= want {
		t.Errorf("the stream was applied before the leader change ended (%d of %d): the scenario proved little", applied, want)
	}
	c.start(victim)
	r.waitApplied(int64(r.wantPayments()), c1, c2)
	r.produce(s.conflicts)
	r.finish()
}

// 19. A controller failover: the quorum's leader (the active controller,
// found with kafka-metadata-quorum's describe --status) SIGKILLed
// mid-stream. The two other voters elect a new one, which fences the dead
// node and moves its partitions; a consumer joins the group meanwhile.
func clusterControllerFailover(t *testing.T, _, title string) {
	c := newKafkaCluster(t)
	r := newRig(t, c, title, 6)
	r.sampleOffsets()
	s := r.newStream("", 900, 19)
	half := len(s.first) / 2
	r.produce(s.first[:half])
	// Asked first: the JVM of kafka-metadata-quorum takes seconds, in
	// which the consumers would finish the first half.
	victim := c.controller()
	fp := failpoints{Slow: 5 * time.Millisecond}
	c1, c2 := r.start(fp), r.start(fp)
	r.waitApplied(100, c1, c2)
	killedAt := r.ledgerRows()
	c.kill(victim)
	var next int
	testenv.WaitUntilProgress(t, 2*time.Minute, "a new active controller", func() (bool, string) {
		next = c.controller()
		return next != victim, fmt.Sprintf("node %d", next)
	})
	t.Logf("active controller node %d killed with %d payments applied; node %d took over", victim, killedAt, next)
	c3 := r.start(fp)
	r.produce(s.first[half:])
	at := r.ledgerRows()
	want := int64(r.wantPayments())
	r.waitApplied(min(at+100, want), c1, c2, c3)
	c.start(victim)
	r.waitApplied(want, c1, c2, c3)
	r.produce(s.conflicts)
	r.finish()
}
