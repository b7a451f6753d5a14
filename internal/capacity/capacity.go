// Package capacity is idem's capacity model: how many messages per second a
// consumer reaches with a number of lanes (partitions or queues, or key
// lanes) and a batch size, on a store with a number of cores, fitted to
// measurements from cmd/idem-bench and checked against them by a small
// simulation. SCALING.md explains it; cmd/idem-capacity prints it.
//
// A lane is a closed loop: it takes a batch, spends CPU on it (idem and the
// store: the claim, the handler's insert, the commit; Work), then waits for
// what is not CPU (round trips and the commit's fsync; T0), then takes the
// next. Lanes share the machine's cores with the broker, whose CPU grows
// with the rate. So
//
//	lane rate  = b / (T0 + Work(b))                    (lanes idle-waiting: add lanes)
//	CPU limit  = Cores / (TxCPU/b + MsgCPU + BrokerCPU) (cores spent: add cores)
//	rate(L, b) = min(L × lane rate, CPU limit)
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

// Model is the fitted capacity model. Times are in seconds.
type Model struct {
	Cores     float64 // the machine's cores
	T0        float64 // a transaction's wait that is not CPU: round trips, fsync
	TxCPU     float64 // CPU per transaction of idem and the store (BEGIN, claim and COMMIT statements)
	MsgCPU    float64 // CPU per message of idem and the store
	BrokerCPU float64 // CPU per message of the broker
	DBShare   float64 // the store's share of TxCPU and MsgCPU (for store cores)
}

// Work is the CPU a lane spends on one batch of b messages.
func (m Model) Work(b int) float64 { return m.TxCPU + float64(b)*m.MsgCPU }

// CPUPerMessage is all the CPU one message costs at batch size b.
func (m Model) CPUPerMessage(b int) float64 { return m.TxCPU/float64(b) + m.MsgCPU + m.BrokerCPU }

// LaneRate is one lane's rate when it has the cores it needs.
func (m Model) LaneRate(b int) float64 { return float64(b) / (m.T0 + m.Work(b)) }

// CPULimit is the rate at which the machine's cores are spent.
func (m Model) CPULimit(b int) float64 { return m.Cores / m.CPUPerMessage(b) }

// Predict is the model's rate for lanes lanes at batch size b.
func (m Model) Predict(lanes, b int) float64 {
	return math.Min(float64(lanes)*m.LaneRate(b), m.CPULimit(b))
}

// Fit fits a model to measurements: TxCPU and MsgCPU from the CPU per
// message of two batch sizes on one lane, T0 from the one-lane rate at the
// larger batch, BrokerCPU as the mean over all points.
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
	m := Model{Cores: cores}
	as, al := small.AppCPU+small.DBCPU, large.AppCPU+large.DBCPU
	bs, bl := float64(small.Batch), float64(large.Batch)
	m.TxCPU = (as - al) / (1/bs - 1/bl)
	if m.TxCPU < 0 {
		m.TxCPU = 0 // noise: a smaller batch measured cheaper per message
	}
	m.MsgCPU = al - m.TxCPU/bl
	m.T0 = bl/large.Rate - m.Work(large.Batch)
	if m.T0 < 0 {
		return Model{}, fmt.Errorf("capacity: one lane at batch %d ran at %.0f msg/s, faster than its CPU alone allows", large.Batch, large.Rate)
	}
	var db, app float64
	for _, p := range points {
		m.BrokerCPU += p.BrokerCPU / float64(len(points))
		db += p.DBCPU
		app += p.AppCPU
	}
	m.DBShare = db / (db + app)
	return m, nil
}

// Simulate runs lanes closed-loop lanes of batch b for the given simulated
// time: each batch needs Work(b) seconds of one core, then waits T0. The
// broker's work (BrokerCPU per message delivered) is served first, as the
// messages a lane takes must have been fetched; the lanes share what cores
// are left equally (processor sharing), each batch at most one core. It
// returns the messages per second.
func (m Model) Simulate(lanes, b int, seconds float64) float64 {
	const dt = 5e-6
	type lane struct {
		cpuLeft float64 // CPU still needed by the batch; 0 when waiting
		waitEnd float64 // end of the non-CPU wait
	}
	// Batches vary (±25% of Work, seeded): identical batches under
	// processor sharing would keep the lanes in lockstep — all computing,
	// then all waiting with the cores idle — which real lanes are not.
	rng := rand.New(rand.NewPCG(1, uint64(lanes)<<32|uint64(b)))
	work := func() float64 { return m.Work(b) * (0.75 + 0.5*rng.Float64()) }
	ls := make([]lane, lanes)
	for i := range ls {
		ls[i].cpuLeft = work()
	}
	brokerLeft := 0.0 // broker CPU owed for delivered messages
	done := 0.0
	for now := 0.0; now < seconds; now += dt {
		broker := math.Min(brokerLeft, m.Cores*dt)
		brokerLeft -= broker
		active := 0
		for i := range ls {
			if ls[i].cpuLeft > 0 {
				active++
			}
		}
		share := dt
		if active > 0 {
			share = math.Min(dt, (m.Cores*dt-broker)/float64(active))
		}
		for i := range ls {
			l := &ls[i]
			switch {
			case l.cpuLeft > 0:
				l.cpuLeft -= share
				if l.cpuLeft <= 0 {
					l.cpuLeft, l.waitEnd = 0, now+m.T0
				}
			case now >= l.waitEnd:
				done += float64(b)
				brokerLeft += float64(b) * m.BrokerCPU
				l.cpuLeft = work()
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
	ConsumerCores float64 // idem's and the handlers' CPU at the target
	Utilisation   float64 // the share of a core the plan fills at most
}

// PlanFor sizes a deployment for target messages per second at batch size
// b, filling cores and lanes up to util (0.7 leaves room for bursts and
// retries).
func (m Model) PlanFor(target float64, b int, util float64) Plan {
	perMsg := m.TxCPU/float64(b) + m.MsgCPU
	return Plan{
		Target:        target,
		Batch:         b,
		Partitions:    int(math.Ceil(target / (util * m.LaneRate(b)))),
		StoreCores:    target * perMsg * m.DBShare / util,
		ConsumerCores: target * perMsg * (1 - m.DBShare) / util,
		Utilisation:   util,
	}
}
