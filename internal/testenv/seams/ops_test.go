package seams_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"

	"github.com/idemkit/idem/consumer"
)

// An op is one step of a consumer run. Its choices are made when the
// sequence is generated (gen_test.go), from the seed alone, so that a seed
// replays the same sequence; what it finds at run time (which letters
// exist, which keys are done) decides the rest.
type op interface {
	String() string
	apply(ctx context.Context, r *runner)
}

// opProduce appends new payments to their partitions.
type opProduce struct{ pays []newPay }

type newPay struct {
	id       string
	amount   int
	poisoned bool // the handler fails permanently for it
	flaky    int  // the handler fails transiently this many times first
}

func (o opProduce) String() string {
	var s []string
	for _, p := range o.pays {
		x := p.id
		if p.poisoned {
			x += "(poisoned)"
		}
		if p.flaky > 0 {
			x += fmt.Sprintf("(flaky %d)", p.flaky)
		}
		s = append(s, x)
	}
	return "produce " + strings.Join(s, " ")
}

func (o opProduce) apply(_ context.Context, r *runner) {
	for _, np := range o.pays {
		r.produce(np)
	}
}

// opResend is the producer (or the payment channel) sending a payment
// again: the same payload, or with conflict another amount (a fingerprint
// mismatch under a business key).
type opResend struct {
	pay      string
	conflict bool
}

func (o opResend) String() string {
	if o.conflict {
		return "resend " + o.pay + " with another amount"
	}
	return "resend " + o.pay
}

func (o opResend) apply(_ context.Context, r *runner) { r.resend(o.pay, o.conflict) }

// opDeliver has every owner deliver up to max records of each of its
// partitions, partitions interleaved at random, each in offset order.
type opDeliver struct {
	max  int
	seed uint64
}

func (o opDeliver) String() string { return fmt.Sprintf("deliver up to %d a partition", o.max) }

func (o opDeliver) apply(_ context.Context, r *runner) { r.deliver(-1, o.max, o.seed) }

// opHeld delivers n records of a partition and holds the transaction of
// the last one open (its handler waits) while another op runs: a crash
// before commit, a rebalance, a release, Redis going away.
type opHeld struct {
	part   int32
	n      int
	during op
}

func (o opHeld) String() string {
	return fmt.Sprintf("deliver %d of partition %d, the last one's transaction held open during [%v]", o.n, o.part, o.during)
}

func (o opHeld) apply(ctx context.Context, r *runner) { r.held(ctx, o.part, o.n, o.during) }

// opCrashHeld crashes the process whose transaction is held: a crash
// before commit.
type opCrashHeld struct{}

func (opCrashHeld) String() string                     { return "crash before commit" }
func (opCrashHeld) apply(_ context.Context, r *runner) { r.crashHeld() }

// opCrashAfterCommit: a process delivers, commits its transactions, and
// dies before the broker hears of them; restarted, it gets the messages
// again.
type opCrashAfterCommit struct {
	slot, max int
	seed      uint64
}

func (o opCrashAfterCommit) String() string {
	return fmt.Sprintf("crash after commit: consumer %s delivers up to %d a partition, its acks lost, restarted", slotName(o.slot), o.max)
}

func (o opCrashAfterCommit) apply(_ context.Context, r *runner) {
	r.crashAfterCommit(o.slot, o.max, o.seed)
}

// opRestart kills a consumer process and starts a new one.
type opRestart struct{ slot int }

func (o opRestart) String() string { return "restart consumer " + slotName(o.slot) }
func (o opRestart) apply(_ context.Context, r *runner) {
	r.restart(o.slot)
	r.mo.count("restarts")
}

// opRebalance moves a partition to the other consumer. With zombie > 0 the
// old owner fetched that many records before it lost the partition and
// delivers them after, beside the new owner's deliveries.
type opRebalance struct {
	part   int32
	zombie int
}

func (o opRebalance) String() string {
	if o.zombie > 0 {
		return fmt.Sprintf("rebalance partition %d, the old owner a zombie with %d fetched records", o.part, o.zombie)
	}
	return fmt.Sprintf("rebalance partition %d", o.part)
}

func (o opRebalance) apply(_ context.Context, r *runner) { r.rebalance(o.part, o.zombie) }

// opRewind seeks a partition's owner back: settled messages come again.
type opRewind struct {
	part int32
	k    int64
}

func (o opRewind) String() string                     { return fmt.Sprintf("rewind partition %d by %d", o.part, o.k) }
func (o opRewind) apply(_ context.Context, r *runner) { r.rewind(o.part, o.k) }

// opRedrive fixes a payment's cause and redrives one of its dead letters,
// as `idem redrive --release` does; pick chooses which letter (modulo how
// many there are), so that a letter is redriven again — a second group, a
// redrive that crashed before its offset commit, a letter written twice.
type opRedrive struct {
	pay  string
	pick int
}

func (o opRedrive) String() string {
	return fmt.Sprintf("redrive a letter of %s (pick %d)", o.pay, o.pick)
}
func (o opRedrive) apply(ctx context.Context, r *runner) { r.redrive(ctx, o.pay, o.pick) }

// opReleaseFailed fixes a payment's cause and releases its failed key
// (`idem release`): a redelivery runs the handler again.
type opReleaseFailed struct{ pay string }

func (o opReleaseFailed) String() string                       { return "release the failed key of " + o.pay }
func (o opReleaseFailed) apply(ctx context.Context, r *runner) { r.releaseFailed(ctx, o.pay) }

// opReleaseDone has an operator revert a payment's effect and release its
// done key (through the Redis front's Release when there is one): a
// delivery of it afterwards must apply it again.
type opReleaseDone struct{ pay string }

func (o opReleaseDone) String() string                       { return "revert and release the done key of " + o.pay }
func (o opReleaseDone) apply(ctx context.Context, r *runner) { r.releaseDone(ctx, o.pay) }

// opRedis does something to the Redis front's server.
type opRedis struct{ what string } // snapshot, restore, flush, restart, restart-persist

func (o opRedis) String() string                       { return "redis " + o.what }
func (o opRedis) apply(ctx context.Context, r *runner) { r.redisOp(ctx, o.what) }

func slotName(i int) string { return string(rune('A' + i)) }

// interleave merges per-partition runs at random, keeping each run's order.
func interleave(rng *rand.Rand, runs [][]*consumer.Message) []*consumer.Message {
	runs = slices.Clone(runs)
	var out []*consumer.Message
	for {
		runs = slices.DeleteFunc(runs, func(r []*consumer.Message) bool { return len(r) == 0 })
		if len(runs) == 0 {
			return out
		}
		i := rng.IntN(len(runs))
		out = append(out, runs[i][0])
		runs[i] = runs[i][1:]
	}
}
