// Package promtest reads what an observe.Server serves in tests: it serves
// one on a free port, fetches its pages, parses /metrics in Prometheus'
// text format and adds up a family's samples. It is apart from testenv so
// that tests without metrics do not build the Prometheus parser.
package promtest

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/idemkit/idem/observe"
)

// Serve serves obs on a free port until the test ends, then closes it, and
// returns its base URL.
func Serve(t *testing.T, obs *observe.Server) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- obs.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
		if err := obs.Close(context.Background()); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return "http://" + ln.Addr().String()
}

// Get fetches url and returns the status and body.
func Get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// Scrape fetches and parses base's /metrics, failing the test when it does
// not answer 200 or does not parse.
func Scrape(t *testing.T, base string) map[string]*dto.MetricFamily {
	t.Helper()
	code, body := Get(t, base+"/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics: %d %s", code, body)
	}
	fams, err := Parse(body)
	if err != nil {
		t.Fatalf("/metrics does not parse: %v\n%s", err, body)
	}
	return fams
}

// Parse parses Prometheus' text format.
func Parse(body string) (map[string]*dto.MetricFamily, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(strings.NewReader(body))
}

// Sum adds the values of a family's counter and gauge samples whose labels
// include where, and counts them; a histogram's samples count, and add 0.
func Sum(fams map[string]*dto.MetricFamily, name string, where map[string]string) (float64, int) {
	var total float64
	var n int
samples:
	for _, m := range fams[name].GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		for k, v := range where {
			if labels[k] != v {
				continue samples
			}
		}
		n++
		total += m.GetCounter().GetValue() + m.GetGauge().GetValue()
	}
	return total, n
}
