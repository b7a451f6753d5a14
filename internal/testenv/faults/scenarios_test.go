package faults_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/examples/payments"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/internal/testenv/rmqtest"
)

// scenario is one fault, run for each broker it names.
type scenario struct {
	num     int
	name    string
	brokers []string
	run     func(t *testing.T, broker, title string)
}

var scenarios = []scenario{
	{1, "concurrent-duplicates", []string{"kafka", "rocketmq"}, concurrentDuplicates},
	{2, "sigkill-after-commit", []string{"kafka", "rocketmq"}, sigkillAfterCommit},
	{3, "sigkill-before-commit", []string{"kafka", "rocketmq"}, sigkillBeforeCommit},
	{4, "commit-outcome-unknown", []string{"kafka", "rocketmq"}, commitOutcomeUnknown},
	{5, "postgres-restart", []string{"kafka", "rocketmq"}, postgresRestart},
	{6, "broker-restart", []string{"kafka", "rocketmq"}, brokerRestart},
	{7, "rebalance", []string{"kafka", "rocketmq"}, rebalance},
	{8, "retries-exhausted", []string{"kafka", "rocketmq"}, retriesExhausted},
	{9, "poison-interleaved", []string{"kafka", "rocketmq"}, poisonInterleaved},
	{10, "tenants-and-mismatch", []string{"kafka", "rocketmq"}, tenantsAndMismatch},
	{11, "panics", []string{"kafka", "rocketmq"}, panics},
	{12, "constraint-violations", []string{"kafka", "rocketmq"}, constraintViolations},
	{13, "sigterm-mid-batch", []string{"kafka", "rocketmq"}, sigtermMidBatch},
	{14, "ordered-poison", []string{"kafka", "rocketmq"}, orderedPoison},
	{15, "key-lanes", []string{"kafka"}, keyLanes},
	{20, "scale-out", []string{"kafka", "rocketmq", "kafka-cluster", "rocketmq-cluster"}, scaleOut},
	// On the three-node cluster (cluster_test.go); each has it to itself.
	{16, "leader-sigkill", []string{"kafka-cluster"}, clusterLeaderKill},
	{17, "broker-lost", []string{"kafka-cluster"}, clusterBrokerLost},
	{18, "dead-letters-leader-change", []string{"kafka-cluster"}, clusterDeadLetterLeaderChange},
	{19, "controller-failover", []string{"kafka-cluster"}, clusterControllerFailover},
	{21, "offsets-in-store", []string{"kafka"}, offsetsInStore},
	// Three runs of 40-70 s each, one after the other (retries_test.go):
	// make test-faults only (the Makefile's SKIP).
	{23, "nonblocking-retries", []string{"kafka", "rocketmq"}, nonBlockingRetries},
	// Scenario 7 with twenty member changes, about four minutes a broker:
	// make test-faults only (the Makefile's SKIP).
	{24, "rebalance-storm", []string{"kafka", "rocketmq"}, rebalanceStorm},
	// KeyOrdered's holds in the store across a SIGKILL and two rebalances,
	// about 3 minutes a broker (parking_test.go): make test-faults only.
	{25, "key-parked", []string{"kafka", "rocketmq"}, keyParked},
	// On the two-broker RocketMQ (rmqcluster_test.go); each has it to itself.
	{22, "broker-lost-and-back", []string{"rocketmq-cluster"}, rocketClusterBrokerLost},
}

// TestFaults runs every scenario for every broker it applies to; each
// scenario's checks are in rig.finish. Run one alone with
// go test -C internal/testenv/faults -run 'TestFaults/kafka/sigkill-after-commit' .
// (the suite is a module of its own).
func TestFaults(t *testing.T) {
	for _, b := range []string{"kafka", "rocketmq", "kafka-cluster", "rocketmq-cluster"} {
		t.Run(b, func(t *testing.T) {
			t.Parallel()
			for _, sc := range scenarios {
				for _, on := range sc.brokers {
					if on != b {
						continue
					}
					t.Run(sc.name, func(t *testing.T) {
						t.Parallel()
						sc.run(t, b, fmt.Sprintf("%d %s", sc.num, sc.name))
					})
				}
			}
		})
	}
}

// env returns the broker named b: the shared Kafka or RocketMQ, or a
// cluster, which the test then has to itself.
func env(t *testing.T, b string) broker {
	switch b {
	case "kafka":
		return newKafka(t, false)
	case "kafka-cluster":
		return newKafkaCluster(t)
	case "rocketmq-cluster":
		return newRocketCluster(t)
	}
	return newRocket(t)
}

// 1. 100 concurrent deliveries of one business key, on 8 partitions and 4
// consumer processes, while the first claimer holds its transaction open:
// one effect, 99 duplicates.
func concurrentDuplicates(t *testing.T, b, title string) {
	br := env(t, b)
	r := newRig(t, br, title, 8)
	r.sampleOffsets()
	s := r.newStream("", 200, 1)
	hot := payments.Order{ID: "HOT-ORDER", Account: "merchant-hot", SKU: "sku-hot", Amount: 4242}
	if err := payments.CreateOrders(testenv.Context(t, time.Minute), payments.Pgx(r.pool), []payments.Order{hot}); err != nil {
		t.Fatal(err)
	}
	r.expected[""] = append(r.expected[""], payments.Expected{TxnID: "HOT-TXN", Amount: hot.Amount})
	const copies = 100
	var msgs []outMsg
	for i, m := range s.first {
		msgs = append(msgs, m)
		if i%2 == 0 && len(msgs) < 2*copies {
			h := r.msg("", callback("HOT-TXN", hot))
			h.Part = i % r.parts // spread over every partition, whatever the order
			msgs = append(msgs, h)
		}
	}
	for len(msgs) < len(s.first)+copies {
		h := r.msg("", callback("HOT-TXN", hot))
		h.Part = len(msgs) % r.parts
		msgs = append(msgs, h)
	}
	fp := failpoints{SlowKeys: []string{"HOT-TXN"}, SlowFor: 300 * time.Millisecond}
	for range 4 {
		r.start(fp)
	}
	if k, ok := br.(*kafkaBroker); ok {
		testenv.WaitUntilProgress(t, time.Minute, "4 consumers in the group", func() (bool, string) {
			n := k.StableMembers(r.group)
			return n == 4, fmt.Sprintf("%d stable members", n)
		})
	} // RocketMQ: the broker notifies the members of each join and they rebalance at once

	r.produce(msgs)
	r.waitApplied(int64(r.wantPayments()))
	r.produce(s.conflicts)
	r.finish()
	if d := r.duplicates(); d < copies-1+int64(s.dups) {
		t.Errorf("%d duplicates skipped, want at least %d (hot key) + %d (generated)", d, copies-1, s.dups)
	}
	var hotRows int
	if err := r.pool.QueryRow(context.Background(), `SELECT count(*) FROM effects_audit WHERE txn_id = 'HOT-TXN'`).Scan(&hotRows); err != nil || hotRows != 1 {
		t.Errorf("HOT-TXN applied %d times (%v), want once", hotRows, err)
	}
}

// 2. SIGKILL in Source.Ack: the batch's transaction committed, its offsets
// did not. The next consumer is redelivered what the killed one applied
// past the committed offsets and skips it.
func sigkillAfterCommit(t *testing.T, b, title string) {
	r := newRig(t, env(t, b), title, 4)
	r.sampleOffsets()
	s := r.newStream("", 300, 2)
	r.produce(s.first)
	c1 := r.start(failpoints{KillInAck: 120})
	c1.waitExit(t, 2*time.Minute, "its SIGKILL in Ack")
	if !c1.Killed() {
		t.Fatalf("child 1 was not killed by its failpoint: %v\n%s", c1.Err(), tail(c1.Out.String(), 2048))
	}
	r.midReconcile("after the kill")
	past := r.appliedPastCommitted(c1)
	t.Logf("applied by the killed consumer past the committed offsets: %d", past)
	if past == 0 {
		t.Fatal("the kill did not land between the database commit and the offset commit")
	}
	c2 := r.start(failpoints{})
	r.waitApplied(int64(r.wantPayments()), c2)
	r.produce(s.conflicts)
	r.finish()
	if d := c2.stats().Stats.Duplicates; d < int64(past) {
		t.Errorf("the second consumer skipped %d duplicates, want at least the %d redelivered", d, past)
	}
}

// appliedPastCommitted counts the payments c applied whose messages are at
// or past the group's committed offsets: committed in the database, not on
// the broker.
func (r *rig) appliedPastCommitted(c *child) int {
	r.t.Helper()
	committed := r.committed()
	rows, err := r.pool.Query(context.Background(), `SELECT lane, part, off FROM effects_audit WHERE pid = $1`, c.stats().Pid)
	if err != nil {
		r.t.Fatal(err)
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var lane string
		var part int
		var off int64
		if err := rows.Scan(&lane, &part, &off); err != nil {
			r.t.Fatal(err)
		}
		if strings.Contains(lane, "%RETRY%") {
			continue
		}
		if c, ok := committed[part]; !ok || off >= c {
			n++
		}
	}
	if err := rows.Err(); err != nil {
		r.t.Fatal(err)
	}
	return n
}

// committed returns the group's committed offsets, failing the test when
// they cannot be read.
func (r *rig) committed() map[int]int64 {
	r.t.Helper()
	got, err := r.b.offsets(testenv.Context(r.t, 10*time.Second), r.topic, r.group)
	if err != nil {
		r.t.Fatalf("committed offsets of %s: %v", r.group, err)
	}
	return got
}

// 3. SIGKILL inside a transaction, after the handlers wrote and before
// COMMIT — a transaction that stayed open for 6 s, past RocketMQ's 5-second
// offset persistence: Postgres rolls back, no transaction stays open, the
// redelivery applies the batch once.
func sigkillBeforeCommit(t *testing.T, b, title string) {
	r := newRig(t, env(t, b), title, 4)
	r.sampleOffsets()
	s := r.newStream("", 300, 3)
	r.produce(s.first)
	victim := r.expected[""][120].TxnID
	c1 := r.start(failpoints{KillWithKey: victim, SlowKeys: []string{victim}, SlowFor: 6 * time.Second}, batch(20))
	c1.waitExit(t, 2*time.Minute, "its SIGKILL before COMMIT")
	if !c1.Killed() {
		t.Fatalf("child 1 was not killed by its failpoint: %v\n%s", c1.Err(), tail(c1.Out.String(), 2048))
	}
	r.checkNoOpenTx(t)
	r.midReconcile("after the kill")
	var n int
	if err := r.pool.QueryRow(context.Background(), `SELECT count(*) FROM ledger WHERE txn_id = $1`, victim).Scan(&n); err != nil || n != 0 {
		t.Fatalf("the killed transaction's payment is in the ledger (%d, %v)", n, err)
	}
	c2 := r.start(failpoints{})
	r.waitApplied(int64(r.wantPayments()), c2)
	r.produce(s.conflicts)
	r.finish()
}

func batch(n int) func(*childSpec) { return func(s *childSpec) { s.BatchSize = n } }

// 4. COMMIT's outcome unknown both ways: every third transaction commits and
// reports a lost connection, every fifth loses its connection before COMMIT
// (rolled back). No ack on either; the retry's claim finds the rows (skip)
// or not (apply).
func commitOutcomeUnknown(t *testing.T, b, title string) {
	r := newRig(t, env(t, b), title, 4)
	r.sampleOffsets()
	s := r.newStream("", 300, 4)
	r.produce(s.first)
	c := r.start(failpoints{CommitLostEvery: 3, RollbackLostEvery: 5}, batch(10))
	r.waitApplied(int64(r.wantPayments()), c)
	r.produce(s.conflicts)
	r.finish()
	st := c.stats()
	t.Logf("committed, outcome lost: %d; rolled back, connection lost: %d; duplicates %d", st.CommitLost, st.RollbackLost, st.Stats.Duplicates)
	if st.CommitLost == 0 || st.RollbackLost == 0 {
		t.Fatalf("the fault did not fire both ways: %+v", st)
	}
	if st.Stats.Duplicates < st.CommitLost {
		t.Errorf("%d duplicates skipped, want at least one per committed-but-unknown transaction (%d)", st.Stats.Duplicates, st.CommitLost)
	}
}

// 7. Rebalance during processing: members join and leave (SIGTERM and
// SIGKILL in turn) every few seconds while a slow handler works. Committed
// offsets keep the broker's rule (Kafka: never down; RocketMQ: never ahead
// of the settled messages, see offsetSampler); nothing is applied twice or
// lost; and partitions (queues) did change hands mid-stream, which the
// audit shows as one partition's effects applied by more than one process.
//
// On RocketMQ the broker tells the group's members of every join and leave
// (a closed connection included) and they rebalance at once; its 20 s
// periodic rebalance is only the fallback.
func rebalance(t *testing.T, b, title string) {
	memberChurn(t, b, title, churn{payments: 1200, seed: 7, slow: 4 * time.Millisecond,
		changes: 4, pace: 2500 * time.Millisecond, midStream: 2})
}

// 24. Rebalance storm: scenario 7 with twenty member changes 1.2 s apart
// (SIGTERM and SIGKILL in turn) over a stream of 4,000 payments, and on
// every third change a member that joins and is SIGKILLed 0.7 s later,
// so that queues (partitions) go back and forth between members while
// their consume calls are still in flight. The checks are scenario 7's.
// Written to bring back the stall of a fresh-clone run (two RocketMQ
// queues left at a batch boundary; docs/records/reliability-runs.md): it
// did not.
func rebalanceStorm(t *testing.T, b, title string) {
	memberChurn(t, b, title, churn{payments: 4000, seed: 24, slow: 6 * time.Millisecond,
		changes: 20, pace: 1200 * time.Millisecond, flashEvery: 3, midStream: 10})
}

// churn is how scenarios 7 and 24 change a group's members.
type churn struct {
	payments   int
	seed       uint64
	slow       time.Duration // every handler call
	changes    int           // each starts a member, then stops the oldest
	pace       time.Duration // between a start and the stop
	flashEvery int           // every flashEvery-th change also starts a member SIGKILLed 0.7 s later; 0: none
	midStream  int           // changes that must come before the stream is applied
}

// memberChurn runs scenarios 7 and 24: two members, then c.changes member
// changes, each starting a member and stopping the oldest by SIGTERM and
// SIGKILL in turn; then the checks of every scenario, that enough changes
// came mid-stream, and that partitions changed hands.
func memberChurn(t *testing.T, b, title string, c churn) {
	r := newRig(t, env(t, b), title, 6)
	r.sampleOffsets()
	s := r.newStream("", c.payments, c.seed)
	r.produce(s.first)
	fp := failpoints{Slow: c.slow}
	members := []*child{r.start(fp), r.start(fp)}
	r.waitApplied(100)
	want := int64(r.wantPayments())
	midStream := 0
	for i := range c.changes {
		members = append(members, r.start(fp))
		if c.flashEvery > 0 && i%c.flashEvery == c.flashEvery-1 {
			flash := r.start(fp)
			time.Sleep(700 * time.Millisecond) // pacing, not an assertion
			flash.Kill()
		}
		time.Sleep(c.pace) // pacing, not an assertion
		old := members[0]
		members = members[1:]
		if i%2 == 0 {
			old.stop(t)
		} else {
			old.Kill()
		}
		n := r.ledgerRows()
		if n < want {
			midStream++
		}
		t.Logf("member change %d: %d of %d payments applied", i+1, n, want)
	}
	r.waitApplied(want, members...)
	r.produce(s.conflicts)
	r.finish()
	if midStream < c.midStream {
		t.Errorf("only %d member changes happened before the stream was applied: the scenario proved little", midStream)
	}
	// By lane, not partition number: on a RocketMQ cluster queue q of each
	// broker is partition q to the consumer. The group's retry topic left
	// out.
	var moved int
	if err := r.pool.QueryRow(context.Background(), `SELECT count(*) FROM (SELECT lane FROM effects_audit
		WHERE strpos(lane, '%RETRY%') = 0 GROUP BY lane HAVING count(DISTINCT pid) > 1) m`).Scan(&moved); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d of %d partitions were applied by more than one process", moved, r.parts)
	if moved == 0 {
		t.Error("no partition changed hands mid-stream")
	}
}

// 8. A handler that always fails with a transient error: retried up to
// the policy's bound, then dead-lettered; the partition goes on.
func retriesExhausted(t *testing.T, b, title string) {
	r := newRig(t, env(t, b), title, 4)
	r.sampleOffsets()
	s := r.newStream("", 300, 8)
	var failing []string
	for _, i := range []int{5, 77, 151} {
		txn := r.expected[""][i].TxnID
		failing = append(failing, txn)
		r.unexpect("", txn)
		r.wantLetter(s.first, txn, "gave up after 10 attempts")
	}
	r.produce(s.first)
	c := r.start(failpoints{Transient: failing})
	r.waitApplied(int64(r.wantPayments()), c)
	r.produce(s.conflicts)
	r.finish()
	r.requireAttempts(failing, "10")
}

// requireAttempts checks the attempts the dead letters of txns carry.
func (r *rig) requireAttempts(txns []string, want string) {
	r.t.Helper()
	letters := r.b.deadLetters(r.t, r.topic, len(r.wantDLQ))
	for _, txn := range txns {
		found := false
		for _, l := range letters {
			if l.Key == txn {
				found = true
				if l.Attempts != want {
					r.t.Errorf("%s dead-lettered after %s attempts, want %s", txn, l.Attempts, want)
				}
			}
		}
		if !found {
			r.t.Errorf("no dead letter names key %s", txn)
		}
	}
}

// 9. Poison, oversized and key-less messages interleaved with good ones:
// each dead-lettered with its reason, the good ones applied.
func poisonInterleaved(t *testing.T, b, title string) {
	r := newRig(t, env(t, b), title, 4)
	r.sampleOffsets()
	s := r.newStream("", 400, 9)
	poison := []struct {
		payload, reason string
	}{
		{` `, reasonBadJSON}, // RocketMQ refuses an empty body
		{"\x00\x01binary\xff", reasonBadJSON},
		{`[1,2,3]`, reasonBadJSON},
		{`{"txn_id":null,"order_id":"O-000001","amount":5,"status":"SUCCESS"}`, reasonNoKey},
		{`{"order_id":"O-000002","amount":5,"status":"SUCCESS"}`, reasonNoKey},
		{`{"txn_id":"bad\u0001key","order_id":"O-000003","amount":5,"status":"SUCCESS"}`, "invalid key"},
		{`{"txn_id":"NEG-1","order_id":"O-000004","amount":-5,"status":"SUCCESS"}`, "bad callback"},
		{`{"txn_id":"big","pad":"` + strings.Repeat("x", payments.MaxPayload) + `"}`, reasonTooLarge},
	}
	var msgs []outMsg
	step := len(s.first) / len(poison)
	for i, m := range s.first {
		msgs = append(msgs, m)
		if i%step == step/2 && i/step < len(poison) {
			p := poison[i/step]
			pm := r.msg("", []byte(p.payload))
			pm.Part = i % r.parts
			r.wantDLQ[pm.ID] = p.reason
			msgs = append(msgs, pm)
		}
	}
	r.produce(msgs)
	c := r.start(failpoints{})
	r.waitApplied(int64(r.wantPayments()), c)
	r.produce(s.conflicts)
	r.finish()
}

// 10. The same txn_ids in two tenants: two effects each, in each tenant's
// tables; a txn_id re-used with another amount: no effect, dead-lettered.
func tenantsAndMismatch(t *testing.T, b, title string) {
	r := newRig(t, env(t, b), title, 4, "acme", "globex")
	r.sampleOffsets()
	a := r.newStream("acme", 150, 10)
	g := r.newStream("globex", 150, 10) // the same payments, txn_ids and bodies
	r.produce(append(a.first, g.first...))
	c := r.start(failpoints{})
	r.waitApplied(int64(r.wantPayments()), c)
	r.produce(append(a.conflicts, g.conflicts...))
	r.finish()
	var both int
	if err := r.pool.QueryRow(context.Background(), `SELECT count(*) FROM (SELECT txn_id FROM effects_audit
		GROUP BY txn_id HAVING count(DISTINCT tenant) = 2) x`).Scan(&both); err != nil {
		t.Fatal(err)
	}
	if both != len(r.expected["acme"]) {
		t.Errorf("%d txn_ids applied in both tenants, want %d", both, len(r.expected["acme"]))
	}
}

// 11. A handler that panics once, then succeeds, and one that always
// panics: the first applied once, the second dead-lettered after the
// policy's 10 attempts; the process stays up.
func panics(t *testing.T, b, title string) {
	r := newRig(t, env(t, b), title, 4)
	r.sampleOffsets()
	s := r.newStream("", 300, 11)
	once, always := r.expected[""][10].TxnID, r.expected[""][200].TxnID
	r.unexpect("", always)
	r.wantLetter(s.first, always, "handler panicked")
	r.produce(s.first)
	c := r.start(failpoints{PanicOnce: []string{once}, PanicAlways: []string{always}})
	r.waitApplied(int64(r.wantPayments()), c)
	r.produce(s.conflicts)
	c.requireAlive(t)
	r.finish()
	r.requireAttempts([]string{always}, "10")
	if p := c.stats().Panics; p < 11 {
		t.Errorf("%d panics, want at least 11 (1 once + 10 always)", p)
	}
}

// 12. A CHECK violation after the handler's effects, returned; and one the
// handler swallows, so that COMMIT turns into ROLLBACK: no partial effect,
// both dead-lettered and recorded as failed, the rest of their batches
// applied.
func constraintViolations(t *testing.T, b, title string) {
	r := newRig(t, env(t, b), title, 4)
	r.sampleOffsets()
	s := r.newStream("", 300, 12)
	returned, swallowed := r.expected[""][20].TxnID, r.expected[""][150].TxnID
	for _, txn := range []string{returned, swallowed} {
		r.unexpect("", txn)
	}
	r.wantLetter(s.first, returned, "orders_amount_check")
	r.wantLetter(s.first, swallowed, "commit unexpectedly resulted in rollback")
	r.produce(s.first)
	c := r.start(failpoints{Constraint: []string{returned}, Swallowed: []string{swallowed}})
	r.waitApplied(int64(r.wantPayments()), c)
	r.produce(s.conflicts)
	r.finish()
	var failed int
	if err := r.pool.QueryRow(context.Background(), `SELECT count(*) FROM `+pgx.Identifier{r.schema, "idem_dedup"}.Sanitize()+
		` WHERE outcome = 'failed' AND key = ANY($1)`, []string{returned, swallowed}).Scan(&failed); err != nil {
		t.Fatal(err)
	}
	if failed != 2 {
		t.Errorf("%d of the two violations recorded as failed", failed)
	}
}

// 13. SIGTERM in the middle of slow batches: the child exits within its
// grace period, and every message below the committed offsets was settled
// (its key is in the dedup table or it was dead-lettered).
func sigtermMidBatch(t *testing.T, b, title string) {
	r := newRig(t, env(t, b), title, 4)
	r.sampleOffsets()
	s := r.newStream("", 500, 13)
	r.produce(s.first)
	const grace = 5 * time.Second
	c1 := r.start(failpoints{Slow: 8 * time.Millisecond}, func(s *childSpec) { s.Grace = grace; s.KafkaClose = 2 * time.Second })
	r.waitApplied(60, c1)
	c1.term()
	c1.waitExit(t, grace+15*time.Second, "SIGTERM with a grace period of "+grace.String())
	if err := c1.Err(); err != nil {
		t.Fatalf("child exited with %v after SIGTERM", err)
	}
	st := c1.stats()
	t.Logf("Stop took %v (err %q), %d applied, %d acked", st.StopTook, st.StopErr, st.Stats.Applied, st.Acked)
	if !st.Stopped {
		t.Fatal("the child did not go through Stop")
	}
	r.checkNoOpenTx(t)
	r.midReconcile("after SIGTERM")
	if n := r.ledgerRows(); n >= int64(r.wantPayments()) {
		t.Fatalf("the child applied everything (%d) before SIGTERM: nothing was in flight", n)
	}
	r.requireSettledBelowCommitted()
	c2 := r.start(failpoints{})
	r.waitApplied(int64(r.wantPayments()), c2)
	r.produce(s.conflicts)
	r.finish()
}

// requireSettledBelowCommitted fails unless every message below the
// group's committed offsets is settled: its key has a dedup row (applied,
// skipped or failed) or it is one to dead-letter.
func (r *rig) requireSettledBelowCommitted() {
	r.t.Helper()
	committed := r.committed()
	positions := r.b.positions(r.t, r.topic)
	keys := map[string]bool{}
	rows, err := r.pool.Query(context.Background(), `SELECT key FROM `+pgx.Identifier{r.schema, "idem_dedup"}.Sanitize())
	if err != nil {
		r.t.Fatal(err)
	}
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			r.t.Fatal(err)
		}
		keys[k] = true
	}
	rows.Close()
	values := r.sentValues()
	below, bad := 0, 0
	for id, p := range positions {
		c, ok := committed[p.Part]
		if !ok || p.Off >= c {
			continue
		}
		below++
		if _, dlq := r.wantDLQ[id]; dlq {
			continue
		}
		txn := txnOf(values[id])
		if !keys[txn] {
			if bad++; bad <= 5 {
				r.t.Errorf("message %s (partition %d offset %d, txn %s) is below the committed offset %d but was not processed", id, p.Part, p.Off, txn, c)
			}
		}
	}
	r.t.Logf("%d messages below the committed offsets %v, all settled: %v", below, committed, bad == 0)
	if below == 0 {
		r.t.Error("nothing was committed before SIGTERM: the check proved nothing")
	}
}

// 5. Postgres restarted mid-stream, with a fast and then an immediate
// shutdown, then the consumer's backends terminated every 200ms while
// Toxiproxy between consumer and Postgres adds latency and resets
// connections: everything applied once, nothing dead-lettered over it, and
// the retries back off (no hot loop). A private cluster: other packages'
// tests share the test environment's.
func postgresRestart(t *testing.T, b, title string) {
	// Durable (see testenv.PrivatePostgres): with synchronous_commit or
	// fsync off, an immediate shutdown loses transactions whose COMMIT
	// already succeeded — messages the consumer rightly acknowledged. (This
	// suite caught exactly that before.)
	pg := testenv.NewPrivatePostgres(t, "deadlock_timeout = 100ms")
	px := newProxy(t, pg.Addr())
	cfg, err := pgxpool.ParseConfig(pg.URL())
	if err != nil {
		t.Fatal(err)
	}
	base, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(base.Close)
	r := newRigOn(t, env(t, b), title, 4, base, pg.URLVia(px.addr()))
	r.sampleOffsets()
	s := r.newStream("", 1000, 5)
	r.produce(s.first)
	c := r.start(failpoints{Slow: 3 * time.Millisecond})
	outage := func(at int64, what string, fault func()) {
		r.waitApplied(at, c)
		before := px.accepted.Load()
		began := time.Now()
		fault()
		for _, p := range []*pgxpool.Pool{r.base, r.pool} {
			p.Reset() // the checks' own connections died too
		}
		t.Logf("%s at %d applied: %v, %d connection attempts meanwhile", what, at, time.Since(began).Round(time.Millisecond), px.accepted.Load()-before)
	}
	outage(150, "fast shutdown and restart", func() {
		pg.Stop("fast")
		time.Sleep(time.Second) // down for a while: the consumer must wait it out
		pg.Start()
	})
	outage(350, "immediate shutdown and restart", func() {
		pg.Stop("immediate")
		time.Sleep(time.Second)
		pg.Start()
	})
	outage(550, "backends terminated and connections reset", func() {
		px.setLatency(5 * time.Millisecond)
		killer := schemaPool(t, pg.URL(), "public")
		for i := range 15 {
			time.Sleep(200 * time.Millisecond)
			_, _ = killer.Exec(context.Background(), `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1`, r.app)
			if i%3 == 2 {
				px.reset()
			}
		}
		px.setLatency(0)
	})
	if n := r.ledgerRows(); n >= int64(r.wantPayments()) {
		t.Errorf("the stream was done before the last fault (%d applied): lower the count or slow the handler", n)
	}
	r.waitApplied(int64(r.wantPayments()), c)
	r.produce(s.conflicts)
	r.finish()
	st := c.stats().Stats
	t.Logf("retries %d, connection attempts %d, stats %+v", st.Retries, px.accepted.Load(), st)
	if px.accepted.Load() == 0 {
		t.Error("no connection attempt counted: the bound below would prove nothing (did Toxiproxy's \"Accepted client\" log event change? proxy_test.go)")
	}
	// A hot loop retries thousands of times a second; jittered backoff a
	// few times per lane and second of outage.
	if st.Retries > 400 || px.accepted.Load() > 600 {
		t.Errorf("%d retries and %d connection attempts over three outages of a few seconds: a hot loop", st.Retries, px.accepted.Load())
	}
}

// 6. The broker killed (SIGKILL) and started again while the consumer
// works; half of the stream is produced after the restart. The consumer
// resumes by itself. Kafka: the shared broker under testenv.KafkaExclusive;
// RocketMQ: a private name server and broker (the shared one has no lock
// other packages take).
func brokerRestart(t *testing.T, b, title string) {
	var br broker
	var r *rig
	var kill, restart func()
	switch b {
	case "kafka":
		k := newKafka(t, true)
		if out, err := testenv.RunScript("kafka", "status"); err != nil {
			t.Fatalf("the broker at %v is not managed by scripts/testenv/kafka.sh: %s", k.Brokers, out)
		}
		t.Cleanup(func() { testenv.Script(t, "kafka", "start") }) // whatever happened, leave a broker running
		br = k
		kill = func() { testenv.Script(t, "kafka", "kill") }
		restart = func() {
			testenv.Script(t, "kafka", "start")
			k.Transport.CloseIdleConnections()
		}
	default:
		p := rmqtest.NewPrivate(t)
		rb, err := connectRocket(p.NameServers())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(rb.close)
		// The broker keeps consumer offsets in memory and flushes them
		// every 5 s: killed, it comes back with older ones (the consumer
		// then redelivers, and the claim skips), which the offset check
		// for RocketMQ allows (offsetSampler).
		br, restart, kill = rb, p.StartBroker, p.KillBroker
	}
	r = newRig(t, br, title, 4)
	r.sampleOffsets()
	s := r.newStream("", 600, 6)
	half := len(s.first) / 2
	r.produce(s.first[:half])
	c := r.start(failpoints{Slow: 5 * time.Millisecond})
	r.waitApplied(100, c)
	kill()
	at := r.ledgerRows()
	time.Sleep(2 * time.Second) // down for a while
	restart()
	t.Logf("%d payments applied when the broker was killed", at)
	r.produce(s.first[half:])
	r.waitApplied(int64(r.wantPayments()), c)
	r.produce(s.conflicts)
	r.finish()
}

// 14. An ordered stream with a poison message under StopLaneOnExhausted
// (block and alert; RocketMQ in orderly mode, its queue locked on the
// broker, with a reconsume limit of 2 that the client would use to skip the
// message if the adapter merely suspended the queue): the poison's
// partition stops at it — nothing behind it is applied, dead-lettered or
// committed past, nothing is skipped silently — while the other partitions
// finish. Once the cause is fixed, a restarted consumer applies the poison
// and the rest of its partition.
func orderedPoison(t *testing.T, b, title string) {
	r := newRig(t, env(t, b), title, 4)
	r.sampleOffsets()
	s := r.newStream("", 300, 14)
	poison := r.expected[""][60].TxnID
	var at *outMsg
	for i, m := range s.first {
		if txnOf(m.Value) == poison {
			at = &s.first[i]
			break
		}
	}
	if at == nil {
		t.Fatalf("no message carries %s", poison)
	}
	// What the poison holds back: the messages behind it in its partition.
	behind, notBehind := map[string]bool{}, map[string]bool{}
	past := false
	for _, m := range s.first {
		switch {
		case m.ID == at.ID:
			past = true
		case past && m.Part == at.Part:
			behind[m.ID] = true
		default:
			notBehind[txnOf(m.Value)] = true
		}
	}
	wantApplied := map[string]bool{}
	for _, e := range r.expected[""] {
		if e.TxnID != poison && notBehind[e.TxnID] {
			wantApplied[e.TxnID] = true
		}
	}
	wantLetters := 0 // of the first wave (the conflicts are sent at the end)
	for _, m := range s.first {
		if _, bad := r.wantDLQ[m.ID]; bad && !behind[m.ID] {
			wantLetters++
		}
	}
	if len(wantApplied) == len(r.expected[""])-1 {
		t.Fatal("nothing valid behind the poison in its partition: the scenario proves nothing")
	}
	r.produce(s.first)
	blocking := func(sp *childSpec) { sp.StopLane, sp.Orderly, sp.Attempts, sp.Reconsume = true, true, 3, 2 }
	c := r.start(failpoints{Transient: []string{poison}}, blocking)
	testenv.WaitUntilProgress(t, 2*time.Minute, "the poison's lane stopped", func() (bool, string) {
		c.requireAlive(t)
		return strings.Contains(c.Out.String(), "idem: lane stopped"), ""
	})
	r.waitApplied(int64(len(wantApplied)), c)
	ends, positions := map[int]int64{}, r.b.positions(t, r.topic)
	for _, p := range positions {
		ends[p.Part] = max(ends[p.Part], p.Off+1)
	}
	poisonOff := positions[at.ID].Off
	testenv.WaitUntilProgress(t, time.Minute, "the other partitions committed to their ends", func() (bool, string) {
		got, err := r.b.offsets(context.Background(), r.topic, r.group)
		if err != nil {
			return false, err.Error()
		}
		for p, end := range ends {
			if p != at.Part && got[p] != end {
				return false, fmt.Sprintf("committed %v, ends %v", got, ends)
			}
		}
		return true, ""
	})
	// Past the client's reconsume limit (2 × the 1 s suspend on RocketMQ):
	// the block must still hold.
	time.Sleep(5 * time.Second)
	c.requireAlive(t)
	if got := r.committed(); got[at.Part] > poisonOff {
		t.Errorf("partition %d committed to %d, past the poison at %d", at.Part, got[at.Part], poisonOff)
	}
	applied := r.ledgerTxns()
	for txn := range wantApplied {
		if !applied[txn] {
			t.Errorf("%s (not behind the poison) was not applied", txn)
		}
	}
	for txn := range applied {
		if !wantApplied[txn] {
			t.Errorf("%s was applied while its partition was stopped at the poison", txn)
		}
	}
	for _, l := range r.b.deadLetters(t, r.topic, wantLetters) {
		if l.ID == at.ID || behind[l.ID] {
			t.Errorf("message %s (the poison or behind it) was dead-lettered while its lane was stopped: %q", l.ID, l.Reason)
		}
	}
	t.Logf("partition %d stopped at offset %d with %d messages behind it; %d payments applied elsewhere", at.Part, poisonOff, len(behind), len(applied))
	if t.Failed() {
		return
	}

	c.stop(t)
	c = r.start(failpoints{}, blocking) // the cause is fixed
	r.waitApplied(int64(r.wantPayments()), c)
	r.produce(s.conflicts)
	r.finish()
}

// ledgerTxns returns the txn_ids in the (tenant-less) ledger.
func (r *rig) ledgerTxns() map[string]bool {
	r.t.Helper()
	rows, err := r.pool.Query(context.Background(), `SELECT txn_id FROM ledger`)
	if err != nil {
		r.t.Fatal(err)
	}
	txns, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		r.t.Fatal(err)
	}
	out := make(map[string]bool, len(txns))
	for _, txn := range txns {
		out[txn] = true
	}
	return out
}

// 15. Key lanes (Config.KeyLanes 8) on 2 partitions, with record keys
// coarser than the payments (ten groups of orders, so that a key has many
// payments): a consumer SIGKILLed between its database commits and its
// offset commit, then members joining, stopping and killed mid-stream.
// Besides every payment once and the offsets never ahead of the settled
// messages: each record key's payments applied in offset order within
// their partition, whichever process applied them, and the key lanes ran
// beside each other (a partition's acks out of offset order).
func keyLanes(t *testing.T, b, title string) {
	r := newRig(t, env(t, b), title, 2)
	r.sampleOffsets()
	s := r.newStream("", 600, 15)
	for _, ms := range [][]outMsg{s.first, s.conflicts} {
		for i := range ms {
			h := uint32(0)
			for _, c := range payments.PartitionKey(ms[i].Value) {
				h = h*31 + uint32(c)
			}
			ms[i].Key = fmt.Sprintf("g%d", h%10)
		}
	}
	// The stream goes out in four parts, so that the member changes fall
	// on partitions with messages in flight however fast the machine is.
	parts := [][]outMsg{}
	for i := range 4 {
		parts = append(parts, s.first[i*len(s.first)/4:(i+1)*len(s.first)/4])
	}
	lanes := func(sp *childSpec) { sp.KeyLanes, sp.BatchSize = 8, 10 }
	fp := failpoints{Slow: 2 * time.Millisecond}
	kill := fp
	kill.KillInAck = 100
	r.produce(parts[0])
	c1 := r.start(kill, lanes)
	c1.waitExit(t, 2*time.Minute, "its SIGKILL in Ack")
	if !c1.Killed() {
		t.Fatalf("child 1 was not killed by its failpoint: %v\n%s", c1.Err(), tail(c1.Out.String(), 2048))
	}
	past := r.appliedPastCommitted(c1)
	t.Logf("applied by the killed consumer past the committed offsets: %d", past)
	if past == 0 {
		t.Fatal("the kill did not land between the database commit and the offset commit")
	}
	members := []*child{r.start(fp, lanes), r.start(fp, lanes)}
	for i, part := range parts[1:] {
		before := r.ledgerRows()
		r.produce(part)
		r.waitApplied(before+10, members...) // the lanes are busy with the part
		members = append(members, r.start(fp, lanes))
		old := members[0]
		members = members[1:]
		if i%2 == 0 {
			old.Kill()
		} else {
			old.stop(t)
		}
		t.Logf("member change %d: %d payments applied", i+1, r.ledgerRows())
	}
	r.waitApplied(int64(r.wantPayments()), members...)
	r.produce(s.conflicts)
	r.finish()

	// By lane, not partition number: on a RocketMQ cluster queue q of each
	// broker is partition q to the consumer. The group's retry topic left
	// out.
	var moved int
	if err := r.pool.QueryRow(context.Background(), `SELECT count(*) FROM (SELECT lane FROM effects_audit
		WHERE strpos(lane, '%RETRY%') = 0 GROUP BY lane HAVING count(DISTINCT pid) > 1) m`).Scan(&moved); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d of %d partitions were applied by more than one process", moved, r.parts)
	if moved == 0 {
		t.Error("no partition changed hands mid-stream")
	}
	var keys, back int
	if err := r.pool.QueryRow(context.Background(), `SELECT count(DISTINCT (part, rkey)), count(*) FILTER (WHERE back)
		FROM (SELECT part, rkey, off < lag(off) OVER (PARTITION BY part, rkey ORDER BY id) AS back FROM effects_audit) a`).Scan(&keys, &back); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d record keys across the partitions; %d payments applied before an earlier one of their key", keys, back)
	if keys < 10 || back != 0 {
		t.Errorf("%d payments applied out of their key's order (of %d keys)", back, keys)
	}
	behind := acksBehind(t, filepath.Join(r.dir, "child-*", ackLogName))
	t.Logf("acks behind an earlier ack of their partition: %d", behind)
	if behind == 0 {
		t.Error("every partition was acked in offset order: the key lanes did not run beside each other")
	}
}

// acksBehind counts, in the ack logs matching glob ("lane partition offset"
// lines in ack order), the acks of an offset below one acked before it in
// the same lane by the same process.
func acksBehind(t *testing.T, glob string) int {
	t.Helper()
	files, err := filepath.Glob(glob)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		high := map[string]int64{}
		for _, line := range strings.Split(string(b), "\n") {
			var lane string
			var part int
			var off int64
			if _, err := fmt.Sscan(line, &lane, &part, &off); err != nil {
				continue // the last line, or a partial one
			}
			if h, ok := high[lane]; ok && off < h {
				n++
			} else {
				high[lane] = off
			}
		}
	}
	return n
}

// 20. Scale-out and back: consumer processes on 8 partitions (queues) grown
// 1 → 2 → 4 → 6, then stopped (SIGTERM) one size at a time back to 1. The
// stream goes out in one part per size, and each change comes while the
// part before it is a third applied, so every change moves partitions with
// messages in flight. Nothing lost or applied twice, lag 0 at the end,
// partitions changed hands, the last single process applied the last part;
// the rate at each size is logged (processes on this machine share two
// cores and 8 lanes, and every change is a rebalance: the point is that
// the lanes spread and nothing is lost, not speed). Also on the clusters,
// which the test has to itself: the three-node Kafka, and the two-broker
// RocketMQ with 4 of the 8 queues on each broker.
func scaleOut(t *testing.T, b, title string) {
	r := newRig(t, env(t, b), title, 8)
	r.sampleOffsets()
	s := r.newStream("", 1400, 16)
	want := int64(r.wantPayments())
	sizes := []int{1, 2, 4, 6, 4, 2, 1}
	fp := failpoints{Slow: 5 * time.Millisecond}
	var members []*child
	var rates []string
	for i, size := range sizes {
		for len(members) < size {
			members = append(members, r.start(fp))
		}
		for len(members) > size {
			old := members[0]
			members = members[1:]
			old.stop(t)
		}
		n0, t0 := r.ledgerRows(), time.Now()
		r.produce(s.first[i*len(s.first)/len(sizes) : (i+1)*len(s.first)/len(sizes)])
		if i == len(sizes)-1 {
			break
		}
		r.waitApplied(n0+60, members...) // about a third of the part
		rates = append(rates, fmt.Sprintf("%d: %.0f/s", size, float64(r.ledgerRows()-n0)/time.Since(t0).Seconds()))
	}
	last := members[0]
	r.waitApplied(want, members...)
	r.produce(s.conflicts)
	r.finish()
	t.Logf("payments per second at each size, its rebalance included: %s", strings.Join(rates, ", "))
	var byLast int
	if err := r.pool.QueryRow(context.Background(), `SELECT count(*) FROM effects_audit WHERE pid = $1`, last.stats().Pid).Scan(&byLast); err != nil {
		t.Fatal(err)
	}
	t.Logf("the last process alone applied %d payments", byLast)
	if byLast == 0 {
		t.Error("the last process applied nothing: the group did not hand it the partitions")
	}
	// By lane, not partition number: on a RocketMQ cluster queue q of each
	// broker is partition q to the consumer. The group's retry topic left
	// out.
	var moved int
	if err := r.pool.QueryRow(context.Background(), `SELECT count(*) FROM (SELECT lane FROM effects_audit
		WHERE strpos(lane, '%RETRY%') = 0 GROUP BY lane HAVING count(DISTINCT pid) > 1) m`).Scan(&moved); err != nil {
		t.Fatal(err)
	}
	var procs int
	if err := r.pool.QueryRow(context.Background(), `SELECT count(DISTINCT pid) FROM effects_audit`).Scan(&procs); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d processes applied payments; %d of %d partitions were applied by more than one", procs, moved, r.parts)
	if procs < 4 || moved == 0 {
		t.Errorf("%d processes applied payments and %d partitions changed hands: the lanes did not spread", procs, moved)
	}
}

// 21. Offsets in the store (Config.Offsets, business keys beside them): a
// SIGKILL in Source.Ack — the batches' transactions moved the store's
// offsets, the group's offsets did not — then a second consumer. It is
// redelivered what the first applied past the group's offsets and skips it
// by the stored offsets; the re-sent business keys are still caught by the
// key table, and each partition's stored next offset ends at its log's end.
func offsetsInStore(t *testing.T, b, title string) {
	r := newRig(t, env(t, b), title, 4)
	r.sampleOffsets()
	s := r.newStream("", 300, 2)
	r.produce(s.first)
	offsets := func(sp *childSpec) { sp.Offsets = true }
	c1 := r.start(failpoints{KillInAck: 120}, offsets)
	c1.waitExit(t, 2*time.Minute, "its SIGKILL in Ack")
	if !c1.Killed() {
		t.Fatalf("child 1 was not killed by its failpoint: %v\n%s", c1.Err(), tail(c1.Out.String(), 2048))
	}
	r.midReconcile("after the kill")
	past := r.appliedPastCommitted(c1)
	t.Logf("applied by the killed consumer past the committed offsets: %d", past)
	if past == 0 {
		t.Fatal("the kill did not land between the database commit and the offset commit")
	}
	c2 := r.start(failpoints{}, offsets)
	r.waitApplied(int64(r.wantPayments()), c2)
	r.produce(s.conflicts)
	r.finish()
	if d := c2.stats().OffsetSkips; d < int64(past) {
		t.Errorf("the second consumer skipped %d duplicates by the stored offsets, want at least the %d redelivered "+
			"(business-key duplicates do not count: they would hide offsets that skip nothing)", d, past)
	}
	committed := r.committed()
	rows, err := r.pool.Query(context.Background(), `SELECT partition, next_offset FROM `+
		pgx.Identifier{r.schema, "idem_dedup_offsets"}.Sanitize()+` WHERE scope = 'payments' AND topic = $1`, r.topic)
	if err != nil {
		t.Fatal(err)
	}
	stored := map[int]int64{}
	for rows.Next() {
		var p int
		var next int64
		if err := rows.Scan(&p, &next); err != nil {
			t.Fatal(err)
		}
		stored[p] = next
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(stored) != fmt.Sprint(committed) {
		t.Errorf("stored next offsets %v, group offsets (at the log ends) %v", stored, committed)
	}
}
