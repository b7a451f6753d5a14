package capacity

import (
	"math"
	"testing"
)

// The formula is a bound the simulation never passes; they agree where
// one limit is far from the other (few lanes: the lanes' waits; many: the
// cores). Near the knee the simulation is lower: with a few lanes in a
// closed loop, the cores idle while most lanes wait (the machine-repairman
// effect), which the min of the two limits ignores.
func TestSimulationAgreesWithTheFormula(t *testing.T) {
	m := Model{Cores: 2, T0: 0.002, TxCPU: 300e-6, MsgCPU: 15e-6, BrokerCPU: 3e-6, DBShare: 0.6}
	for _, c := range []struct {
		lanes, batch int
		tol          float64 // how far below the formula the simulation may be
	}{{1, 100, 0.05}, {1, 10, 0.05}, {2, 100, 0.10}, {4, 100, 0.40}, {8, 100, 0.25}, {64, 100, 0.05}, {64, 10, 0.05}} {
		bound, got := m.Predict(c.lanes, c.batch), m.Simulate(c.lanes, c.batch, 2)
		if got > bound*1.01 || got < bound*(1-c.tol) {
			t.Errorf("%d lanes, batch %d: simulated %.0f msg/s, formula %.0f: want at most the formula and at least %.0f%% of it",
				c.lanes, c.batch, got, bound, (1-c.tol)*100)
		}
	}
}

func TestFitRecoversTheModel(t *testing.T) {
	m := Model{Cores: 2, T0: 0.002, TxCPU: 300e-6, MsgCPU: 15e-6, BrokerCPU: 3e-6, DBShare: 0.5}
	pt := func(lanes, b int) Point {
		per := m.TxCPU/float64(b) + m.MsgCPU
		return Point{Lanes: lanes, Batch: b, Rate: m.Predict(lanes, b), AppCPU: per / 2, DBCPU: per / 2, BrokerCPU: m.BrokerCPU}
	}
	got, err := Fit([]Point{pt(1, 10), pt(1, 100), pt(4, 100)}, 2)
	if err != nil {
		t.Fatal(err)
	}
	for name, v := range map[string][2]float64{"T0": {got.T0, m.T0}, "TxCPU": {got.TxCPU, m.TxCPU}, "MsgCPU": {got.MsgCPU, m.MsgCPU}, "DBShare": {got.DBShare, m.DBShare}} {
		if math.Abs(v[0]-v[1]) > 1e-9+1e-6*v[1] {
			t.Errorf("%s fitted %g, want %g", name, v[0], v[1])
		}
	}
	if _, err := Fit([]Point{pt(2, 100), pt(4, 100)}, 2); err == nil {
		t.Error("fitted without one-lane points at two batch sizes")
	}
}

// The model fitted to this machine's measurements (testdata/scaling, from
// scripts/scaling.sh) predicts every measured point, and the simulation
// agrees with them, within 30%: the tolerance of measurements on a
// two-core machine whose broker, database and consumer share the cores.
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
			if d := math.Abs(v-p.Rate) / p.Rate; d > 0.30 {
				t.Errorf("%d lanes, batch %d: %s %.0f msg/s, measured %.0f (%.0f%% off)", p.Lanes, p.Batch, what, v, p.Rate, d*100)
			}
		}
	}
}
