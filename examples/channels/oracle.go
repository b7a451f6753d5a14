package channels

import (
	"fmt"
	"sort"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/dedup"
)

// oracle works out what the consumer must make of a stream: idem's dedup
// (a key committed, with its fingerprint; a refused event leaves its key
// free, as consumer.Reject does), its entity order (an event at or below
// its order's watermark is stale: its key committed, nothing applied) and
// the business rules, written independently of Apply's SQL so that the
// expectations check it.
type oracle struct {
	claims   map[string]oracleClaim
	marks    map[string]dedup.Version // per order: the newest event applied
	orders   map[string]*oracleOrder
	order    []string
	tally    Tally
	balances map[string]int64
	sold     map[string]int64
}

type oracleClaim struct {
	failed bool
	fp     string
}

type oracleOrder struct {
	Order
	status, paidTxn string
	refunded        int64 // partial refunds
	transitions     []string
}

func newOracle(orders []Order) *oracle {
	o := &oracle{claims: map[string]oracleClaim{}, marks: map[string]dedup.Version{}, orders: map[string]*oracleOrder{},
		balances: map[string]int64{}, sold: map[string]int64{}, tally: Tally{DeadLetters: map[Reason]int{}}}
	for _, ord := range orders {
		o.orders[ord.ID] = &oracleOrder{Order: ord, status: "UNPAID", transitions: []string{}}
		o.order = append(o.order, ord.ID)
		o.balances[ord.Account] += 0
		o.sold[ord.SKU] += 0
	}
	return o
}

// deliver settles one delivery of event key with fingerprint fp, of entity
// ent.
func (o *oracle) deliver(key, fp string, forged bool, ev Event, ent consumer.Entity) (Outcome, Reason) {
	o.tally.Deliveries++
	out, reason := o.settle(key, fp, forged, ev, ent)
	switch out {
	case Applied:
		o.tally.Events++
		o.tally.Applied++
	case Recorded:
		o.tally.Events++
		o.tally.Recorded++
	case Stale:
		o.tally.Stale++
	case Duplicate:
		o.tally.Duplicates++
	case DeadLettered:
		o.tally.DeadLetters[reason]++
	}
	return out, reason
}

func (o *oracle) settle(key, fp string, forged bool, ev Event, ent consumer.Entity) (Outcome, Reason) {
	if forged {
		return DeadLettered, BadSignature // refused before its key is claimed
	}
	if c, ok := o.claims[key]; ok {
		switch {
		case c.fp != fp:
			return DeadLettered, FingerprintMismatch
		case c.failed:
			return DeadLettered, FailedBefore
		}
		return Duplicate, ""
	}
	if mark, ok := o.marks[ent.Name]; ok && ent.Version.Compare(mark) <= 0 {
		o.claims[key] = oracleClaim{fp: fp}
		return Stale, ""
	}
	out, reason := o.apply(ev)
	if out != DeadLettered { // refused with consumer.Reject: the key stays free, the watermark where it was
		o.claims[key] = oracleClaim{fp: fp}
		o.marks[ent.Name] = ent.Version
	}
	return out, reason
}

// apply is the business rule: UNPAID -> PAID -> FINISHED or REFUNDED,
// never backwards; finishing or refunding an unpaid order means it was paid.
func (o *oracle) apply(ev Event) (Outcome, Reason) {
	ord := o.orders[ev.Order]
	if ord == nil {
		panic("channels: the generator paid an order it did not create: " + ev.Order)
	}
	if ev.Kind == Info {
		return Recorded, ""
	}
	if ev.Currency != ord.Currency {
		return DeadLettered, WrongCurrency
	}
	if ev.Amount != ord.Amount {
		return DeadLettered, WrongAmount
	}
	if ord.paidTxn != "" && ord.paidTxn != ev.Trade {
		panic("channels: the generator paid order " + ord.ID + " twice")
	}
	if ev.Kind == PartialRefund {
		switch {
		case ord.status != "PAID":
			panic("channels: the generator refunded part of order " + ord.ID + " while " + ord.status)
		case ev.Refunded > ord.Amount:
			return DeadLettered, WrongAmount
		case ev.Refunded <= ord.refunded:
			return Recorded, ""
		}
		o.balances[ord.Account] -= ev.Refunded - ord.refunded
		ord.refunded = ev.Refunded
		ord.transitions = append(ord.transitions, "PAID>PAID")
		return Applied, ""
	}
	to := ""
	switch {
	case ev.Kind == Pay && ord.status == "UNPAID":
		to = "PAID"
	case ev.Kind == Finish && (ord.status == "UNPAID" || ord.status == "PAID"):
		to = "FINISHED"
	case ev.Kind == Refund && (ord.status == "UNPAID" || ord.status == "PAID"):
		to = "REFUNDED"
	case ev.Kind == Refund && ord.status == "FINISHED":
		panic("channels: the generator refunded a finished order " + ord.ID)
	}
	if to == "" {
		return Recorded, ""
	}
	switch {
	case ord.status == "UNPAID" && to != "REFUNDED":
		o.balances[ord.Account] += ord.Amount
		o.sold[ord.SKU]++
	case ord.status == "PAID" && to == "REFUNDED":
		o.balances[ord.Account] -= ord.Amount
		o.sold[ord.SKU]--
	}
	ord.transitions = append(ord.transitions, ord.status+">"+to)
	ord.status, ord.paidTxn = to, ev.Trade
	return Applied, ""
}

func (o *oracle) expected(channel string) Expected {
	e := Expected{Channel: channel, Fields: o.tally, Balances: o.balances, Sold: o.sold}
	ids := append([]string(nil), o.order...)
	sort.Strings(ids)
	for _, id := range ids {
		ord := o.orders[id]
		e.Orders = append(e.Orders, OrderState{ID: id, Status: ord.status, PaidTxn: ord.paidTxn, Refunded: ord.refunded, Transitions: ord.transitions})
	}
	return e
}

func (t Tally) String() string {
	return fmt.Sprintf("%d deliveries: %d events (%d applied, %d recorded), %d stale, %d duplicates, dead letters %v",
		t.Deliveries, t.Events, t.Applied, t.Recorded, t.Stale, t.Duplicates, t.DeadLetters)
}
