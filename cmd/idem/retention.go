package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	neturl "net/url"
	"strings"
	"text/tabwriter"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/idemkit/idem/dedup"
)

// ageMetric is consumer/otelconsumer's idem.consumer.duplicate.age as the
// OpenTelemetry Prometheus exporter names it; replayAgeMetric
// httpidem/otelhttpidem's idem.http.replay.age.
const (
	ageMetric       = "idem_consumer_duplicate_age_seconds"
	replayAgeMetric = "idem_http_replay_age_seconds"
)

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

// scraped are the age histograms of a Prometheus endpoint: a consumer's
// duplicates by consumer name (the label idem_consumer_name), summed over
// partitions, and an HTTP service's replayed retries by "METHOD route"
// (http_request_method, http_route), as an HTTP scope begins.
type scraped struct {
	consumers, routes map[string]ages
}

// scrape reads the age histograms from a Prometheus endpoint.
func scrape(ctx context.Context, url string) (scraped, error) {
	// The URL may hold a password or a token: it is shown redacted only.
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return scraped{}, fmt.Errorf("metrics URL %s: not a URL", redactURL(url))
	}
	req.Header.Set("Accept", "text/plain")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		var uerr *neturl.Error
		if errors.As(err, &uerr) {
			return scraped{}, fmt.Errorf("%s %s: %w", uerr.Op, redactURL(url), uerr.Err)
		}
		return scraped{}, fmt.Errorf("%s: %w", redactURL(url), err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return scraped{}, fmt.Errorf("%s: %s", redactURL(url), resp.Status)
	}
	return parseScrape(resp.Body)
}

// parseScrape reads the age histograms from a scrape in the text format.
func parseScrape(r io.Reader) (scraped, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return scraped{}, fmt.Errorf("metrics: %w", err)
	}
	return scraped{
		consumers: parseAges(fams[ageMetric], func(l map[string]string) string { return l["idem_consumer_name"] }),
		routes: parseAges(fams[replayAgeMetric], func(l map[string]string) string {
			return l["http_request_method"] + " " + l["http_route"]
		}),
	}, nil
}

// parseAges sums a histogram family's series by the name that of their
// labels gives.
func parseAges(fam *dto.MetricFamily, of func(labels map[string]string) string) map[string]ages {
	out := map[string]ages{}
	if fam == nil || fam.GetType() != dto.MetricType_HISTOGRAM {
		return out
	}
	for _, m := range fam.GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		name := of(labels)
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
	return out
}

type retentionJSON struct {
	Scope string `json:"scope"`
	// Kind is "consumer", or "http" for a scope of HTTP Idempotency-Keys
	// (its rows hold requests' states), whose duplicates are retries
	// answered with the stored response.
	Kind         string  `json:"kind"`
	RetentionSec float64 `json:"retention_seconds"` // 0 with forever
	Forever      bool    `json:"forever"`
	Duplicates   uint64  `json:"duplicates"`       // seen by the consumer, or the retries the HTTP service replayed, from its metrics
	P999Sec      float64 `json:"p999_age_seconds"` // the bucket bound; -1 for over the last bound
	Advice       string  `json:"advice"`           // ok, too_short, no_data
	AdviceText   string  `json:"advice_text"`
}

func runRetention(ctx context.Context, e *env, fs *flag.FlagSet, args []string) int {
	var sf storeFlags
	sf.register(fs, e)
	metrics := new(string)
	registerSecret(fs, e, metrics, "metrics", "IDEM_METRICS_URL", "a consumer's or an HTTP service's Prometheus endpoint, e.g. http://host:9464/metrics")
	margin := fs.Float64("margin", 2, "retention should be at least this many times the 99.9th percentile of duplicate ages")
	admin, closeStore, code, ok := sf.parseOpen(ctx, e, fs, args, false)
	if !ok {
		return code
	}
	defer closeStore()
	sum, err := admin.Summary(ctx)
	if err != nil {
		return fail(e, err)
	}
	var hist scraped
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
		fmt.Fprintln(tw, "SCOPE\tKIND\tRETENTION\tDUPLICATES\tP99.9 AGE\tADVICE")
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
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s: %s\n", inert(r.Scope), r.Kind, ret, r.Duplicates, p, r.Advice, r.AdviceText)
		}
		tw.Flush()
	}
	if short {
		return exitPartial
	}
	return exitOK
}

// words are how retention's advice speaks of a kind of scope.
type words struct {
	dups, noMetrics, noneYet, setting string
}

var (
	consumerWords = words{
		dups:      "duplicates",
		noMetrics: "no duplicate ages: run with --metrics URL of a consumer instrumented with consumer/otelconsumer (or compare Stats().DuplicateAge.Quantile(0.999) yourself)",
		noneYet:   "the consumer has seen no duplicates yet",
	}
	httpWords = words{
		dups:      "retries",
		noMetrics: "no retry ages: run with --metrics URL of an HTTP service whose httpidem middleware has an httpidem/otelhttpidem Observer (idem_http_replay_age_seconds)",
		noneYet:   "no retry with this scope's keys was answered from a stored response yet",
		setting:   " (httpidem.Route.Retention)",
	}
)

// scopeTotal is a scope's rows over their outcomes.
type scopeTotal struct {
	dedup.ScopeSummary
}

func (s scopeTotal) http() bool { return s.Processing+s.Finished > 0 }

func (s scopeTotal) kind() string {
	if s.http() {
		return "http"
	}
	return "consumer"
}

// scopeTotals adds up each scope's rows: its retention, the longest
// written or for ever, and its requests' states.
func scopeTotals(sum []dedup.ScopeSummary) map[string]scopeTotal {
	scopes := map[string]scopeTotal{}
	for _, s := range sum {
		cur := scopes[s.Scope]
		cur.Scope = s.Scope
		cur.Rows += s.Rows
		cur.Forever = cur.Forever || s.Forever
		cur.Retention = max(cur.Retention, s.Retention)
		cur.Processing += s.Processing
		cur.Finished += s.Finished
		cur.Stuck += s.Stuck
		scopes[s.Scope] = cur
	}
	return scopes
}

// adviseRetention compares each scope's retention (from its rows) with the
// ages at which its duplicates arrived (hist: a consumer's by its name, an
// HTTP scope's retries by route; metricsGiven: hist was scraped): idem
// retention's advice, the console's too. short reports a scope whose
// retention is below the margin.
func adviseRetention(sum []dedup.ScopeSummary, hist scraped, metricsGiven bool, margin float64) (out []retentionJSON, short bool) {
	scopes := scopeTotals(sum)
	for _, name := range sortedKeys(scopes) {
		s := scopes[name]
		r := retentionJSON{Scope: name, Kind: s.kind(), RetentionSec: s.Retention.Seconds(), Forever: s.Forever}
		a, seen, w := hist.agesOf(s)
		r.Duplicates = a.total()
		p := a.quantile(0.999)
		r.P999Sec = p
		if math.IsInf(p, 1) {
			r.P999Sec = -1
		}
		switch {
		case !metricsGiven:
			r.Advice, r.AdviceText = "no_data", w.noMetrics
		case !seen || r.Duplicates == 0:
			r.Advice, r.AdviceText = "no_data", w.noneYet
		case s.Forever:
			r.Advice, r.AdviceText = "ok", "kept for ever"
		case math.IsInf(p, 1) || s.Retention.Seconds() < margin*p:
			short = true
			r.Advice = "too_short"
			if math.IsInf(p, 1) {
				r.AdviceText = fmt.Sprintf("%s arrive later than %s (the last bucket): keep the keys for ever, or for months", w.dups, duration(time.Duration(a.bounds[len(a.bounds)-2])*time.Second))
			} else {
				r.AdviceText = fmt.Sprintf("99.9%% of %s arrive within %s: keep keys at least %s (×%g)%s", w.dups, duration(time.Duration(p)*time.Second), duration(time.Duration(margin*p)*time.Second), margin, w.setting)
			}
		default:
			r.Advice, r.AdviceText = "ok", fmt.Sprintf("99.9%% of %s arrive within %s", w.dups, duration(time.Duration(p)*time.Second))
		}
		out = append(out, r)
	}
	return out, short
}

// agesOf is the age histogram of scope s's duplicates — a consumer's
// (scope Name/tenant), or an HTTP scope's retries (METHOD route#tenant) —
// whether the scrape had it, and the words its advice takes.
func (h scraped) agesOf(s scopeTotal) (ages, bool, words) {
	if s.http() {
		route, _, _ := strings.Cut(s.Scope, "#")
		a, seen := h.routes[route]
		return a, seen, httpWords
	}
	name, _, _ := strings.Cut(s.Scope, "/")
	a, seen := h.consumers[name]
	return a, seen, consumerWords
}
