package seams_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	kafkago "github.com/segmentio/kafka-go"
)

// The Kafka mode's operations (kafka_test.go runs them) and their
// generator.

// A kop is one step of a Kafka-mode run; like op, its choices are made
// from the seed when the sequence is generated.
type kop interface {
	String() string
	apply(ctx context.Context, r *kafkaRunner)
}

// kopProduce produces new payments; uncertain[i]: the COMMITs of the
// i-th one's first record are reported failed (the outcome lost).
type kopProduce struct {
	pays      []newPay
	uncertain []bool
}

func (o kopProduce) String() string {
	var s []string
	for i, p := range o.pays {
		x := p.id
		if p.poisoned {
			x += "(poisoned)"
		}
		if p.flaky > 0 {
			x += fmt.Sprintf("(flaky %d)", p.flaky)
		}
		if o.uncertain[i] {
			x += "(COMMIT outcome lost)"
		}
		s = append(s, x)
	}
	return "produce " + strings.Join(s, " ")
}

func (o kopProduce) apply(_ context.Context, r *kafkaRunner) {
	for i, p := range o.pays {
		r.produce(p, o.uncertain[i])
	}
}

// kopResend is the producer (or the payment channel) sending a payment
// again, with the same payload.
type kopResend struct{ pay string }

func (o kopResend) String() string                          { return "resend " + o.pay }
func (o kopResend) apply(_ context.Context, r *kafkaRunner) { r.resend(o.pay) }

// kopRestart kills a process (A when B is not running) and starts a new
// one with cfg; when change says what changed, a deploy: every running
// process is restarted with it.
type kopRestart struct {
	slot   int
	cfg    config
	change string
}

func (o kopRestart) String() string {
	if o.change != "" {
		return fmt.Sprintf("restart consumer %s, %s", slotName(o.slot), o.change)
	}
	return "restart consumer " + slotName(o.slot)
}

func (o kopRestart) apply(_ context.Context, r *kafkaRunner) {
	slot := o.slot
	if r.procs[slot] == nil {
		slot = 0 // B is not running: A is restarted
	}
	r.kill(slot)
	r.cfg = o.cfg
	if o.change != "" {
		r.rep.config = fmt.Sprintf("%v (drawn: %s)", r.cfg, r.rep.drawn)
		// A deploy: every process runs the new configuration.
		for i := range r.procs {
			if i != slot && r.procs[i] != nil {
				r.kill(i)
				r.start(i)
			}
		}
		r.count("configuration changes")
	}
	r.start(slot)
	r.count("restarts")
}

// kopMember adds consumer B to the group, or takes it away: a rebalance.
type kopMember struct{}

func (kopMember) String() string { return "consumer B joins the group, or leaves it" }
func (kopMember) apply(_ context.Context, r *kafkaRunner) {
	if r.procs[1] == nil {
		r.parkedNow(context.Background(), "rebalances")
		r.start(1)
	} else {
		r.kill(1)
	}
	r.count("rebalances")
}

// kopCrashAfterCopy: the next message that goes to retry kills its
// process once its copy is durable, before the original is committed;
// the process is restarted.
type kopCrashAfterCopy struct{ pay newPay }

func (o kopCrashAfterCopy) String() string {
	return fmt.Sprintf("produce %s (flaky %d), crash after its retry copy is durable, before its commit", o.pay.id, o.pay.flaky)
}

func (o kopCrashAfterCopy) apply(_ context.Context, r *kafkaRunner) {
	r.crashArmed.Store(true)
	r.prov.mustRetry(o.pay.id)
	r.freshNext = true // a stale payment is never handled, and never goes to retry
	r.produce(o.pay, false)
	deadline := time.After(kafkaSettle)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case slot := <-r.crashed:
			r.kill(slot)
			r.start(slot)
			r.count("crashes after a retry copy")
			return
		case <-tick.C:
			// With KeyOrdered's limits (parking_test.go), the payment may be
			// dead-lettered parked_too_long before it is tried: nothing
			// went to retry, and nothing will.
			r.mu.Lock()
			p := r.pays[o.pay.id]
			lettered := p.copies == 0 && p.letters > 0
			r.mu.Unlock()
			if !lettered || !r.crashArmed.CompareAndSwap(true, false) {
				continue
			}
			r.count("crashes after a retry copy called off (dead-lettered first)")
			return
		case <-deadline:
			r.t.Fatalf("seams: seed=%d mode=kafka step=%d: no message went to retry within %v\n\tconfig: %v", r.rep.seed, r.rep.stepNow(), kafkaSettle, r.cfg)
		}
	}
}

// kopCrashInFlight produces payments and at once kills the processes
// while they are being handled — before or after their commits, as the
// timing falls — and starts new ones.
type kopCrashInFlight struct{ produce kopProduce }

func (o kopCrashInFlight) String() string {
	return strings.TrimPrefix(o.produce.String(), "produce ") + " produced, the processes killed in flight, restarted"
}

func (o kopCrashInFlight) apply(ctx context.Context, r *kafkaRunner) {
	o.produce.apply(ctx, r)
	for i := range r.procs {
		if r.procs[i] != nil {
			r.kill(i)
			r.start(i)
		}
	}
	r.count("crashes in flight")
}

// kopRedrive fixes a payment's cause and redrives one of its dead letters,
// as `idem redrive --release` does (the idem command's planner itself is
// kopOperatorRedrive's, operator_test.go).
type kopRedrive struct {
	pay  string
	pick int
}

func (o kopRedrive) String() string {
	return fmt.Sprintf("redrive a letter of %s (pick %d)", o.pay, o.pick)
}

func (o kopRedrive) apply(ctx context.Context, r *kafkaRunner) {
	r.mu.Lock()
	p := r.pays[o.pay]
	r.mu.Unlock()
	r.beh.fix(o.pay)
	r.beh.set(o.pay, false, 0)
	r.resolveInDoubt(ctx, o.pay)
	var mine []*letter
	for _, l := range r.dlq.all() {
		var pl payload
		if json.Unmarshal(l.value, &pl) == nil && pl.Pay == o.pay {
			mine = append(mine, l)
		}
	}
	if len(mine) == 0 {
		r.count("redrives without a letter yet")
		return
	}
	headers, part, reason := redriveRecord(ctx, r.t, r.pg, mine[o.pick%len(mine)], r.topic)
	if reason != "" {
		r.count("redrives refused (" + reason + ")")
		return
	}
	msg := kafkago.Message{Partition: part, Key: mine[0].key, Value: mine[o.pick%len(mine)].value}
	for _, h := range headers {
		msg.Headers = append(msg.Headers, kafkago.Header{Key: h.Key, Value: h.Value})
	}
	r.mu.Lock()
	p.poisoned, p.dead = false, false
	p.redrives++
	r.mu.Unlock()
	r.admin.Produce(r.t, r.topic, msg)
	r.count("redrives sent")
}

// kopRedisFlush empties the Redis front's server.
type kopRedisFlush struct{}

func (kopRedisFlush) String() string { return "redis flush" }
func (kopRedisFlush) apply(ctx context.Context, r *kafkaRunner) {
	if r.rdb == nil {
		return
	}
	if err := r.rdb.FlushAll(ctx).Err(); err != nil {
		r.t.Fatalf("redis flush: %v", err)
	}
	r.count("redis flushes")
}

// generateKafka makes a run's ops from the seed; cfg is the first
// configuration (a restart may change it).
func generateKafka(seed uint64, cfg config, steps int) []kop {
	rng := rand.New(rand.NewPCG(seed, seed^0xcafe37))
	// ops draws whether a redrive is the operator's, through the plan, and
	// its choices: from a stream of its own, so that the rest of a seed's
	// sequence is what it was before the operator's redrive was added.
	ops := rand.New(rand.NewPCG(seed, seed^0x9a7e37))
	var pays, poisoned []string
	n, late := 0, 0
	newp := func() newPay {
		n++
		p := newPay{id: fmt.Sprintf("P%03d", n), amount: 1 + rng.IntN(100)}
		switch x := rng.IntN(20); {
		case x < 3:
			p.poisoned = true
			poisoned = append(poisoned, p.id)
		case x < 9:
			p.flaky = 1 + rng.IntN(3)
		}
		pays = append(pays, p.id)
		return p
	}
	produce := func(k int) kop {
		var o kopProduce
		for range k {
			p := newp()
			o.pays = append(o.pays, p)
			o.uncertain = append(o.uncertain, p.flaky == 0 && !p.poisoned && rng.IntN(4) == 0)
		}
		return o
	}
	seq := []kop{produce(3)}
	for len(seq) < steps {
		var cs []struct {
			w int
			f func() kop
		}
		add := func(w int, f func() kop) {
			cs = append(cs, struct {
				w int
				f func() kop
			}{w, f})
		}
		add(10, func() kop { return produce(1 + rng.IntN(3)) })
		add(4, func() kop {
			o := kopRestart{slot: rng.IntN(2), cfg: cfg}
			if rng.IntN(2) == 0 {
				o.cfg, o.change = cfg.change(rng)
				cfg = o.cfg
			}
			return o
		})
		add(3, func() kop { return kopMember{} })
		add(3, func() kop { return kopCrashInFlight{produce: produce(1 + rng.IntN(4)).(kopProduce)} })
		if cfg.nonBlocking {
			add(5, func() kop {
				p := newp()
				p.poisoned, p.flaky = false, 1+cfg.attempts // goes to retry at least once
				poisoned = slices.DeleteFunc(poisoned, func(s string) bool { return s == p.id })
				return kopCrashAfterCopy{pay: p}
			})
		}
		if cfg.business() && len(pays) > 0 {
			add(4, func() kop { return kopResend{pay: pays[rng.IntN(len(pays))]} })
		}
		if len(poisoned) > 0 {
			add(4, func() kop {
				o := kopRedrive{pay: poisoned[rng.IntN(len(poisoned))], pick: rng.IntN(3)}
				if ops.IntN(2) > 0 {
					return o
				}
				op := kopOperatorRedrive{fix: ops.IntN(3) > 0, release: ops.IntN(4) > 0, choice: ops.IntN(planChoices), pick: ops.IntN(8)}
				if op.choice == planNewLetters {
					late++ // numbered apart: the other payments keep their IDs
					op.late = newPay{id: fmt.Sprintf("L%03d", late), amount: 1 + ops.IntN(100), poisoned: true}
					pays = append(pays, op.late.id)
					poisoned = append(poisoned, op.late.id)
				}
				return op
			})
		}
		if cfg.redis {
			add(2, func() kop { return kopRedisFlush{} })
		}
		total := 0
		for _, c := range cs {
			total += c.w
		}
		x := rng.IntN(total)
		for _, c := range cs {
			if x < c.w {
				seq = append(seq, c.f())
				break
			}
			x -= c.w
		}
	}
	return seq
}

// kafkaSeedConfig is the first configuration of a seed's Kafka run.
func kafkaSeedConfig(seed uint64) config {
	c := drawConfig(rand.New(rand.NewPCG(seed, seed^0xc0f1637)))
	c.step = drawStep(rand.New(rand.NewPCG(seed, seed^0x57e939)))
	c.entity = drawEntity(rand.New(rand.NewPCG(seed, seed^0xe7717)))
	if c.entity.on {
		c.redis = false // redisfront keeps no entity watermarks: New refuses Entity over it
	}
	drawParking(rand.New(rand.NewPCG(seed, seed^0x9a4c40)), &c)
	return c
}

// kafkaFixedSeeds run in `go test`. On the code issue 37 was filed
// against, 1, 7 and 26 found both its holes in every run so far, 4 hole 1
// (the windows are the real adapter's, not simulated: a seed finds a hole
// by timing too); 6, 14, 16 and 25 draw offsets alone, KeyOrdered and a
// changed configuration, the Redis front, three delays. The step
// dimension (step_test.go): 4 draws no read-back and a provider that keeps
// no keys, 3 no read-back and a long key TTL (a repeat under a fresh
// provider key executes twice there), 12 no read-back and a short one, 6,
// 14 and 26 a read-back and a long one, 7 and 25 a read-back and no keys.
// The entity dimension (entity_test.go): 12 draws StaleDeadLetter with
// offsets alone, 14 StaleSkip over key lanes and KeyOrdered, 25 StaleSkip
// with offsets and a business key, 26 StaleDeadLetter with NonBlocking
// copies and a tenant from the topic; 12, 25 and 26 find entity-order
// with the entity step taken out of the attempt. The parking dimension
// (parking_test.go): 14 and 26 park in the store, kill processes and
// rebalance while keys are parked, and check key-order on 5 and 2 orders;
// 14 and 16 find key-order with the keys held in memory
// (IDEM_SEAMS_PARKING=memory; 16 draws them there, under the Redis
// front, and is exempt); 24 draws MaxParkedDepth 2 and MaxParkedWait the
// sum of its delays (about 20 parked_too_long letters) and finds
// parked-too-long with a key expired one message early, or never
// unparked after its letter; 65 draws MaxParkedWait the sum of its
// delays (about 19 letters) and, with the keys in memory, finds key-order
// on all three of its orders.
var kafkaFixedSeeds = []uint64{1, 3, 4, 6, 7, 12, 14, 16, 24, 25, 26, 65}
