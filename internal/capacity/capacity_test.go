package capacity

import (
	"math"
	"testing"
)

// shaped like this machine's fit (docs/scaling.md)
var sample = Model{
	Cores:  2,
	Wait:   Cost{Tx: 800e-6, Msg: 9e-6},
	Store:  Cost{Tx: 800e-6, Msg: 15e-6},
	App:    Cost{Tx: 600e-6, Msg: 11e-6},
	Broker: Cost{Tx: 400e-6, Msg: 5e-6},
}

// The formula is a bound the simulation never passes; they agree where
// one limit is far from the other (one lane: its waits; many lanes: the
// cores). Near the knee the simulation is lower: with a few lanes in a
// closed loop, the cores idle while most lanes wait (the machine-repairman
// effect), which the min of the two limits ignores.
func TestSimulationAgreesWithTheFormula(t *testing.T) {
	for _, c := range []struct {
		lanes, batch int
		tol          float64 // how far below the formula the simulation may be
	}{{1, 100, 0.10}, {1, 10, 0.10}, {2, 100, 0.30}, {4, 100, 0.30}, {64, 100, 0.05}, {64, 10, 0.05}} {
		bound, got := sample.Predict(c.lanes, c.batch), sample.Simulate(c.lanes, c.batch, 2)
		if got > bound*1.01 || got < bound*(1-c.tol) {
			t.Errorf("%d lanes, batch %d: simulated %.0f msg/s, formula %.0f: want at most the formula and at least %.0f%% of it",
				c.lanes, c.batch, got, bound, (1-c.tol)*100)
		}
	}
}

func TestFitRecoversTheModel(t *testing.T) {
	m := sample
	pt := func(lanes, b int) Point {
		return Point{Lanes: lanes, Batch: b, Rate: m.Predict(lanes, b),
			AppCPU: m.App.PerMessage(b), DBCPU: m.Store.PerMessage(b), BrokerCPU: m.Broker.PerMessage(b)}
	}
	got, err := Fit([]Point{pt(1, 10), pt(1, 100), pt(4, 100)}, 2)
	if err != nil {
		t.Fatal(err)
	}
	for name, v := range map[string][2]Cost{"Wait": {got.Wait, m.Wait}, "Store": {got.Store, m.Store}, "App": {got.App, m.App}, "Broker": {got.Broker, m.Broker}} {
		if math.Abs(v[0].Tx-v[1].Tx) > 1e-9 || math.Abs(v[0].Msg-v[1].Msg) > 1e-9 {
			t.Errorf("%s fitted %+v, want %+v", name, v[0], v[1])
		}
	}
	if _, err := Fit([]Point{pt(2, 100), pt(4, 100)}, 2); err == nil {
		t.Error("fitted without one-lane points at two batch sizes")
	}
}

// The model fitted to this machine's one-lane measurements
// (testdata/scaling, from scripts/scaling.sh) predicts the points with more
// lanes, which the fit did not see, and the simulation agrees with every
// point, within 25%: the tolerance of measurements on a two-core machine
// whose broker, database and consumer share the cores.
func TestModelMatchesTheMeasurements(t *testing.T) {
	pts, err := Load("../../testdata/scaling")
	if err != nil {
		t.Fatal(err)
	}
	m, err := Fit(pts, 2)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", m)
	for _, p := range pts {
		pred, sim := m.Predict(p.Lanes, p.Batch), m.Simulate(p.Lanes, p.Batch, 2)
		t.Logf("%d lanes, batch %d: measured %.0f, model %.0f, simulated %.0f msg/s", p.Lanes, p.Batch, p.Rate, pred, sim)
		for what, v := range map[string]float64{"model": pred, "simulation": sim} {
			if d := math.Abs(v-p.Rate) / p.Rate; d > 0.25 {
				t.Errorf("%d lanes, batch %d: %s %.0f msg/s, measured %.0f (%.0f%% off)", p.Lanes, p.Batch, what, v, p.Rate, d*100)
			}
		}
	}
}
