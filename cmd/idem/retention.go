package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
	"text/tabwriter"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/idemkit/idem/dedup"
)

// ageMetric is consumer/otelconsumer's idem.consumer.duplicate.age as the
// OpenTelemetry Prometheus exporter names it.
const ageMetric = "idem_consumer_duplicate_age_seconds"

// ages is the duplicate-age histogram of one consumer.
type ages struct {
	bounds []float64 // seconds, ascending; +Inf last
	counts []uint64  // cumulative
}

// quantile returns the bucket bound under which at least q of the
// duplicates arrived; +Inf when that is the last bucket.
func (a ages) quantile(q float64) float64 {
	if len(a.counts) == 0 || a.counts[len(a.counts)-1] == 0 {
		return 0
	}
	want := uint64(math.Ceil(q * float64(a.counts[len(a.counts)-1])))
	for i, c := range a.counts {
		if c >= want {
			return a.bounds[i]
		}
	}
	return math.Inf(1)
}

func (a ages) total() uint64 {
	if len(a.counts) == 0 {
		return 0
	}
	return a.counts[len(a.counts)-1]
}

// scrape reads the duplicate-age histograms from a Prometheus endpoint, by
// consumer name (the label idem_consumer_name), summed over partitions.
func scrape(ctx context.Context, url string) (map[string]ages, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "text/plain")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", url, resp.Status)
	}
	return parseAges(resp.Body)
}

func parseAges(r io.Reader) (map[string]ages, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	out := map[string]ages{}
	fam, ok := fams[ageMetric]
	if !ok || fam.GetType() != dto.MetricType_HISTOGRAM {
		return out, nil
	}
	for _, m := range fam.GetMetric() {
		name := ""
		for _, l := range m.GetLabel() {
			if l.GetName() == "idem_consumer_name" {
				name = l.GetValue()
			}
		}
		h := m.GetHistogram()
		// The text format lists the +Inf bucket too: it is added below,
		// from the sample count, once.
		var buckets []*dto.Bucket
		for _, b := range h.GetBucket() {
			if !math.IsInf(b.GetUpperBound(), 1) {
				buckets = append(buckets, b)
			}
		}
		a := out[name]
		if a.bounds == nil {
			for _, b := range buckets {
				a.bounds = append(a.bounds, b.GetUpperBound())
			}
			a.bounds = append(a.bounds, math.Inf(1))
			a.counts = make([]uint64, len(a.bounds))
		}
		for i, b := range buckets {
			if i < len(a.counts)-1 {
				a.counts[i] += b.GetCumulativeCount()
			}
		}
		a.counts[len(a.counts)-1] += h.GetSampleCount()
		out[name] = a
	}
	return out, nil
}

type retentionJSON struct {
	Scope        string  `json:"scope"`
	RetentionSec float64 `json:"retention_seconds"` // 0 with forever
	Forever      bool    `json:"forever"`
	Duplicates   uint64  `json:"duplicates"`       // seen by the consumer, from its metrics
	P999Sec      float64 `json:"p999_age_seconds"` // the bucket bound; -1 for over the last bound
	Advice       string  `json:"advice"`           // ok, too_short, no_data
	AdviceText   string  `json:"advice_text"`
}

func runRetention(ctx context.Context, e *env, fs *flag.FlagSet, args []string) int {
	var sf storeFlags
	sf.register(fs, e)
	metrics := fs.String("metrics", e.getenv("IDEM_METRICS_URL"), "a consumer's Prometheus endpoint, e.g. http://host:9464/metrics (env IDEM_METRICS_URL)")
	margin := fs.Float64("margin", 2, "retention should be at least this many times the 99.9th percentile of duplicate ages")
	if _, code, ok := parse(fs, args); !ok {
		return code
	}
	admin, closeStore, err := sf.open(ctx, false)
	if err != nil {
		return fail(e, err)
	}
	defer closeStore()
	sum, err := admin.Summary(ctx)
	if err != nil {
		return fail(e, err)
	}
	var hist map[string]ages
	if *metrics != "" {
		if hist, err = scrape(ctx, *metrics); err != nil {
			return fail(e, err)
		}
	}
	out, short := adviseRetention(sum, hist, *metrics != "", *margin)
	if sf.json {
		printJSON(e, out)
	} else {
		tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "SCOPE\tRETENTION\tDUPLICATES\tP99.9 AGE\tADVICE")
		for _, r := range out {
			ret := "forever"
			if !r.Forever {
				ret = duration(time.Duration(r.RetentionSec * float64(time.Second)))
			}
			p := "-"
			switch {
			case r.P999Sec < 0:
				p = "> last bucket"
			case r.Duplicates > 0:
				p = "≤ " + duration(time.Duration(r.P999Sec*float64(time.Second)))
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s: %s\n", r.Scope, ret, r.Duplicates, p, r.Advice, r.AdviceText)
		}
		tw.Flush()
	}
	if short {
		return exitPartial
	}
	return exitOK
}

// adviseRetention compares each scope's retention (from its rows) with the
// duplicate ages of its consumer (hist, by consumer name; metricsGiven:
// hist was scraped): idem retention's advice, the console's too. short
// reports a scope whose retention is below the margin.
func adviseRetention(sum []dedup.ScopeSummary, hist map[string]ages, metricsGiven bool, margin float64) (out []retentionJSON, short bool) {
	// A scope's retention, from its rows: the longest written, or for ever.
	scopes := map[string]dedup.ScopeSummary{}
	for _, s := range sum {
		cur := scopes[s.Scope]
		cur.Scope = s.Scope
		cur.Forever = cur.Forever || s.Forever
		cur.Retention = max(cur.Retention, s.Retention)
		scopes[s.Scope] = cur
	}
	for _, name := range sortedKeys(scopes) {
		s := scopes[name]
		r := retentionJSON{Scope: name, RetentionSec: s.Retention.Seconds(), Forever: s.Forever}
		consumerName, _, _ := strings.Cut(name, "/") // Name/tenant
		a, seen := hist[consumerName]
		r.Duplicates = a.total()
		p := a.quantile(0.999)
		r.P999Sec = p
		if math.IsInf(p, 1) {
			r.P999Sec = -1
		}
		switch {
		case !metricsGiven:
			r.Advice, r.AdviceText = "no_data", "no duplicate ages: run with --metrics URL of a consumer instrumented with consumer/otelconsumer (or compare Stats().DuplicateAge.Quantile(0.999) yourself)"
		case !seen || r.Duplicates == 0:
			r.Advice, r.AdviceText = "no_data", "the consumer has seen no duplicates yet"
		case s.Forever:
			r.Advice, r.AdviceText = "ok", "kept for ever"
		case math.IsInf(p, 1) || s.Retention.Seconds() < margin*p:
			short = true
			r.Advice = "too_short"
			if math.IsInf(p, 1) {
				r.AdviceText = fmt.Sprintf("duplicates arrive later than %s (the last bucket): keep the keys for ever, or for months", duration(time.Duration(a.bounds[len(a.bounds)-2])*time.Second))
			} else {
				r.AdviceText = fmt.Sprintf("99.9%% of duplicates arrive within %s: keep keys at least %s (×%g)", duration(time.Duration(p)*time.Second), duration(time.Duration(margin*p)*time.Second), margin)
			}
		default:
			r.Advice, r.AdviceText = "ok", fmt.Sprintf("99.9%% of duplicates arrive within %s", duration(time.Duration(p)*time.Second))
		}
		out = append(out, r)
	}
	return out, short
}
