// Command idem-capacity prints docs/scaling.md's capacity model: fitted to the
// measurements in testdata/scaling (scripts/scaling.sh makes them), the
// measured points beside the model's prediction and its simulation, and
// what a target rate needs.
//
//	go run ./cmd/idem-capacity -target 100000 [-batch 100] [-util 0.7]
package main

import (
	"flag"
	"fmt"
	"log"
	"os"

	"github.com/idemkit/idem/internal/capacity"
)

func main() {
	dir := flag.String("data", "testdata/scaling", "directory of cmd/idem-bench -json runs")
	cores := flag.Float64("cores", 2, "cores of the machine the measurements ran on")
	target := flag.Float64("target", 100000, "messages per second to plan for")
	batch := flag.Int("batch", 100, "BatchSize to plan for")
	util := flag.Float64("util", 0.7, "share of each core and lane the plan fills at most")
	flag.Parse()
	log.SetFlags(0)
	pts, err := capacity.Load(*dir)
	if err != nil {
		log.Fatal(err)
	}
	m, err := capacity.Fit(pts, *cores)
	if err != nil {
		log.Fatal(err)
	}
	w := os.Stdout
	us := func(c capacity.Cost) string {
		return fmt.Sprintf("%.0f µs + %.1f µs per message", c.Tx*1e6, c.Msg*1e6)
	}
	fmt.Fprintf(w, "model (per batch): wait %s; store CPU %s; consumer CPU %s; broker CPU %s; %g cores\n",
		us(m.Wait), us(m.Store), us(m.App), us(m.Broker), m.Cores)
	fmt.Fprintf(w, "one lane at batch %d: %.0f msg/s; the cores' limit: %.0f msg/s\n\n", *batch, m.LaneRate(*batch), m.CPULimit(*batch))
	fmt.Fprintln(w, "| lanes | batch | measured msg/s | model | simulated | machine busy |")
	fmt.Fprintln(w, "|---:|---:|---:|---:|---:|---:|")
	for _, p := range pts {
		fmt.Fprintf(w, "| %d | %d | %.0f | %.0f | %.0f | %.0f%% |\n", p.Lanes, p.Batch, p.Rate, m.Predict(p.Lanes, p.Batch), m.Simulate(p.Lanes, p.Batch, 2), p.Busy*100)
	}
	p := m.PlanFor(*target, *batch, *util)
	fmt.Fprintf(w, "\n%.0f msg/s at batch %d, cores and lanes at most %.0f%% full: %d partitions, %.1f store cores, %.1f consumer cores (their handlers' own work not included), %.1f broker cores\n",
		p.Target, p.Batch, p.Utilisation*100, p.Partitions, p.StoreCores, p.ConsumerCores, p.BrokerCores)
}
