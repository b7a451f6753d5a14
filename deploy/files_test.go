package deploy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"text/template"
	"unicode"

	"github.com/prometheus/common/model"
	"go.yaml.in/yaml/v3"
)

// The files checked, from this directory.
const (
	alertsFile    = "prometheus/alerts.yml"
	dashboardFile = "grafana/idem.json"
)

// ruleFile is a Prometheus rule file: what the check reads of it.
type ruleFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Expr        string            `yaml:"expr"`
			For         string            `yaml:"for"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

var severities = []string{"critical", "warning", "info"}

// checkAlerts checks every rule of the alerts file against ex: its
// expression (checkExpr), a for:, a severity, a summary, a description
// and a runbook_url into docs/ whose section exists, annotations that
// parse as Prometheus templates and name only labels the expression keeps.
// It returns how many expressions it checked.
func checkAlerts(ex exported) (int, error) {
	b, err := os.ReadFile(alertsFile)
	if err != nil {
		return 0, err
	}
	var rf ruleFile
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&rf); err != nil {
		return 0, fmt.Errorf("%s: %w", alertsFile, err)
	}
	var errs []error
	n := 0
	names := map[string]bool{}
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			fail := func(format string, args ...any) {
				errs = append(errs, fmt.Errorf("%s: %s: %s", alertsFile, r.Alert, fmt.Sprintf(format, args...)))
			}
			if r.Alert == "" {
				fail("a rule that is not an alert")
				continue
			}
			if names[r.Alert] {
				fail("named twice")
			}
			names[r.Alert] = true
			n++
			e, err := parseExpr(r.Expr)
			if err != nil {
				fail("%v", err)
				continue
			}
			var bad []error
			out := labelsOf(e, ex, &bad)
			for _, err := range bad {
				fail("%v", err)
			}
			if d, err := model.ParseDuration(r.For); err != nil || d <= 0 {
				fail("for: %q: want a duration (%v)", r.For, err)
			}
			if !slices.Contains(severities, r.Labels["severity"]) {
				fail("severity %q: want one of %v", r.Labels["severity"], severities)
			}
			for _, a := range []string{"summary", "description", "runbook_url"} {
				if strings.TrimSpace(r.Annotations[a]) == "" {
					fail("no %s annotation", a)
				}
			}
			if err := checkDocLink(r.Annotations["runbook_url"]); err != nil {
				fail("runbook_url: %v", err)
			}
			for k, v := range r.Annotations {
				if out == nil {
					break
				}
				if err := checkTemplate(v, out); err != nil {
					fail("annotation %s: %v", k, err)
				}
			}
		}
	}
	return n, errors.Join(errs...)
}

// checkTemplate runs an annotation as Prometheus would, with $labels
// holding only the labels the alert's expression keeps: a label it does
// not keep is an error, and so is a template that does not parse.
func checkTemplate(text string, out labelSet) error {
	funcs := template.FuncMap{}
	for _, f := range []string{"humanize", "humanize1024", "humanizeDuration", "humanizePercentage", "humanizeTimestamp", "title", "toUpper", "toLower"} {
		funcs[f] = func(v any) string { return fmt.Sprint(v) }
	}
	// Prometheus' prefix (rules/alerting.go): the variables annotations use.
	const defs = "{{$labels := .Labels}}{{$externalLabels := .ExternalLabels}}{{$externalURL := .ExternalURL}}{{$value := .Value}}"
	tmpl, err := template.New("annotation").Funcs(funcs).Option("missingkey=error").Parse(defs + text)
	if err != nil {
		return err
	}
	lbls := map[string]string{}
	for k := range out {
		lbls[k] = k
	}
	data := map[string]any{"Labels": lbls, "ExternalLabels": map[string]string{}, "ExternalURL": "", "Value": 1.0}
	return tmpl.Execute(io.Discard, data)
}

// checkDocLink checks that link, docs/FILE.md#section, names a section of
// a page in the repository's docs/.
func checkDocLink(link string) error {
	page, anchor, ok := strings.Cut(link, "#")
	if !ok || !strings.HasPrefix(page, "docs/") {
		return fmt.Errorf("%q: want docs/PAGE.md#section", link)
	}
	b, err := os.ReadFile(filepath.Join("..", page))
	if err != nil {
		return err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if h, ok := strings.CutPrefix(strings.TrimLeft(line, "#"), " "); ok && strings.HasPrefix(line, "#") && slug(h) == anchor {
			return nil
		}
	}
	return fmt.Errorf("%q: %s has no section #%s", link, page, anchor)
}

// slug is a heading's anchor as GitHub makes it.
func slug(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// labelValues is a Grafana variable's query label_values(selector, label).
var labelValues = regexp.MustCompile(`^label_values\((.+),\s*(\w+)\)$`)

// legendLabel is a label a legend names: {{label}}.
var legendLabel = regexp.MustCompile(`\{\{\s*(\w+)\s*\}\}`)

// checkDashboard checks the dashboard against ex: every target's
// expression (checkExpr, Grafana's variables expanded), the labels its
// legend names, every variable's label_values query; every panel and
// target reads the datasource variable; no URL is written in it. It
// returns how many expressions it checked.
func checkDashboard(ex exported) (int, error) {
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		return 0, err
	}
	var dash struct {
		Panels     []panel `json:"panels"`
		Templating struct {
			List []struct {
				Name  string `json:"name"`
				Type  string `json:"type"`
				Query any    `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		return 0, fmt.Errorf("%s: %w", dashboardFile, err)
	}
	var errs []error
	fail := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", dashboardFile, fmt.Sprintf(format, args...)))
	}
	if bytes.Contains(b, []byte("://")) {
		fail("a URL is written in it")
	}
	n := 0
	vars := map[string]bool{}
	for _, v := range dash.Templating.List {
		vars[v.Name] = true
		if v.Type != "query" {
			continue
		}
		q, _ := v.Query.(string)
		if m, ok := v.Query.(map[string]any); ok {
			q, _ = m["query"].(string)
		}
		n++
		m := labelValues.FindStringSubmatch(q)
		if m == nil {
			fail("variable %s: %q is not label_values(selector, label)", v.Name, q)
			continue
		}
		e, err := parseExpr(expandGrafana(m[1]))
		if err != nil {
			fail("variable %s: %v", v.Name, err)
			continue
		}
		var bad []error
		if out := labelsOf(e, ex, &bad); out != nil && !out[m[2]] {
			bad = append(bad, fmt.Errorf("%s has no label %s (it has %s)", m[1], m[2], out))
		}
		for _, err := range bad {
			fail("variable %s: %v", v.Name, err)
		}
	}
	if !vars["datasource"] {
		fail("no datasource variable")
	}
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			walk(p.Panels)
			if p.Type == "row" {
				continue
			}
			if p.Datasource.UID != "${datasource}" {
				fail("panel %q: datasource %q, want ${datasource}", p.Title, p.Datasource.UID)
			}
			if len(p.Targets) == 0 {
				fail("panel %q: no target", p.Title)
			}
			for _, tg := range p.Targets {
				n++
				if tg.Datasource.UID != "${datasource}" {
					fail("panel %q, %s: datasource %q, want ${datasource}", p.Title, tg.RefID, tg.Datasource.UID)
				}
				e, err := parseExpr(expandGrafana(tg.Expr))
				if err != nil {
					fail("panel %q, %s: %v", p.Title, tg.RefID, err)
					continue
				}
				var bad []error
				out := labelsOf(e, ex, &bad)
				for _, m := range legendLabel.FindAllStringSubmatch(tg.LegendFormat, -1) {
					if out != nil && !out[m[1]] {
						bad = append(bad, fmt.Errorf("legend {{%s}}: the expression keeps %s", m[1], out))
					}
				}
				for _, err := range bad {
					fail("panel %q, %s: %v", p.Title, tg.RefID, err)
				}
			}
		}
	}
	walk(dash.Panels)
	return n, errors.Join(errs...)
}

// panel is what the check reads of a Grafana panel.
type panel struct {
	Type       string `json:"type"`
	Title      string `json:"title"`
	Datasource struct {
		UID string `json:"uid"`
	} `json:"datasource"`
	Targets []struct {
		Expr         string `json:"expr"`
		LegendFormat string `json:"legendFormat"`
		RefID        string `json:"refId"`
		Datasource   struct {
			UID string `json:"uid"`
		} `json:"datasource"`
	} `json:"targets"`
	Panels []panel `json:"panels"`
}
