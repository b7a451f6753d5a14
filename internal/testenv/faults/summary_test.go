package faults_test

import (
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"text/tabwriter"
	"time"
)

// row is one scenario's line in the summary.
type row struct {
	Scenario     string
	Broker       string
	Messages     int   // messages produced
	Duplicates   int64 // deliveries skipped as duplicates (consumers' Stats.Duplicates)
	Effects      int64 // ledger rows
	DeadLetters  int   // distinct messages on the dead-letter topic
	Lost         int64 // expected payments not applied
	Double       int64 // effects applied twice (reconciliation + audit)
	Passed       bool
	Took         time.Duration
	Notes        string
	orderInSuite int
}

var summary struct {
	mu   sync.Mutex
	rows []row
}

func record(r row) {
	summary.mu.Lock()
	defer summary.mu.Unlock()
	r.orderInSuite = len(summary.rows)
	summary.rows = append(summary.rows, r)
}

// printSummary prints the table to stdout (go test shows it with -v or on
// failure) and, with IDEM_FAULTS_SUMMARY set, writes it to that file.
func printSummary() {
	summary.mu.Lock()
	rows := append([]row(nil), summary.rows...)
	summary.mu.Unlock()
	if len(rows) == 0 {
		return
	}
	sort.SliceStable(rows, func(i, j int) bool {
		if rows[i].Broker != rows[j].Broker {
			return rows[i].Broker < rows[j].Broker
		}
		return scenarioOrder(rows[i].Scenario) < scenarioOrder(rows[j].Scenario)
	})
	var b strings.Builder
	w := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight|tabwriter.Debug)
	fmt.Fprintln(w, "scenario\tbroker\tmessages\tduplicate deliveries\teffects\tdead letters\tlost\tdouble-applied\tresult\ttook\t")
	for _, r := range rows {
		res := "ok"
		if !r.Passed {
			res = "FAIL"
		}
		fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t%s\t\n", r.Scenario, r.Broker, r.Messages, r.Duplicates,
			r.Effects, r.DeadLetters, r.Lost, r.Double, res, r.Took.Round(100*time.Millisecond))
	}
	w.Flush()
	out := "\nfault-injection summary\n" + b.String()
	fmt.Print(out)
	if path := os.Getenv("IDEM_FAULTS_SUMMARY"); path != "" {
		_ = os.WriteFile(path, []byte(out), 0o644)
	}
}

// scenarioOrder sorts rows by the number their scenario starts with.
func scenarioOrder(name string) int {
	n := 0
	for _, c := range name {
		if c < '0' || c > '9' {
			break
		}
		n = n*10 + int(c-'0')
	}
	return n
}
