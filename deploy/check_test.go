package deploy

import (
	"errors"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"

	"github.com/idemkit/idem/internal/testenv/promtest"
)

// scrapeLabels are the labels Prometheus adds to every series it scrapes:
// an expression may match and group by them though no exporter writes them.
var scrapeLabels = []string{"job", "instance"}

// exported are the series names a scrape lets a selector name — a
// histogram's _bucket, _sum and _count, never its bare name — each with
// its labels and the values each label takes.
type exported map[string]map[string]map[string]bool

// exportedBy lists what fams export under Prometheus' names.
func exportedBy(fams map[string]*dto.MetricFamily) exported {
	ex := exported{}
	add := func(name string, m *dto.Metric, extra ...string) {
		ls := ex[name]
		if ls == nil {
			ls = map[string]map[string]bool{}
			for _, l := range scrapeLabels {
				ls[l] = nil // any value
			}
			ex[name] = ls
		}
		set := func(k, v string) {
			if ls[k] == nil {
				ls[k] = map[string]bool{}
			}
			ls[k][v] = true
		}
		for _, l := range m.GetLabel() {
			set(l.GetName(), l.GetValue())
		}
		for i := 0; i+1 < len(extra); i += 2 {
			set(extra[i], extra[i+1])
		}
	}
	for name, f := range fams {
		for _, m := range f.GetMetric() {
			switch f.GetType() {
			case dto.MetricType_HISTOGRAM:
				for _, b := range m.GetHistogram().GetBucket() {
					add(name+"_bucket", m, "le", formatFloat(b.GetUpperBound()))
				}
				add(name+"_bucket", m, "le", "+Inf")
				add(name+"_sum", m)
				add(name+"_count", m)
			case dto.MetricType_SUMMARY:
				for _, q := range m.GetSummary().GetQuantile() {
					add(name, m, "quantile", formatFloat(q.GetQuantile()))
				}
				add(name+"_sum", m)
				add(name+"_count", m)
			default:
				add(name, m)
			}
		}
	}
	return ex
}

// formatFloat writes a bound as the text format does (Prometheus 3 stores
// it as 86400.0; match le with =~"86400(\\.0)?" to read both).
func formatFloat(f float64) string {
	if math.IsInf(f, 1) {
		return "+Inf"
	}
	return strconv.FormatFloat(f, 'g', -1, 64)
}

// grafanaVars are Grafana's variables in an expression: $name, ${name} and
// ${name:format}; the interval ones ($__rate_interval) stand for a range.
var (
	grafanaRange = regexp.MustCompile(`\$__(rate_interval|interval|range)\b|\$\{__(rate_interval|interval|range)\}`)
	grafanaVar   = regexp.MustCompile(`\$\{\w+(:\w+)?\}|\$\w+`)
)

// expandGrafana replaces Grafana's variables with what the parser takes:
// a range of 5m, and .* for a variable (which stands in regex matchers).
func expandGrafana(expr string) string {
	return grafanaVar.ReplaceAllString(grafanaRange.ReplaceAllString(expr, "5m"), ".*")
}

// checkExpr parses expr with Prometheus' parser and checks it against ex:
// each selector names an exported series; each label a matcher, a by or
// without, an on or ignoring or a group_left names exists where it is
// used (on the series, or on what the expression below keeps of them);
// an = or != matcher's value is one the label takes, an =~ matches one.
func checkExpr(expr string, ex exported) error {
	e, err := parseExpr(expr)
	if err != nil {
		return err
	}
	var errs []error
	labelsOf(e, ex, &errs)
	return errors.Join(errs...)
}

// parseExpr parses PromQL with Prometheus' parser, as Prometheus does
// with its default features.
func parseExpr(expr string) (parser.Expr, error) {
	return parser.NewParser(parser.Options{}).ParseExpr(expr)
}

// labelSet is the labels an expression's result may carry; nil when
// unknown, below a selector already found wrong (whose errors are enough).
type labelSet map[string]bool

func (s labelSet) missing(names []string) []string {
	if s == nil {
		return nil
	}
	var out []string
	for _, n := range names {
		if !s[n] {
			out = append(out, n)
		}
	}
	return out
}

func (s labelSet) String() string {
	var ks []string
	for k := range s {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return "{" + strings.Join(ks, ", ") + "}"
}

// labelsOf returns the labels e's result may carry, appending to errs what
// it finds wrong.
func labelsOf(e parser.Node, ex exported, errs *[]error) labelSet {
	switch e := e.(type) {
	case *parser.VectorSelector:
		return selectorLabels(e, ex, errs)
	case *parser.MatrixSelector:
		return labelsOf(e.VectorSelector, ex, errs)
	case *parser.SubqueryExpr:
		return labelsOf(e.Expr, ex, errs)
	case *parser.ParenExpr:
		return labelsOf(e.Expr, ex, errs)
	case *parser.UnaryExpr:
		return labelsOf(e.Expr, ex, errs)
	case *parser.StepInvariantExpr:
		return labelsOf(e.Expr, ex, errs)
	case *parser.NumberLiteral, *parser.StringLiteral:
		return labelSet{}
	case *parser.Call:
		var in labelSet
		vector := false
		for _, a := range e.Args {
			l := labelsOf(a, ex, errs)
			if !vector && a.Type() != parser.ValueTypeScalar && a.Type() != parser.ValueTypeString {
				in, vector = l, true
			}
		}
		if vector && in == nil {
			return nil
		}
		out := labelSet{}
		for k := range in {
			out[k] = true
		}
		switch e.Func.Name {
		case "histogram_quantile":
			if !in["le"] {
				*errs = append(*errs, fmt.Errorf("%s: no le label under it (a _bucket series, kept by the sum?)", e))
			}
			delete(out, "le")
		case "label_replace", "label_join":
			if s, ok := e.Args[1].(*parser.StringLiteral); ok {
				out[s.Val] = true
			}
		}
		return out
	case *parser.AggregateExpr:
		if e.Param != nil {
			labelsOf(e.Param, ex, errs)
		}
		in := labelsOf(e.Expr, ex, errs)
		if m := in.missing(e.Grouping); len(m) > 0 {
			*errs = append(*errs, fmt.Errorf("%s: grouping by %v, which %s does not have (it has %s)", e, m, e.Expr, in))
		}
		if in == nil && e.Without {
			return nil
		}
		out := labelSet{}
		if e.Without {
			for k := range in {
				if !slices.Contains(e.Grouping, k) {
					out[k] = true
				}
			}
		} else {
			for _, g := range e.Grouping {
				out[g] = true
			}
		}
		if e.Op == parser.COUNT_VALUES {
			if s, ok := e.Param.(*parser.StringLiteral); ok {
				out[s.Val] = true
			}
		}
		return out
	case *parser.BinaryExpr:
		lhs, rhs := labelsOf(e.LHS, ex, errs), labelsOf(e.RHS, ex, errs)
		vm := e.VectorMatching
		if vm == nil || e.LHS.Type() != parser.ValueTypeVector || e.RHS.Type() != parser.ValueTypeVector {
			if e.LHS.Type() == parser.ValueTypeVector {
				return lhs
			}
			return rhs
		}
		for side, ls := range map[string]labelSet{"left": lhs, "right": rhs} {
			if m := ls.missing(vm.MatchingLabels); len(m) > 0 {
				*errs = append(*errs, fmt.Errorf("%s: matching on %v, which its %s side does not have (it has %s)", e, m, side, ls))
			}
		}
		if lhs == nil || rhs == nil {
			return nil
		}
		switch vm.Card {
		case parser.CardManyToMany: // and, or, unless
			if e.Op == parser.LOR {
				for k := range rhs {
					lhs[k] = true
				}
			}
			return lhs
		case parser.CardManyToOne:
			if m := rhs.missing(vm.Include); len(m) > 0 {
				*errs = append(*errs, fmt.Errorf("%s: group_left(%v), which its right side does not have", e, m))
			}
			for _, k := range vm.Include {
				lhs[k] = true
			}
			return lhs
		case parser.CardOneToMany:
			if m := lhs.missing(vm.Include); len(m) > 0 {
				*errs = append(*errs, fmt.Errorf("%s: group_right(%v), which its left side does not have", e, m))
			}
			for _, k := range vm.Include {
				rhs[k] = true
			}
			return rhs
		}
		// One to one: on keeps the matching labels, ignoring drops them.
		out := labelSet{}
		for k := range lhs {
			if slices.Contains(vm.MatchingLabels, k) == vm.On {
				out[k] = true
			}
		}
		return out
	}
	*errs = append(*errs, fmt.Errorf("%s: a %T, which the check does not know", e, e))
	return nil
}

// selectorLabels checks a selector against ex and returns its series'
// labels.
func selectorLabels(vs *parser.VectorSelector, ex exported, errs *[]error) labelSet {
	name := vs.Name
	for _, m := range vs.LabelMatchers {
		if m.Name == labels.MetricName && m.Type == labels.MatchEqual {
			name = m.Value
		}
	}
	if name == "" {
		*errs = append(*errs, fmt.Errorf("%s: no metric name", vs))
		return nil
	}
	ls, ok := ex[name]
	if !ok {
		*errs = append(*errs, fmt.Errorf("%s: no series %s in the scrape%s", vs, name, nearest(name, ex)))
		return nil
	}
	out := labelSet{}
	for k := range ls {
		out[k] = true
	}
	for _, m := range vs.LabelMatchers {
		if m.Name == labels.MetricName {
			continue
		}
		values, ok := ls[m.Name]
		if !ok {
			*errs = append(*errs, fmt.Errorf("%s: %s has no label %s (it has %s)", vs, name, m.Name, out))
			continue
		}
		if values == nil { // a label the scrape adds: any value
			continue
		}
		switch m.Type {
		case labels.MatchEqual, labels.MatchNotEqual:
			if !values[m.Value] {
				*errs = append(*errs, fmt.Errorf("%s: %s's label %s never is %q (it is %s)", vs, name, m.Name, m.Value, valueList(values)))
			}
		case labels.MatchRegexp:
			if !slices.ContainsFunc(slices.Collect(mapKeys(values)), m.Matches) {
				*errs = append(*errs, fmt.Errorf("%s: %s's label %s has no value matching %q (it is %s)", vs, name, m.Name, m.Value, valueList(values)))
			}
		}
	}
	return out
}

func mapKeys(m map[string]bool) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

func valueList(values map[string]bool) string {
	vs := slices.Sorted(mapKeys(values))
	return strings.Join(vs, ", ")
}

// nearest names the exported series that share name's first words, to
// make a wrong suffix plain.
func nearest(name string, ex exported) string {
	var near []string
	stem := name
	if i := strings.LastIndex(stem, "_"); i > 0 {
		stem = stem[:i]
	}
	for n := range ex {
		if strings.HasPrefix(n, stem) {
			near = append(near, n)
		}
	}
	if len(near) == 0 {
		return ""
	}
	slices.Sort(near)
	return " (there are " + strings.Join(near, ", ") + ")"
}

// sample is a scrape in the exporter's form: a counter with a label
// whose values are listed at zero, a histogram, a gauge.
const sample = `# TYPE idem_consumer_dead_letters_total counter
idem_consumer_dead_letters_total{idem_consumer_name="payments",idem_dead_letter_cause="bad_input"} 1
idem_consumer_dead_letters_total{idem_consumer_name="payments",idem_dead_letter_cause="failed_before"} 0
# TYPE idem_consumer_fetch_to_ack_duration_seconds histogram
idem_consumer_fetch_to_ack_duration_seconds_bucket{idem_consumer_name="payments",le="0.5"} 3
idem_consumer_fetch_to_ack_duration_seconds_bucket{idem_consumer_name="payments",le="+Inf"} 4
idem_consumer_fetch_to_ack_duration_seconds_sum{idem_consumer_name="payments"} 1.5
idem_consumer_fetch_to_ack_duration_seconds_count{idem_consumer_name="payments"} 4
# TYPE idem_outbox_pending gauge
idem_outbox_pending{idem_outbox_table="public.idem_outbox"} 2
`

// TestCheckExprRejects: the check passes what the sample exports and
// rejects a wrong metric name, a wrong suffix, a wrong label in a matcher,
// a grouping or a matching, a label the expression below dropped, and a
// label value the metric never has.
func TestCheckExprRejects(t *testing.T) {
	fams, err := promtest.Parse(sample)
	if err != nil {
		t.Fatal(err)
	}
	ex := exportedBy(fams)
	for _, expr := range []string{
		`sum by (idem_consumer_name, idem_dead_letter_cause) (increase(idem_consumer_dead_letters_total{idem_dead_letter_cause!="failed_before"}[10m])) > 0`,
		`histogram_quantile(0.99, sum by (job, le) (rate(idem_consumer_fetch_to_ack_duration_seconds_bucket{idem_consumer_name=~"$consumer"}[$__rate_interval])))`,
		`rate(idem_consumer_fetch_to_ack_duration_seconds_sum[5m]) / rate(idem_consumer_fetch_to_ack_duration_seconds_count[5m])`,
		`idem_outbox_pending > 0 and on (instance, idem_outbox_table) idem_outbox_pending`,
		`sum without (idem_dead_letter_cause) (idem_consumer_dead_letters_total) / on (idem_consumer_name) group_left sum by (idem_consumer_name) (idem_consumer_dead_letters_total)`,
		`idem_consumer_fetch_to_ack_duration_seconds_bucket{le=~"0.5(\\.0)?"}`,
	} {
		if err := checkExpr(expandGrafana(expr), ex); err != nil {
			t.Errorf("%s: %v", expr, err)
		}
	}
	for _, c := range []struct{ what, expr, want string }{
		{"a wrong metric name", `rate(idem_consumer_dead_letter_total[5m])`, "no series idem_consumer_dead_letter_total"},
		{"a counter without _total", `rate(idem_consumer_dead_letters[5m])`, "no series idem_consumer_dead_letters "},
		{"a histogram's bare name", `rate(idem_consumer_fetch_to_ack_duration_seconds[5m])`, "there are idem_consumer_fetch_to_ack_duration_seconds_bucket"},
		{"a _bucket of a counter", `idem_consumer_dead_letters_total_bucket`, "no series"},
		{"the unit left out", `idem_consumer_fetch_to_ack_duration_bucket`, "no series"},
		{"a wrong label in a matcher", `idem_outbox_pending{idem_outbox_name="x"}`, "has no label idem_outbox_name"},
		{"a wrong label in by", `sum by (cause) (idem_consumer_dead_letters_total)`, "grouping by [cause]"},
		{"a wrong label in without", `sum without (cause) (idem_consumer_dead_letters_total)`, "grouping by [cause]"},
		{"a label the sum dropped", `max by (idem_dead_letter_cause) (sum by (idem_consumer_name) (idem_consumer_dead_letters_total))`, "grouping by [idem_dead_letter_cause]"},
		{"histogram_quantile without le", `histogram_quantile(0.99, sum by (idem_consumer_name) (rate(idem_consumer_fetch_to_ack_duration_seconds_bucket[5m])))`, "no le label"},
		{"a wrong label in on", `idem_outbox_pending and on (idem_consumer_name) idem_consumer_dead_letters_total`, "matching on [idem_consumer_name]"},
		{"a label value never exported", `idem_consumer_dead_letters_total{idem_dead_letter_cause!="failed"}`, `never is "failed"`},
		{"a regex matching no value", `idem_consumer_fetch_to_ack_duration_seconds_bucket{le=~"86400(\\.0)?"}`, "no value matching"},
		{"not PromQL", `sum by (idem_consumer_name (idem_outbox_pending)`, "unexpected"},
	} {
		err := checkExpr(expandGrafana(c.expr), ex)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %s: %v, want an error with %q", c.what, c.expr, err, c.want)
		}
	}
}
