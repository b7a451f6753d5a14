package seams_test

import (
	"context"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/dedup"
)

// The parking dimension (issue 40): with NonBlocking.KeyOrdered, the
// payments share a few record keys (orders), each order's payments on one
// partition, so that a payment in retry parks its order and the order's
// later payments follow it. The store parks the keys durably (pgstore, a
// dedup.Parking), or its Parking is hidden and the consumer holds the
// keys in its memory; with durable parking, small MaxParkedDepth and
// MaxParkedWait are drawn sometimes, so that keys outlive them.
//
// The checks:
//   - key-order: an order's payments applied through normal delivery are
//     applied (the business rows' commit order) in the order they were
//     produced. Exempt: a payment that was ever dead-lettered (poisoned,
//     exhausted, parked_too_long, stale) — a redriven letter is applied
//     when it is redriven, out of order by design — and a payment never
//     applied. The payments behind a dead-lettered head are not exempt:
//     they are released in order. The check does not apply when a
//     configuration without KeyOrdered ran (a deploy to Blocking reads
//     the copies unordered), nor with in-memory holds once a process was
//     killed or the group rebalanced: that loss is documented
//     (docs/retries.md, "What it does not keep"). IDEM_SEAMS_PARKING=memory
//     hides the store's Parking on every seed of the dimension and keeps
//     the check: it shows the loss.
//   - parked-too-long: a letter of cause parked_too_long is of a key the
//     store lists as parked past the drawn limits (as deep as
//     MaxParkedDepth, or its head older than MaxParkedWait), or of a key
//     such a letter found so in the same parking (its ParkedAt); and at
//     the end of a run whose drain settled, no key is parked (every
//     expired key was released).
type parkConfig struct {
	on bool // KeyOrdered with record keys the payments share
	// memory: the store's dedup.Parking hidden (or the Redis front, which
	// parks no keys): the consumer holds the keys in its memory.
	memory bool
	// forced: memory by IDEM_SEAMS_PARKING=memory; the check applies.
	forced bool
	depth  int  // MaxParkedDepth, 0 for the default
	tight  bool // MaxParkedWait the sum of the delays (the least New accepts)
}

const (
	checkKeyOrder      = "key-order"
	checkParkedTooLong = "parked-too-long"
)

// orders is how many record keys the payments share.
const orders = 3

// drawParking draws the dimension into c; a rng of its own keeps the other
// dimensions of a seed as they were, but for KeyOrdered, which it turns on
// for a further third of the NonBlocking seeds (drawConfig draws it for a
// third: too few to order anything).
func drawParking(rng *rand.Rand, c *config) {
	p := parkConfig{memory: rng.IntN(3) == 0}
	if rng.IntN(3) == 0 {
		p.depth = 2 + rng.IntN(2)
	}
	p.tight = rng.IntN(3) == 0
	if c.nonBlocking && rng.IntN(3) == 0 {
		c.keyOrdered = true
	}
	c.park = p.settle(*c)
}

// settle is p for c: off without KeyOrdered.
func (p parkConfig) settle(c config) parkConfig {
	if !c.keyOrdered || c.key == "record" {
		// ByRecordKey: payments sharing a record key would be one payment.
		return parkConfig{}
	}
	p.on = true
	if os.Getenv("IDEM_SEAMS_PARKING") == "memory" {
		p.memory, p.forced = true, true
	}
	if c.redis {
		p.memory = true // redisfront parks no keys
	}
	if p.memory {
		p.depth, p.tight = 0, false // the limits are the store's
	}
	return p
}

func (p parkConfig) String() string {
	if !p.on {
		return ""
	}
	s := " parking=store"
	if p.memory {
		s = " parking=memory"
	}
	if p.depth > 0 {
		s += fmt.Sprintf(" maxdepth=%d", p.depth)
	}
	if p.tight {
		s += " maxwait=sum"
	}
	return s
}

// orderOf is the record key (order) of pay: one of a few, from the seed.
func orderOf(seed uint64, pay string) string {
	h := fnv.New64a()
	h.Write([]byte(strconv.FormatUint(seed, 10) + "/order/" + pay))
	return fmt.Sprintf("O%d", h.Sum64()%orders)
}

// limits are the NonBlocking fields of the dimension for c's delays.
func (p parkConfig) limits(delays []time.Duration) (depth int, wait time.Duration) {
	if p.tight {
		for _, d := range delays {
			wait += d
		}
	}
	return p.depth, wait
}

// heldInMemory is the store with its dedup.Parking hidden: the consumer
// holds parked keys in its memory.
type heldInMemory struct {
	dedup.Store[pgx.Tx]
	dedup.Watermarks[pgx.Tx]
	dedup.Journal
}

// parkedKeyOf is the key a letter's message is parked under.
func (r *kafkaRunner) parkedKeyOf(l consumer.Letter) dedup.ParkKey {
	return dedup.ParkKey{Scope: l.Key.Scope, Topic: r.topic, Key: string(l.Message.Key)}
}

// checkParkedLetter checks a letter of cause parked_too_long: its key is
// parked past the limits, or was found so in this parking.
func (r *kafkaRunner) checkParkedLetter(ctx context.Context, l consumer.Letter) {
	r.count("parked_too_long letters")
	pk := r.parkedKeyOf(l)
	var pay string
	if p := r.payOf(l.Message.Value); p != nil {
		pay = p.id
	}
	if !r.cfg.park.on || r.cfg.park.memory {
		r.rep.violation(checkParkedTooLong, pay, "payment %s dead-lettered parked_too_long without limits to outlive (%v)", pay, r.cfg.park)
		return
	}
	// The journal's pool, and not ctx: the sink runs in the consumer's
	// lane, whose ctx a kill ends, and whose transactions may hold the
	// store's pool.
	keys, err := r.journal.Parked(context.Background(), dedup.ParkFilter{Scope: pk.Scope, Topic: pk.Topic, Key: pk.Key})
	if err != nil {
		r.t.Errorf("seams: seed=%d: list the parked keys: %v", r.rep.seed, err)
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(keys) != 1 {
		if _, ok := r.expired[pk]; ok {
			return // two copies of one message met the expired key; one released it
		}
		if p := r.pays[pay]; p != nil && p.copies > 0 && !r.lastKill.IsZero() {
			// Its original, redelivered after a kill, and its copy: the
			// one whose letter's check ran first may have died with it.
			r.counts["parked_too_long letters of a key released by a copy"]++
			return
		}
		r.rep.violation(checkParkedTooLong, pay, "payment %s dead-lettered parked_too_long, and its key %q (scope %s) is not parked", pay, pk.Key, pk.Scope)
		return
	}
	k := keys[0]
	depth, wait := r.cfg.nonBlockingLimits()
	switch {
	case r.expired[pk] == k.ParkedAt:
		return // expired before, in this parking
	case k.Expired && r.lastKill.After(k.ParkedAt):
		// A process killed in this parking may have expired the key and
		// died before its letter's check.
		r.expired[pk] = k.ParkedAt
		return
	}
	if held := time.Since(k.HeadSince); k.Depth < depth && held < wait {
		r.rep.violation(checkParkedTooLong, pay, "payment %s dead-lettered parked_too_long, its key %q within the limits: %d deep (MaxParkedDepth %d), its head %s held it %v (MaxParkedWait %v)",
			pay, pk.Key, k.Depth, depth, k.Head, held.Round(time.Millisecond), wait)
		return
	}
	r.expired[pk] = k.ParkedAt
}

// nonBlockingLimits are MaxParkedDepth and MaxParkedWait as the consumer
// applies them (the defaults for zero).
func (c config) nonBlockingLimits() (int, time.Duration) {
	depth, wait := c.park.limits(c.delays)
	if depth == 0 {
		depth = 1000
	}
	if wait == 0 {
		var sum time.Duration
		for _, d := range c.delays {
			sum += d
		}
		wait = 2*sum + time.Minute
	}
	return depth, wait
}

// payOf is the payment value carries; r.mu is not held.
func (r *kafkaRunner) payOf(value []byte) *kpay {
	var p *kpay
	r.note(value, func(q *kpay) { p = q })
	return p
}

// orderChecked says whether key-order applies to the run so far, and if
// not, why.
func (r *kafkaRunner) orderChecked() (bool, string) {
	switch {
	case !r.cfg.park.on:
		return false, "no shared record keys"
	case r.unordered:
		return false, "a configuration without KeyOrdered ran"
	case r.cfg.park.memory && !r.cfg.park.forced && r.holdsLost:
		return false, "in-memory holds, and a process was killed or the group rebalanced"
	}
	return true, ""
}

// checkKeyOrder checks that each order's payments, those applied through
// normal delivery, were applied in the order they were produced.
func (r *kafkaRunner) checkKeyOrder(ctx context.Context) {
	if ok, why := r.orderChecked(); !ok {
		if r.cfg.park.on {
			r.count("key-order not checked (" + why + ")")
		}
		return
	}
	res, err := r.pool.Query(ctx, `SELECT pay FROM `+r.table+` ORDER BY id`)
	if err != nil {
		r.t.Fatal(err)
	}
	pos := map[string]int{}
	for i := 0; res.Next(); i++ {
		var pay string
		if err := res.Scan(&pay); err != nil {
			r.t.Fatal(err)
		}
		if _, ok := pos[pay]; !ok {
			pos[pay] = i
		}
	}
	if err := res.Err(); err != nil {
		r.t.Fatal(err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	produced := map[string][]string{} // order → its payments checked, in produced order
	for _, id := range r.order {
		p := r.pays[id]
		if _, ok := pos[id]; !ok || p.letters > 0 || p.redrives > 0 {
			continue
		}
		produced[p.orderGroup(r.cfg)] = append(produced[p.orderGroup(r.cfg)], id)
	}
	for o, ids := range produced {
		for i := 1; i < len(ids); i++ {
			if pos[ids[i]] < pos[ids[i-1]] {
				applied := append([]string(nil), ids...)
				sortBy(applied, pos)
				r.rep.violation(checkKeyOrder, o, "order %s: payment %s applied before %s, produced after it (produced: %s; applied: %s)",
					o, ids[i], ids[i-1], strings.Join(ids, " "), strings.Join(applied, " "))
				break
			}
		}
		if len(ids) > 1 {
			r.counts["orders checked"]++
		}
	}
}

func sortBy(ids []string, pos map[string]int) {
	for i := 1; i < len(ids); i++ {
		for j := i; j > 0 && pos[ids[j]] < pos[ids[j-1]]; j-- {
			ids[j], ids[j-1] = ids[j-1], ids[j]
		}
	}
}

// orderGroup is the parked key p's order is under: the record key, in
// the tenant's key scope when the tenant is the payment's header.
func (p *kpay) orderGroup(c config) string {
	if c.tenant == "header" {
		return p.tenant + "/" + p.rkey
	}
	return p.rkey
}

// checkReleased checks, at the end of a run whose drain settled with
// durable parking, that no key is parked.
func (r *kafkaRunner) checkReleased(ctx context.Context) {
	if !r.cfg.park.on || r.cfg.park.memory || r.unordered {
		return
	}
	keys, err := r.pg.Parked(ctx, dedup.ParkFilter{Limit: 100})
	if err != nil {
		r.t.Fatal(err)
	}
	for _, k := range keys {
		what := "parked"
		r.mu.Lock()
		if r.expired[k.ParkKey] == k.ParkedAt {
			what = "parked, expired by a parked_too_long letter, and never released"
		}
		r.mu.Unlock()
		r.rep.violation(checkParkedTooLong, k.Key, "after the drain, key %q (scope %s) is still %s: head %s, %d deep, expired %v",
			k.Key, k.Scope, what, k.Head, k.Depth, k.Expired)
	}
}

// parkedNow counts a kill or a rebalance while keys are parked in the
// store: what makes key-order mean something across them.
func (r *kafkaRunner) parkedNow(ctx context.Context, what string) {
	if !r.cfg.park.on {
		return
	}
	r.mu.Lock()
	r.lastKill = time.Now()
	r.mu.Unlock()
	if r.cfg.park.memory {
		r.holdsLost = true
		return
	}
	st, err := r.pg.ParkStats(ctx)
	if err == nil && st.Keys > 0 {
		r.count(what + " while keys were parked")
	}
}
