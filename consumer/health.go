package consumer

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/idemkit/idem/consumer/source"
	"github.com/idemkit/idem/dedup"
)

// Health is what a probe should look at: whether the consumer runs, whether
// its store answers, whether any lane stopped, and whether the messages it
// holds make progress.
type Health struct {
	Running bool // Run was called and has not returned
	// Fatal is why the consumer stopped itself (a broken deployment).
	Fatal error
	// Store is Store.Check's error: nil when the database answers and the
	// table is migrated.
	Store error
	// Misconfigured is a configuration the messages contradict: an error
	// wrapping ErrKeyMisconfigured when Config.Key failed on most of the
	// first messages of the run (a typo in a key path), which are
	// dead-lettered one by one. It fails neither Live nor Ready: a
	// restart does not fix it, a new configuration does.
	Misconfigured error
	// StoppedLanes are lanes stopped by StopLaneOnExhausted or a broken
	// deployment: nothing more of their partitions is processed until the
	// consumer restarts.
	StoppedLanes []string
	// InFlight is how many delivered messages are not settled or released
	// yet; LastProgress is when a batch was last acknowledged, or Run
	// started (zero: not started).
	InFlight     int64
	LastProgress time.Time
	// Lanes is the source's report of the lanes it is assigned, when it is
	// one that declares source.Description.Lanes (the Kafka and RocketMQ sources do); see
	// StalledLanes.
	Lanes []source.LaneStatus
	// Parked sums up the record keys parked (NonBlocking.KeyOrdered): how
	// many, and when the oldest was parked (zero when none is). With a
	// Store that is a dedup.Parking they are the store's, every member's
	// and every consumer's of its table alike; else this consumer's own.
	// Read at most every 5 seconds; nil without KeyOrdered, and when they
	// could not be read: ParkedErr says why (it fails neither Live nor
	// Ready).
	Parked    *dedup.ParkStats
	ParkedErr error
}

// StalledLanes lists the lanes of h.Lanes that made no progress for longer
// than stall before now — "lane: why" — in lane order.
func (h Health) StalledLanes(now time.Time, stall time.Duration) []string {
	var out []string
	for _, l := range h.Lanes {
		if why := l.Stalled(now, stall); why != "" {
			out = append(out, l.Lane+": "+why)
		}
	}
	return out
}

// Health checks the store (Store.Check, bounded by ctx) and reports the
// consumer's state. It is safe to call at any time, from any goroutine.
func (c *Consumer[TTx]) Health(ctx context.Context) Health {
	h := Health{Store: c.cfg.Store.Check(ctx), Misconfigured: c.keyVerdict()}
	c.runMu.Lock()
	h.Fatal = c.fatalErr
	h.Running = c.started && !c.isDone()
	c.runMu.Unlock()
	c.lanesMu.Lock()
	for _, l := range c.lanes {
		if l.stopped() {
			h.StoppedLanes = append(h.StoppedLanes, l.name)
		}
	}
	c.lanesMu.Unlock()
	sort.Strings(h.StoppedLanes)
	s := c.Stats()
	h.InFlight = s.Delivered - s.Applied - s.Duplicates - s.DeadLettered - s.Released
	if ns := c.progress.Load(); ns != 0 {
		h.LastProgress = time.Unix(0, ns)
	}
	if c.desc.Lanes != nil && h.Running {
		h.Lanes = c.desc.Lanes()
		sort.Slice(h.Lanes, func(i, j int) bool { return h.Lanes[i].Lane < h.Lanes[j].Lane })
	}
	if c.parking != nil {
		if s, err := c.parkedStats(ctx); err != nil {
			h.ParkedErr = err
		} else {
			h.Parked = &s
		}
	}
	return h
}

func (c *Consumer[TTx]) isDone() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// Ready reports whether the consumer can do its work — a readiness probe:
// it runs and its store answers. A database that went away makes it not
// ready; the consumer waits it out.
func (h Health) Ready() error {
	switch {
	case !h.Running:
		return errors.New("consumer: not running")
	case h.Store != nil:
		return fmt.Errorf("consumer: store: %w", h.Store)
	}
	return nil
}

// Live reports whether the consumer is doing its work — a liveness probe:
// it did not stop itself, no lane stopped, when it holds messages a batch
// was acknowledged within stall, and no lane of its own the source reports
// stalled for longer than stall (StalledLanes; a lane held elsewhere does
// not count, see LaneStatus.Elsewhere). An idle consumer is live, and so is
// one waiting for its store (that is Ready's business: a restart would not
// bring the database back). A stopped lane needs an operator (the message
// that stopped it is in the log) and a restart; so does a broken deployment.
func (h Health) Live(stall time.Duration) error {
	switch {
	case h.Fatal != nil:
		return fmt.Errorf("consumer: stopped: %w", h.Fatal)
	case len(h.StoppedLanes) > 0:
		return fmt.Errorf("consumer: lanes stopped: %v", h.StoppedLanes)
	case h.Store == nil && h.InFlight > 0 && !h.LastProgress.IsZero() && time.Since(h.LastProgress) > stall:
		return fmt.Errorf("consumer: %d messages in flight, no progress for %v", h.InFlight, time.Since(h.LastProgress).Round(time.Second))
	}
	// A lane waiting for its store is Ready's business too; one held
	// elsewhere is not this process's (LaneStatus.Elsewhere).
	var mine Health
	for _, l := range h.Lanes {
		if !l.Elsewhere {
			mine.Lanes = append(mine.Lanes, l)
		}
	}
	if s := mine.StalledLanes(time.Now(), stall); h.Store == nil && len(s) > 0 {
		return fmt.Errorf("consumer: lanes stalled: %s", strings.Join(s, "; "))
	}
	return nil
}
