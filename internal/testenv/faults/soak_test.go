//go:build soak

package faults_test

// The soak (make soak, issue 29): the payments consumer as two children of
// one group on a private Kafka and a private Postgres, a steady stream for
// a long time, a fault every few minutes, a sample of each child every
// minute. It fails when a payment is lost or applied twice, and when the
// child that ran throughout grew: the median of the last third of the
// samples after the warm-up against the first third, RSS and goroutines,
// 10% at most. docs/reliability.md, "Soak", has a run.

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	kafkago "github.com/segmentio/kafka-go"

	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/internal/testenv/kafkatest"
)

// The soak's knobs (the Makefile's SOAK and RATE; LEAK is the child's,
// leakEnv).
const (
	soakDurationEnv = "IDEM_SOAK_DURATION" // default 30m
	soakRateEnv     = "IDEM_SOAK_RATE"     // messages a second, default 40
)

// maxGrowth is how much the surviving child's RSS and goroutines may grow
// from the first third of the samples after the warm-up to the last.
const maxGrowth = 0.10

// soakSample is one row of the soak's table.
type soakSample struct {
	At       time.Duration
	Children [2]procSample
	Backends int   // the children's Postgres backends; -1 unknown
	Lag      int64 // end offsets − committed, summed; -1 unknown
	Applied  int64 // ledger rows; -1 unknown
	Faults   []string
}

// procSample is a child in a soakSample.
type procSample struct {
	Pid        int
	RSS        int64 // bytes, /proc/PID/status VmRSS; -1 unknown
	Goroutines int
	Heap       uint64
	Conns      int32
	P99        time.Duration
}

func TestSoak(t *testing.T) {
	dur := envDuration(t, soakDurationEnv, 30*time.Minute)
	rate := envInt(t, soakRateEnv, 40)
	// A fault every tenth of the run, one to three minutes apart, half a
	// minute off the samples so that a sample never catches a fault's
	// recovery; the warm-up is a sixth of the run, one to five minutes.
	every := min(max(dur/10, time.Minute), 3*time.Minute).Truncate(time.Minute)
	warm := min(max(dur/6, time.Minute), 5*time.Minute).Truncate(time.Minute)
	if dur < warm+3*time.Minute {
		t.Fatalf("%s=%v: the growth check needs three samples after the %v warm-up", soakDurationEnv, dur, warm)
	}

	pg := testenv.NewPrivatePostgres(t, "deadlock_timeout = 100ms")
	pk := testenv.NewPrivateKafka(t)
	base, err := pgxpool.New(context.Background(), pg.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(base.Close)
	k := &kafkaBroker{Admin: kafkatest.NewAdmin(t, pk.Brokers())}
	const parts = 4
	r := newRigOn(t, k, "soak", parts, base, pg.URL())
	// About rate messages a second: the stream has ~5 messages for every 4
	// payments (duplicates, re-sends, bad messages).
	s := r.newStream("", max(int(dur.Seconds())*rate*4/5, 100), 29)
	t.Logf("soak: %v at %d msgs/s (%d messages, %d payments), a fault every %v, warm-up %v, LEAK=%q",
		dur, rate, len(s.first), r.wantPayments(), every, warm, os.Getenv(leakEnv))

	w := &kafkago.Writer{
		Addr: kafkago.TCP(k.Brokers...), Topic: r.topic, RequiredAcks: kafkago.RequireAll,
		Balancer:     kafkago.BalancerFunc(func(m kafkago.Message, _ ...int) int { return m.Partition }),
		BatchTimeout: 5 * time.Millisecond, Transport: k.Transport,
	}
	t.Cleanup(func() { w.Close() })
	sent := 0
	// produce sends the first wave's messages due by now (evenly over
	// dur); one that fails is sent again on the next call.
	produce := func(elapsed time.Duration) {
		due := min(int(float64(len(s.first))*elapsed.Seconds()/dur.Seconds()), len(s.first))
		if due <= sent {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		msgs := s.first[sent:due]
		if err := w.WriteMessages(ctx, kafkaMessages(msgs)...); err != nil {
			t.Logf("produce (sent again next time): %v", err)
			return
		}
		r.produced(msgs)
		sent = due
	}

	kids := [2]*child{r.start(failpoints{}), r.start(failpoints{})}
	faults := []struct {
		name string
		do   func()
	}{
		{"SIGKILL child 2, restart", func() {
			kids[1].Kill()
			kids[1] = r.start(failpoints{})
		}},
		{"broker SIGKILL, restart", func() {
			pk.Kill()
			time.Sleep(2 * time.Second)
			pk.Start()
			k.WaitLeaders(t, r.topic, parts)
		}},
		{"Postgres immediate stop, restart", func() {
			pg.Stop("immediate")
			time.Sleep(2 * time.Second)
			pg.Start()
			for _, p := range []*pgxpool.Pool{r.base, r.pool} {
				p.Reset() // the checks' own connections died too
			}
		}},
	}

	var rows []soakSample
	var pending []string // faults since the last row
	nFaults, nf := map[string]int{}, 0
	began := time.Now()
	nextSample, nextFault := time.Minute, every+30*time.Second
	for {
		elapsed := time.Since(began)
		produce(elapsed)
		for _, c := range kids {
			c.requireAlive(t)
		}
		if nextSample <= dur && elapsed >= nextSample {
			row := r.soakSample(k, kids, elapsed)
			row.Faults, pending = pending, nil
			rows = append(rows, row)
			t.Logf("%s", row)
			nextSample += time.Minute
		}
		if nextFault < dur && elapsed >= nextFault {
			f := faults[nf%len(faults)]
			nf++
			t0 := time.Now()
			f.do()
			nFaults[f.name]++
			pending = append(pending, fmt.Sprintf("%s (%v)", f.name, time.Since(t0).Round(100*time.Millisecond)))
			t.Logf("fault at %v: %s", elapsed.Round(time.Second), pending[len(pending)-1])
			nextFault += every
		}
		if nextSample > dur && elapsed >= dur {
			break
		}
		time.Sleep(time.Second - time.Since(began)%time.Second)
	}
	produce(dur)

	// The growth of the child that ran throughout, before the stream's
	// checks, which stop the test at their first failure.
	table := soakTable(rows)
	var after []soakSample
	for _, row := range rows {
		if row.At.Truncate(time.Minute) > warm { // At is a little past its minute
			after = append(after, row)
		}
	}
	rss := growth(after, func(p procSample) float64 { return float64(p.RSS) / (1 << 20) }) // MiB
	gor := growth(after, func(p procSample) float64 { return float64(p.Goroutines) })
	t.Logf("soak table:\n%s", table)
	t.Logf("faults: %v", nFaults)
	t.Logf("child 1 growth over %d samples after the %v warm-up (median of the last third vs the first): RSS %s, goroutines %s",
		len(after), warm, rss, gor)
	for what, g := range map[string]growthFigure{"RSS": rss, "goroutines": gor} {
		if !g.ok() {
			t.Errorf("child 1's %s grew %s (at most %.0f%%)", what, g, maxGrowth*100)
		}
	}

	waitApplyFor = 10 * time.Minute
	r.waitApplied(int64(r.wantPayments()), kids[:]...)
	r.produce(s.conflicts)
	r.finish()
	t.Logf("payments: %d applied, %d lost, %d applied twice; %d messages, %d dead letters, %d duplicates skipped",
		r.report.Effects, r.report.Lost, r.report.Double, r.report.Messages, r.report.DeadLetters, r.report.Duplicates)
}

// soakSample samples the children, the database and the group.
func (r *rig) soakSample(k *kafkaBroker, kids [2]*child, at time.Duration) soakSample {
	row := soakSample{At: at, Backends: -1, Lag: -1, Applied: -1}
	for i, c := range kids {
		st := c.stats()
		row.Children[i] = procSample{Pid: c.Cmd.Process.Pid, RSS: vmRSS(c.Cmd.Process.Pid), Goroutines: st.Goroutines,
			Heap: st.HeapBytes, Conns: st.PoolConns, P99: st.HandlerP99}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var n int
	if err := r.base.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, r.app).Scan(&n); err == nil {
		row.Backends = n
	}
	var applied int64
	if err := r.pool.QueryRow(ctx, `SELECT count(*) FROM ledger`).Scan(&applied); err == nil {
		row.Applied = applied
	}
	hw, err1 := k.HighWatermarks(ctx, r.topic)
	co, err2 := k.Committed(ctx, r.group, r.topic)
	if err1 == nil && err2 == nil && len(hw) == len(co) {
		row.Lag = 0
		for p := range hw {
			row.Lag += hw[p] - max(co[p], 0)
		}
	}
	return row
}

// vmRSS is pid's resident set in bytes (VmRSS), -1 when unknown.
func vmRSS(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "VmRSS:" && f[2] == "kB" {
			if kb, err := strconv.ParseInt(f[1], 10, 64); err == nil {
				return kb << 10
			}
		}
	}
	return -1
}

const soakHeader = "  min |  c1 pid  RSS MiB  gor  heap MiB  conns  p99 ms |  c2 pid  RSS MiB  gor  heap MiB  conns  p99 ms | backends    lag  applied | faults since the last row"

func (row soakSample) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%5.1f |", row.At.Minutes())
	for _, p := range row.Children {
		fmt.Fprintf(&b, " %7d %8.1f %4d %9.1f %6d %7.1f |", p.Pid, float64(p.RSS)/(1<<20), p.Goroutines,
			float64(p.Heap)/(1<<20), p.Conns, float64(p.P99.Microseconds())/1000)
	}
	fmt.Fprintf(&b, " %8d %6d %8d | %s", row.Backends, row.Lag, row.Applied, strings.Join(row.Faults, "; "))
	return b.String()
}

func soakTable(rows []soakSample) string {
	lines := []string{soakHeader}
	for _, row := range rows {
		lines = append(lines, row.String())
	}
	return strings.Join(lines, "\n")
}

// growthFigure is a median of the first third of some samples and of the
// last third.
type growthFigure struct {
	First, Last float64
	N           int // samples in each third; 0: too few samples
}

func (g growthFigure) ok() bool { return g.N > 0 && g.First > 0 && g.Last <= g.First*(1+maxGrowth) }

func (g growthFigure) String() string {
	if g.N == 0 || g.First <= 0 {
		return fmt.Sprintf("unknown (%d samples a third, first %.0f)", g.N, g.First)
	}
	return fmt.Sprintf("%+.1f%% (%.1f -> %.1f, %d samples a third)", (g.Last/g.First-1)*100, g.First, g.Last, g.N)
}

// growth is the growth of child 1's value of rows.
func growth(rows []soakSample, value func(procSample) float64) growthFigure {
	n := len(rows) / 3
	if n == 0 {
		return growthFigure{}
	}
	med := func(rs []soakSample) float64 {
		vs := make([]float64, len(rs))
		for i, r := range rs {
			vs[i] = value(r.Children[0])
		}
		slices.Sort(vs)
		if len(vs)%2 == 1 {
			return vs[len(vs)/2]
		}
		return (vs[len(vs)/2-1] + vs[len(vs)/2]) / 2
	}
	return growthFigure{First: med(rows[:n]), Last: med(rows[len(rows)-n:]), N: n}
}

func envDuration(t *testing.T, name string, def time.Duration) time.Duration {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return d
}

func envInt(t *testing.T, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		t.Fatalf("%s=%q: want a positive number", name, v)
	}
	return n
}
