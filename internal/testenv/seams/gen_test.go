package seams_test

import (
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"slices"
)

// mode is one way of keying a consumer; every mode runs the same kinds of
// operations, those that make sense for it.
type mode struct {
	name string
	// key: "msgid" (consumer.ByMessageID), "business" (the JSON field
	// "pay"), "" (none: Config.Offsets alone)
	key      string
	offsets  bool // Config.Offsets
	keyLanes int  // Config.KeyLanes
	redis    bool // the Redis front over pgstore
}

// business reports whether the mode keys by the payment: a re-sent
// payment is a duplicate, not a new one.
func (m mode) business() bool { return m.key == "business" }

// keyRows reports whether the mode records failed keys (Store.RecordFailure
// needs a Key).
func (m mode) keyRows() bool { return m.key != "" }

// releasesDone reports whether an operator's release of a done key runs
// its payment again on its next delivery: with a business key and no
// offsets (offsets skip a redelivery below the next offset whatever the
// key table says).
func (m mode) releasesDone() bool { return m.business() && !m.offsets }

var modes = []mode{
	{name: "msgid", key: "msgid"},
	{name: "business", key: "business"},
	{name: "offsets", offsets: true},
	{name: "offsets-business", key: "business", offsets: true},
	{name: "keylanes", key: "business", keyLanes: 4},
	{name: "redis", key: "business", redis: true},
}

const partitions = 3

// partitionOf is where the producer sends a payment: by its key, as
// Kafka's default partitioner does, so that a payment's re-sends and
// redrives stay in its partition's order.
func partitionOf(pay string) int32 {
	h := fnv.New32a()
	h.Write([]byte(pay))
	return int32(h.Sum32() % partitions)
}

// gen makes a sequence of ops from a seed. It keeps what it needs to pick
// sensible targets (the payments it produced, the poisoned ones), never
// what a run found.
type gen struct {
	rng      *rand.Rand
	m        mode
	pays     []string
	poisoned []string
	redriven []string
	released []string
	// delivered counts the delivering ops since each payment's last
	// record was produced: after two, it is likely applied and settled.
	delivered map[string]int
	// Redis: the payments released after the last snapshot (a restore
	// brings their entries back), and those a restore brought back.
	releasedSinceSnap, restored []string
}

func generate(seed uint64, m mode, steps int) []op {
	g := &gen{rng: rand.New(rand.NewPCG(seed, seed^0x5eed5eed)), m: m, delivered: map[string]int{}}
	ops := []op{g.produce(4)}
	for len(ops) < steps {
		o := g.next(false)
		switch o.(type) {
		case opDeliver, opHeld, opCrashAfterCommit:
			for _, p := range g.pays {
				g.delivered[p]++
			}
		}
		ops = append(ops, o)
	}
	return ops
}

// applied returns the payments likely applied: not poisoned, and
// delivered twice since their last record was produced.
func (g *gen) applied() []string {
	var out []string
	for _, p := range g.pays {
		if g.delivered[p] >= 2 && !slices.Contains(g.poisoned, p) {
			out = append(out, p)
		}
	}
	return out
}

type choice struct {
	weight int
	make   func() op
}

// next draws an op; during is set for the op run while a transaction is
// held open.
func (g *gen) next(during bool) op {
	var cs []choice
	add := func(w int, f func() op) {
		if w > 0 {
			cs = append(cs, choice{w, f})
		}
	}
	if during {
		add(6, func() op { return opCrashHeld{} })
		add(4, func() op { return opRebalance{part: g.part()} })
		if g.m.releasesDone() && len(g.applied()) > 0 {
			add(4, g.releaseDone)
		}
		if g.m.redis {
			add(3, func() op { return opRedis{"flush"} })
			add(2, func() op { return opRedis{"restart"} })
			add(2, func() op { return opRedis{"restore"} })
		}
	} else {
		add(14, func() op { return g.produce(1 + g.rng.IntN(3)) })
		add(22, func() op { return opDeliver{max: 1 + g.rng.IntN(4), seed: g.rng.Uint64()} })
		add(10, func() op { return opHeld{part: g.part(), n: 1 + g.rng.IntN(3), during: g.next(true)} })
		add(4, func() op {
			return opCrashAfterCommit{slot: g.rng.IntN(2), max: 1 + g.rng.IntN(3), seed: g.rng.Uint64()}
		})
		add(3, func() op { return opRestart{slot: g.rng.IntN(2)} })
		add(6, func() op { return opRebalance{part: g.part(), zombie: g.rng.IntN(3)} })
		add(5, func() op { return opRewind{part: g.part(), k: 1 + g.rng.Int64N(4)} })
		if len(g.poisoned) > 0 {
			add(12, g.redrive)
			if g.m.keyRows() {
				add(3, func() op { return opReleaseFailed{pay: g.pick(g.poisoned)} })
			}
		}
		if g.m.business() && len(g.pays) > 0 {
			add(8, g.resend)
		}
		if g.m.releasesDone() && len(g.applied()) > 0 {
			add(8, g.releaseDone)
		}
		if g.m.redis {
			// Redis's faults matter around releases: a snapshot before
			// one, a restore after it, a delivery of the released key.
			add(10-8*min(len(g.releasedSinceSnap), 1), func() op {
				g.releasedSinceSnap = nil
				return opRedis{"snapshot"}
			})
			add(4+36*min(len(g.releasedSinceSnap), 1), func() op {
				g.restored, g.releasedSinceSnap = g.releasedSinceSnap, nil
				return opRedis{"restore"}
			})
			add(3, func() op { return opRedis{"flush"} })
			add(2, func() op { return opRedis{"restart"} })
			add(2, func() op { return opRedis{"restart-persist"} })
			if len(g.restored) > 0 {
				add(20, func() op { return g.resendOf(g.pick(g.restored), false) })
			}
		}
	}
	total := 0
	for _, c := range cs {
		total += c.weight
	}
	n := g.rng.IntN(total)
	for _, c := range cs {
		if n < c.weight {
			return c.make()
		}
		n -= c.weight
	}
	panic("unreachable")
}

func (g *gen) part() int32 { return int32(g.rng.IntN(partitions)) }

func (g *gen) pick(from []string) string { return from[g.rng.IntN(len(from))] }

func (g *gen) produce(n int) op {
	var o opProduce
	for range n {
		p := newPay{id: fmt.Sprintf("P%03d", len(g.pays)+1), amount: 1 + g.rng.IntN(100)}
		switch x := g.rng.IntN(10); {
		case x < 2:
			p.poisoned = true
			g.poisoned = append(g.poisoned, p.id)
		case x < 3:
			p.flaky = 1 + g.rng.IntN(2)
		}
		g.pays = append(g.pays, p.id)
		o.pays = append(o.pays, p)
	}
	return o
}

// redrive picks a poisoned payment, half the time one redriven before: the
// same letter again, or another letter of it.
func (g *gen) redrive() op {
	pay := g.pick(g.poisoned)
	if len(g.redriven) > 0 && g.rng.IntN(2) == 0 {
		pay = g.pick(g.redriven)
	}
	g.redriven = append(g.redriven, pay)
	return opRedrive{pay: pay, pick: g.rng.IntN(4)}
}

// resend re-sends a payment, half the time one whose done key was
// released.
func (g *gen) resend() op {
	pay := g.pick(g.pays)
	if len(g.released) > 0 && g.rng.IntN(2) == 0 {
		pay = g.pick(g.released)
	}
	return g.resendOf(pay, g.rng.IntN(5) == 0)
}

func (g *gen) resendOf(pay string, conflict bool) op {
	g.delivered[pay] = 0
	return opResend{pay: pay, conflict: conflict}
}

func (g *gen) releaseDone() op {
	pay := g.pick(g.applied())
	g.released = append(g.released, pay)
	g.releasedSinceSnap = append(g.releasedSinceSnap, pay)
	return opReleaseDone{pay: pay}
}
