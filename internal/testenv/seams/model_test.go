package seams_test

import (
	"fmt"
	"sort"
	"strings"
)

// The model is what should be true of a consumer's run, whatever the
// faults: it knows the payments, which of them fail for good (and when the
// cause was fixed), which keys an operator released after they were done
// (and reverted their effect), and which dead letters were redriven. The
// broker knows every record and which deliveries were acknowledged; the
// dead-letter topic which records were dead-lettered; the database how
// often each payment was applied. The checks compare them.

// payment is the model of one payment.
type payment struct {
	id    string
	part  int32  // every record of the payment goes to one partition (the producer keys by it)
	value []byte // the payload of its first record
	first recID  // its first record
	// poisoned: the handler fails permanently for it (a bug, a bad
	// account) until the cause is fixed before a redrive or a release.
	poisoned bool
	// resetSeq is when (the run's sequence) an operator last released its
	// done key and reverted its effect; 0: never. A delivery after that
	// must apply it again.
	resetSeq int64
	copies   int // redrive copies sent
}

type model struct {
	pays  map[string]*payment
	order []string // in the order they were produced
	// what happened, for the run's summary
	counts map[string]int
}

func newModel() *model { return &model{pays: map[string]*payment{}, counts: map[string]int{}} }

func (mo *model) add(p *payment) {
	mo.pays[p.id] = p
	mo.order = append(mo.order, p.id)
}

func (mo *model) count(what string) { mo.counts[what]++ }

func (mo *model) summary() string {
	keys := make([]string, 0, len(mo.counts))
	for k := range mo.counts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	fmt.Fprintf(&b, "%d payments", len(mo.pays))
	for _, k := range keys {
		fmt.Fprintf(&b, ", %s %d", k, mo.counts[k])
	}
	return b.String()
}

// The named checks. Each hole of issue 25 that this test must find shows
// under its own name (holeChecks).
const (
	// checkAppliedOnce: no payment applied twice.
	checkAppliedOnce = "applied-once"
	// checkRedriveOnce: a payment whose dead letter was redriven (once or
	// more) is applied exactly once — hole 1 (redrive × message-ID keys
	// and offsets mode) shows here.
	checkRedriveOnce = "redrive-once"
	// checkAckedApplied: a message the consumer acknowledged that was not
	// dead-lettered has its payment applied — no loss.
	checkAckedApplied = "acked-applied"
	// checkReleasedKey: a payment whose done key was released is applied
	// again by a delivery after the release — hole 7 (Redis front ×
	// release) shows here.
	checkReleasedKey = "released-key"
	// checkDrained: once the stream drains, every partition's committed
	// offset is at its end.
	checkDrained = "drained"
	// checkConsumer: the consumer ran without stopping on an error.
	checkConsumer = "consumer"
	// The lease checks (lease_test.go): no two runs of one request key
	// overlap with one fencing token — hole 2 (purge × an extended lease)
	// shows here —, none starts while another's extended lease is live,
	// and of two overlapping runs at most one stores its response.
	checkLeaseToken  = "lease-token"
	checkLeaseLive   = "lease-live"
	checkLeaseStored = "lease-stored"
)

// The checks of the Kafka mode (kafka_test.go) beside applied-once,
// acked-applied and drained.
const (
	// checkRetryCopyOnce: a payment that went to retry (NonBlocking) is
	// applied once, original and copies together — hole 1 of issue 37
	// (NonBlocking × a tenant taken from the topic) shows here.
	checkRetryCopyOnce = "retry-copy-once"
	// checkRetryCopyApplied: a payment that went to retry and was not
	// dead-lettered is applied in the end — hole 2 of issue 37
	// (NonBlocking × StartFrom LastOffset) shows here.
	checkRetryCopyApplied = "retry-copy-applied"
	// checkRetryTopicRead: once the stream drains, every retry topic's
	// partition is committed to its end — a copy skipped while its
	// payment was applied from its original (hole 2 of issue 37 again)
	// shows here.
	checkRetryTopicRead = "retry-topic-read"
	// checkPlanExecuted: an operator's redrive plan (idem redrive --plan)
	// executed does what it showed: exactly its send letters reach the
	// topic, once each, and the redrive group's offsets end where it ends.
	checkPlanExecuted = "plan-executed"
	// checkPlanStale: a plan refused as stale sends and commits nothing,
	// and a plan whose partitions moved since it was made is refused.
	checkPlanStale = "plan-stale"
	// checkPlanDoneKey: a letter whose key is done is planned as a
	// duplicate (skip_duplicate), never a stop or a send.
	checkPlanDoneKey = "plan-done-key"
)

// The holes of issues 25 and 37 this test must find on code that has them.
const (
	hole1 = "hole 1 (redrive × message-ID keys and offsets)"
	hole2 = "hole 2 (purge × an extended lease)"
	hole7 = "hole 7 (Redis front × release)"

	hole37x1 = "issue 37 hole 1 (NonBlocking × Tenant from the topic: a copy applied beside its original)"
	hole37x2 = "issue 37 hole 2 (NonBlocking × StartFrom LastOffset: a copy skipped)"
)

// holeChecks maps the checks that find the holes to the holes. Hole 2
// shows first as a second run with the live holder's token; the same run
// also started under a live lease, and may store its response beside the
// holder's.
var holeChecks = map[string]string{
	checkRedriveOnce: hole1,
	checkLeaseToken:  hole2,
	checkLeaseLive:   hole2,
	checkLeaseStored: hole2,
	checkReleasedKey: hole7,

	checkRetryCopyOnce:    hole37x1,
	checkRetryCopyApplied: hole37x2,
	checkRetryTopicRead:   hole37x2,
}

// checkApplied compares the database's applied payments (rows: payment →
// business rows) with the model, the broker's records and the dead
// letters.
func (mo *model) checkApplied(rep *reporter, rows map[string]int, recs []record, dead map[recID]bool) {
	for id, n := range rows {
		if n <= 1 {
			continue
		}
		p := mo.pays[id]
		check := checkAppliedOnce
		if p != nil && p.copies > 0 {
			check = checkRedriveOnce
		}
		rep.violation(check, id, "payment %s applied %d times (%s)", id, n, mo.describe(id, recs, dead))
	}
	for _, r := range recs {
		if r.lastAck == 0 || dead[r.id] {
			continue
		}
		p := mo.pays[r.pay]
		if p == nil || r.lastAck <= p.resetSeq || rows[r.pay] > 0 {
			continue
		}
		check := checkAckedApplied
		switch {
		case p.resetSeq > 0:
			check = checkReleasedKey
		case r.copy || p.copies > 0:
			check = checkRedriveOnce
		}
		rep.violation(check, r.pay, "message %s of payment %s was acknowledged (not dead-lettered) but the payment is not applied (%s)",
			r.id, r.pay, mo.describe(r.pay, recs, dead))
	}
}

// describe says what the model and the broker know of a payment.
func (mo *model) describe(id string, recs []record, dead map[recID]bool) string {
	var parts []string
	if p := mo.pays[id]; p != nil {
		if p.poisoned {
			parts = append(parts, "poisoned")
		}
		if p.copies > 0 {
			parts = append(parts, fmt.Sprintf("%d redrive copies", p.copies))
		}
		if p.resetSeq > 0 {
			parts = append(parts, fmt.Sprintf("done key released at seq %d", p.resetSeq))
		}
	}
	for _, r := range recs {
		if r.pay != id {
			continue
		}
		s := r.id.String()
		switch {
		case r.copy:
			s += " copy"
		}
		if dead[r.id] {
			s += " dead-lettered"
		}
		if r.lastAck > 0 {
			s += fmt.Sprintf(" acked@%d", r.lastAck)
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, "; ")
}
