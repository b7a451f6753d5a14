// Package capacity is idem's capacity model: how many messages per second a
// consumer reaches with a number of lanes (partitions or queues, or key
// lanes) and a batch size, fitted to measurements from cmd/idem-bench and
// checked against them by a small simulation. docs/scaling.md explains it;
// cmd/idem-capacity prints it.
//
// A lane is a closed loop: it takes a batch, waits for the store to do the
// batch's work (CPU: the claim, the handler's insert, the commit; Store),
// and for what is not CPU (round trips, writing and flushing the WAL;
// Wait), then takes the next. The consumer's fetching and decoding and the
// broker run beside the lanes, on the same cores (Other). Every CPU cost has
// a part per transaction and a part per message. So
//
//	lane rate  = b / (Wait(b) + Store(b))                      (lanes wait: add lanes)
//	CPU limit  = Cores / ((StoreTx+OtherTx)/b + StoreMsg+OtherMsg) (cores spent: add cores)
//	rate(L, b) ≤ min(L × lane rate, CPU limit)
package capacity

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
)

// Point is one measured configuration.
type Point struct {
	Lanes int     // partitions (one lane each)
	Batch int     // BatchSize
	Rate  float64 // messages per second
	// CPU seconds per message of the consumer process, of Postgres and of
	// the broker, from /proc.
	AppCPU, DBCPU, BrokerCPU float64
	Busy                     float64 // share of the machine's cores busy over the run, 0..1
}

// Cost is a CPU or time cost with a part per transaction and a part per
// message, in seconds.
type Cost struct{ Tx, Msg float64 }

// Batch is the cost of one batch of b messages.
func (c Cost) Batch(b int) float64 { return c.Tx + float64(b)*c.Msg }

// PerMessage is the cost per message at batch size b.
func (c Cost) PerMessage(b int) float64 { return c.Tx/float64(b) + c.Msg }

// fit solves c.PerMessage(b) = v for two batch sizes.
func fit(b1, v1, b2, v2 float64) Cost {
	tx := (v1 - v2) / (1/b1 - 1/b2)
	if tx < 0 {
		tx = 0 // noise: the smaller batch measured cheaper per message
	}
	return Cost{Tx: tx, Msg: math.Max(v2-tx/b2, 0)}
}

// Model is the fitted capacity model.
type Model struct {
	Cores  float64
	Wait   Cost // a lane's time that is not CPU: round trips, WAL writes and flushes
	Store  Cost // the store's CPU, on the lane's path
	App    Cost // the consumer process's CPU: fetching, decoding, idem (beside the lanes)
	Broker Cost // the broker's CPU (beside the lanes)
}

// LaneRate is one lane's rate when it has the cores it needs.
func (m Model) LaneRate(b int) float64 { return float64(b) / (m.Wait.Batch(b) + m.Store.Batch(b)) }

// CPUPerMessage is all the CPU one message costs at batch size b.
func (m Model) CPUPerMessage(b int) float64 {
	return m.Store.PerMessage(b) + m.App.PerMessage(b) + m.Broker.PerMessage(b)
}

// CPULimit is the rate at which the machine's cores are spent.
func (m Model) CPULimit(b int) float64 { return m.Cores / m.CPUPerMessage(b) }

// Predict is the model's bound for lanes lanes at batch size b.
func (m Model) Predict(lanes, b int) float64 {
	return math.Min(float64(lanes)*m.LaneRate(b), m.CPULimit(b))
}

// Fit fits a model to measurements: every cost from the one-lane points at
// two batch sizes (per-message costs at two sizes give the per-transaction
// and per-message parts; a lane's time per batch, less the store's CPU, is
// its wait). The points with more lanes are left to check the model.
func Fit(points []Point, cores float64) (Model, error) {
	var small, large *Point
	for i := range points {
		p := &points[i]
		if p.Lanes != 1 {
			continue
		}
		if small == nil || p.Batch < small.Batch {
			small = p
		}
		if large == nil || p.Batch > large.Batch {
			large = p
		}
	}
	if small == nil || large == nil || small.Batch == large.Batch {
		return Model{}, errors.New("capacity: fit needs one-lane measurements at two batch sizes")
	}
	bs, bl := float64(small.Batch), float64(large.Batch)
	m := Model{
		Cores:  cores,
		Store:  fit(bs, small.DBCPU, bl, large.DBCPU),
		App:    fit(bs, small.AppCPU, bl, large.AppCPU),
		Broker: fit(bs, small.BrokerCPU, bl, large.BrokerCPU),
	}
	// A lane's time per message less the store's CPU per message.
	ws, wl := 1/small.Rate-small.DBCPU, 1/large.Rate-large.DBCPU
	if ws < 0 || wl < 0 {
		return Model{}, fmt.Errorf("capacity: one lane ran faster than the store's CPU allows (%.0f msg/s at batch %d, %.0f at %d)",
			small.Rate, small.Batch, large.Rate, large.Batch)
	}
	m.Wait = fit(bs, ws, bl, wl)
	return m, nil
}

// Simulate runs lanes closed-loop lanes of batch b for the given simulated
// time. A batch needs Store.Batch(b) seconds of one core, then waits
// Wait.Batch(b). The consumer's and the broker's work for the messages
// taken (App and Broker) runs beside the lanes, at most a batch per lane
// ahead of them; the cores are shared max-min fairly, each lane at most
// one core. It returns the messages per second.
func (m Model) Simulate(lanes, b int, seconds float64) float64 {
	const dt = 5e-6
	type lane struct {
		cpuLeft float64 // store CPU still needed by the batch; 0 when waiting
		waitEnd float64 // end of the non-CPU wait
	}
	// Batches vary (±25%, seeded): identical batches under processor
	// sharing would keep the lanes in lockstep — all computing, then all
	// waiting with the cores idle — which real lanes are not.
	rng := rand.New(rand.NewPCG(1, uint64(lanes)<<32|uint64(b)))
	vary := func(v float64) float64 { return v * (0.75 + 0.5*rng.Float64()) }
	ls := make([]lane, lanes)
	for i := range ls {
		ls[i].cpuLeft = vary(m.Store.Batch(b))
	}
	besideLeft := 0.0 // consumer and broker CPU owed for messages taken
	ahead := float64(lanes) * (m.App.Batch(b) + m.Broker.Batch(b))
	done := 0.0
	for now := 0.0; now < seconds; now += dt {
		active := 0
		for i := range ls {
			if ls[i].cpuLeft > 0 {
				active++
			}
		}
		// Max-min fair shares of the cores: each lane wants one core, the
		// consumer's and broker's threads up to all of them.
		capacity, want := m.Cores*dt, math.Min(besideLeft, m.Cores*dt)
		beside, share := want, dt
		if want+float64(active)*dt > capacity {
			switch level := capacity / float64(active+1); {
			case active == 0:
				beside = capacity
			case want <= level:
				share = (capacity - want) / float64(active)
			case dt <= level:
				beside = capacity - float64(active)*dt
			default:
				beside, share = level, level
			}
		}
		besideLeft -= beside
		for i := range ls {
			l := &ls[i]
			switch {
			case l.cpuLeft > 0:
				l.cpuLeft -= share
				if l.cpuLeft <= 0 {
					l.cpuLeft, l.waitEnd = 0, now+vary(m.Wait.Batch(b))
				}
			case now >= l.waitEnd && besideLeft <= ahead:
				// The next batch's messages are fetched ahead, but not
				// beyond a batch per lane: past that the lane waits.
				done += float64(b)
				besideLeft += m.App.Batch(b) + m.Broker.Batch(b)
				l.cpuLeft = vary(m.Store.Batch(b))
			}
		}
	}
	return done / seconds
}

// Plan is what a target rate needs.
type Plan struct {
	Target        float64 // messages per second
	Batch         int
	Partitions    int     // lanes: partitions, queues or key lanes
	StoreCores    float64 // the store's CPU at the target
	ConsumerCores float64 // the consumers' CPU at the target (the handlers' own work not included)
	BrokerCores   float64 // the broker's CPU at the target
	Utilisation   float64 // the share of a core or a lane the plan fills at most
}

// PlanFor sizes a deployment for target messages per second at batch size
// b, filling cores and lanes up to util (0.7 leaves room for bursts and
// retries).
func (m Model) PlanFor(target float64, b int, util float64) Plan {
	return Plan{
		Target:        target,
		Batch:         b,
		Partitions:    int(math.Ceil(target / (util * m.LaneRate(b)))),
		StoreCores:    target * m.Store.PerMessage(b) / util,
		ConsumerCores: target * m.App.PerMessage(b) / util,
		BrokerCores:   target * m.Broker.PerMessage(b) / util,
		Utilisation:   util,
	}
}
