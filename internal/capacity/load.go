package capacity

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
)

// benchRun is the part of cmd/idem-bench's -json output the model reads.
type benchRun struct {
	Settings struct {
		Partitions int `json:"partitions"`
		P1Batch    int `json:"one_partition_batch"`
	} `json:"settings"`
	Rows []struct {
		Name      string  `json:"name"`
		PerSecond float64 `json:"messages_per_second"`
		CPU       float64 `json:"cpu_seconds_per_100k"`
		DBCPU     float64 `json:"postgres_cpu_seconds_per_100k"`
		BrokerCPU float64 `json:"broker_cpu_seconds_per_100k"`
		Busy      float64 `json:"machine_busy"`
	} `json:"rows"`
}

// Load reads the measurements in dir: every *.json file is one run of
// cmd/idem-bench -json. Its idem-b100 row is a point at the run's partition
// count and batch 100; its p1-idem row one lane at -p1-batch. Points are
// sorted by lanes, then batch.
func Load(dir string) ([]Point, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		return nil, err
	}
	var pts []Point
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		var r benchRun
		if err := json.Unmarshal(b, &r); err != nil {
			return nil, fmt.Errorf("capacity: %s: %w", f, err)
		}
		for _, row := range r.Rows {
			p := Point{Rate: row.PerSecond, AppCPU: row.CPU / 1e5, DBCPU: row.DBCPU / 1e5, BrokerCPU: row.BrokerCPU / 1e5, Busy: row.Busy}
			switch row.Name {
			case "idem-b100":
				p.Lanes, p.Batch = r.Settings.Partitions, 100
			case "p1-idem":
				p.Lanes, p.Batch = 1, r.Settings.P1Batch
			default:
				continue
			}
			pts = append(pts, p)
		}
	}
	if len(pts) == 0 {
		return nil, fmt.Errorf("capacity: no idem-b100 or p1-idem rows in %s", dir)
	}
	sort.Slice(pts, func(i, j int) bool {
		if pts[i].Lanes != pts[j].Lanes {
			return pts[i].Lanes < pts[j].Lanes
		}
		return pts[i].Batch < pts[j].Batch
	})
	return pts, nil
}
