package consumer

import (
	"math"
	"sync/atomic"
	"time"
)

// Stats are a consumer's counters.
type Stats struct {
	Delivered    int64 // messages taken from the source, redeliveries included
	Applied      int64 // messages whose handler effects committed
	Duplicates   int64 // messages skipped: their key had committed before
	DeadLettered int64 // messages written to the dead-letter sink
	RetriedLater int64 // messages written to the retry sink (NonBlocking)
	Retries      int64 // transactions retried after a transient failure
	Commits      int64 // transactions committed
	Released     int64 // messages given back unacknowledged (stop, stopped lane)
	KeyFallbacks int64 // messages keyed by their message ID for want of a key (FallBackToMessageID)
	Stale        int64 // stale events skipped (Config.Entity, StaleSkip); dead-lettered ones count in DeadLettered
	// DuplicateAge is how old the duplicates were when they arrived: the
	// retention a scope needs is above its Quantile(0.999).
	DuplicateAge AgeHistogram
}

type counters struct {
	delivered, applied, duplicates, deadLettered, retriedLater, retries, commits, released, keyFallbacks, stale atomic.Int64
	dupAges                                                                                                     ageCounters
}

func (c *counters) snapshot() Stats {
	return Stats{
		Delivered: c.delivered.Load(), Applied: c.applied.Load(), Duplicates: c.duplicates.Load(),
		DeadLettered: c.deadLettered.Load(), RetriedLater: c.retriedLater.Load(), Retries: c.retries.Load(), Commits: c.commits.Load(),
		Released: c.released.Load(), KeyFallbacks: c.keyFallbacks.Load(), Stale: c.stale.Load(), DuplicateAge: c.dupAges.snapshot(),
	}
}

// ageBounds are the upper bounds of AgeHistogram's buckets.
var ageBounds = [...]time.Duration{
	time.Second, 10 * time.Second, time.Minute, 10 * time.Minute, time.Hour,
	6 * time.Hour, 24 * time.Hour, 7 * 24 * time.Hour, 30 * 24 * time.Hour, 90 * 24 * time.Hour,
}

// AgeHistogram counts duplicates by age: Counts[i] those no older than
// Bounds[i] (and older than the bound before), the last one those older
// than every bound (1s, 10s, 1m, 10m, 1h, 6h, 1d, 7d, 30d, 90d).
type AgeHistogram struct {
	Bounds [len(ageBounds)]time.Duration
	Counts [len(ageBounds) + 1]int64
	Max    time.Duration // the oldest duplicate seen
}

// Quantile returns the bucket bound under which at least q (0..1) of the
// duplicates arrived — the retention that would have caught them — or Max
// for the last bucket; 0 when there were none. Compare Quantile(0.999) with
// the store's retention.
func (h AgeHistogram) Quantile(q float64) time.Duration {
	var n int64
	for _, c := range h.Counts {
		n += c
	}
	if n == 0 {
		return 0
	}
	want := int64(math.Ceil(q * float64(n))) // at least q of them
	if want < 1 {
		want = 1
	}
	var seen int64
	for i, c := range h.Counts {
		seen += c
		if seen >= want {
			if i < len(h.Bounds) {
				return h.Bounds[i]
			}
			break
		}
	}
	return h.Max
}

type ageCounters struct {
	counts [len(ageBounds) + 1]atomic.Int64
	max    atomic.Int64
}

func (a *ageCounters) add(age time.Duration) {
	i := 0
	for i < len(ageBounds) && age > ageBounds[i] {
		i++
	}
	a.counts[i].Add(1)
	for {
		m := a.max.Load()
		if int64(age) <= m || a.max.CompareAndSwap(m, int64(age)) {
			return
		}
	}
}

func (a *ageCounters) snapshot() AgeHistogram {
	h := AgeHistogram{Bounds: ageBounds}
	for i := range a.counts {
		h.Counts[i] = a.counts[i].Load()
	}
	h.Max = time.Duration(a.max.Load())
	return h
}
