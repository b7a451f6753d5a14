package main

import (
	"bytes"
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"html/template"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/idemkit/idem/cmd/idem/internal/redrive"
	"github.com/idemkit/idem/dedup"
)

//go:embed console.html
var consoleHTML string

var consoleTemplates = template.Must(template.New("console").Funcs(template.FuncMap{
	"age":       age,
	"inert":     inert,
	"duration":  duration,
	"oneLine":   oneLine,
	"stepState": stepState,
	"utc":       func(t time.Time) string { return t.UTC().Format(time.RFC3339) },
}).Parse(consoleHTML))

// The console's limits.
const (
	consolePending    = 1000             // unconfirmed actions kept at most
	consoleConfirmTTL = 10 * time.Minute // an unconfirmed action is forgotten after this
	consoleCookie     = "idem_console"
)

// console is `idem console`: the store and the dead-letter topic in a
// browser. A GET never writes: an action's GET shows its dry run and
// keeps the action, bound to what it showed, under a one-time token that
// the confirmation POST carries.
type console struct {
	admin   dedup.Admin
	reqs    requestAdmin
	journal dedup.Journal // the effect journal's unresolved steps (effects.go)
	// broker, topic, group, max, maxRedrives: the dead-letter topic, as
	// idem redrive's flags; broker nil without one.
	broker           redrive.Broker
	topic, group     string
	max, maxRedrives int
	metrics          string // a consumer's /metrics; empty: no duplicate ages
	margin           float64
	auth             *consoleAuth    // every request's token (console_auth.go)
	metricsOut       *consoleMetrics // the actions executed, on /metrics (audit.go)
	checkHost        bool            // only loopback names in Host (DNS rebinding)

	mu      sync.Mutex
	pending map[string]pendingAction
}

// pendingAction is an action shown by its dry run and not confirmed yet.
type pendingAction struct {
	kind    string        // "release", "release-request", "redrive", "resolve-step"
	keys    []dedup.Key   // release: the failed keys shown; release-request, resolve-step: one
	lease   int64         // release-request: the lease token shown
	step    *resolvePlan  // resolve-step: the plan shown, its token the step's as read
	plan    *redrive.Plan // redrive: the plan shown, executed as shown or refused as stale
	shown   string        // release: the digest of the rows shown (rowsDigest)
	session string        // who saw the dry run: only they confirm it
	expires time.Time
}

func runConsole(ctx context.Context, e *env, fs *flag.FlagSet, args []string) int {
	var sf storeFlags
	sf.register(fs, e)
	addr := fs.String("addr", "127.0.0.1:7464", "listen on host:port; off loopback, --token is required")
	tokenName := fs.String("token-name", or(e.getenv("IDEM_CONSOLE_TOKEN_NAME"), "console"), "who the token is, as the audit log records its actions (env IDEM_CONSOLE_TOKEN_NAME)")
	secureCookie := fs.Bool("secure-cookie", false, "behind an HTTPS proxy: the session cookie is Secure and named __Host-idem_console")
	token, metrics := new(string), new(string)
	registerSecret(fs, e, token, "token", "IDEM_CONSOLE_TOKEN", "require this token of every request: open the console once with ?token=…")
	registerSecret(fs, e, metrics, "metrics", "IDEM_METRICS_URL", "a consumer's Prometheus endpoint for the duplicate ages, as idem retention")
	margin := fs.Float64("margin", 2, "retention should be at least this many times the 99.9th percentile of duplicate ages")
	var f redriveFlags
	fs.StringVar(&f.broker, "broker", "", "the dead-letter topic's broker: kafka or rocketmq (as idem redrive)")
	fs.StringVar(&f.brokers, "brokers", e.getenv("IDEM_KAFKA_BROKERS"), "Kafka brokers (env IDEM_KAFKA_BROKERS)")
	fs.StringVar(&f.namesrv, "namesrv", e.getenv("IDEM_ROCKETMQ_NAMESRV"), "RocketMQ name servers (env IDEM_ROCKETMQ_NAMESRV)")
	fs.StringVar(&f.topic, "topic", "", "the dead-letter topic; without it, no dead letters")
	fs.StringVar(&f.group, "group", redrive.DefaultGroup, "the redrive's consumer group (as idem redrive)")
	fs.IntVar(&f.max, "max", 1000, "show and redrive at most this many letters at once")
	fs.IntVar(&f.maxRedrives, "max-redrives", redrive.DefaultMaxRedrives, "refuse a letter redriven this many times already")
	fs.DurationVar(&f.timeout, "timeout", 10*time.Second, "bound of one broker request")
	if _, code, ok := parse(fs, args); !ok {
		return code
	}
	if _, _, err := net.SplitHostPort(*addr); err != nil {
		return usageErr(e, fs, "--addr: want host:port")
	}
	if f.max < 1 || f.maxRedrives < 1 {
		return usageErr(e, fs, "--max and --max-redrives must be positive")
	}
	if *token != "" {
		if err := checkToken(*token); err != nil {
			return usageErr(e, fs, "%v", err)
		}
	}
	c := &console{topic: f.topic, group: f.group, max: f.max, maxRedrives: f.maxRedrives,
		metrics: *metrics, margin: *margin}
	if f.topic != "" {
		broker, code, ok := f.chooseBroker(e, fs)
		if !ok {
			return code
		}
		c.broker = broker
	}
	st, err := sf.openStore(ctx, false)
	if err != nil {
		return fail(e, err)
	}
	defer st.close()
	c.admin, c.reqs, c.journal = st.admin, st.reqs, st.journal
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return fail(e, err)
	}
	defer ln.Close()
	// Loopback is what the listener got, not what --addr's name says:
	// DNS chooses where a name binds.
	bound := ln.Addr().(*net.TCPAddr)
	c.checkHost = bound.IP.IsLoopback()
	generated := false
	if *token == "" {
		if !c.checkHost {
			return usageErr(e, fs, "--addr binds %s, not loopback: set --token-file or IDEM_CONSOLE_TOKEN", bound.IP)
		}
		*token, generated = newToken(), true
	}
	if c.auth, err = newConsoleAuth(*token, *tokenName, strconv.Itoa(bound.Port), *secureCookie, slog.New(slog.NewTextHandler(e.stderr, nil))); err != nil {
		return usageErr(e, fs, "%v", err)
	}
	srv := newConsoleServer(c.handler())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	if generated {
		// Printed once, as Jupyter does: the first visit trades it for a
		// session cookie and takes it out of the address bar.
		fmt.Fprintf(e.stderr, "idem console: http://%s/?token=%s\n", ln.Addr(), *token)
	} else {
		fmt.Fprintf(e.stderr, "idem console: http://%s/ (open it once with ?token=TOKEN)\n", ln.Addr())
	}
	select {
	case err := <-done:
		return fail(e, err)
	case <-ctx.Done():
	}
	shutCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = srv.Shutdown(shutCtx)
	return exitOK
}

// isLoopbackName reports whether a host (of --addr, or of a Host header)
// names the loopback interface.
func isLoopbackName(host string) bool {
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return true
	}
	ip := net.ParseIP(strings.Trim(host, "[]"))
	return ip != nil && ip.IsLoopback()
}

// handler is the console's: its pages behind Go's cross-origin protection
// (a POST from another origin is refused), the Host check and the token.
func (c *console) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", c.overview)
	mux.HandleFunc("GET /failed", c.failed)
	mux.HandleFunc("GET /release", c.releaseDryRun)
	mux.HandleFunc("GET /stuck", c.stuck)
	mux.HandleFunc("GET /release-request", c.releaseRequestDryRun)
	mux.HandleFunc("GET /letters", c.letters)
	mux.HandleFunc("GET /redrive", c.redriveDryRun)
	mux.HandleFunc("GET /effects", c.effects)
	mux.HandleFunc("GET /resolve-step", c.resolveStepDryRun)
	mux.HandleFunc("GET /stale", c.stale)
	mux.HandleFunc("GET /parked", c.parked)
	mux.HandleFunc("POST /confirm", c.confirm)
	mux.HandleFunc("GET /audit", c.auditPage)
	mux.Handle("GET /metrics", c.metricsHandler())
	return c.guard(http.NewCrossOriginProtection().Handler(mux))
}

// keep stores a dry run's action for the session that saw it and returns
// its one-time token. A session keeps at most consolePerSession actions
// and the console consolePending: past either, the oldest is forgotten.
// Only an authenticated request from the console's pages, the address
// bar or a client that is not a browser reaches here (mayKeep): another
// page, even on another port of the same host (the same site, so the
// SameSite=Strict cookie goes with its requests), cannot fill the map.
// Without mayKeep it keeps nothing and returns "" (see unconfirmable).
func (c *console) keep(r *http.Request, a pendingAction) string {
	if !mayKeep(r) {
		return ""
	}
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	tok := hex.EncodeToString(b)
	now := time.Now()
	a.expires = now.Add(consoleConfirmTTL)
	a.session = sessionOf(r)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.pending == nil {
		c.pending = map[string]pendingAction{}
	}
	oldest := func(of func(pendingAction) bool) (string, int) {
		var k string
		n := 0
		for t, p := range c.pending {
			if !of(p) {
				continue
			}
			n++
			if k == "" || p.expires.Before(c.pending[k].expires) {
				k = t
			}
		}
		return k, n
	}
	for k, p := range c.pending {
		if now.After(p.expires) {
			delete(c.pending, k)
		}
	}
	if k, n := oldest(func(p pendingAction) bool { return p.session == a.session }); n >= consolePerSession {
		delete(c.pending, k)
	}
	if k, n := oldest(func(pendingAction) bool { return true }); n >= consolePending {
		delete(c.pending, k)
	}
	c.pending[tok] = a
	return tok
}

// take removes and returns the action of a token, if the session of r
// kept it: each token once.
func (c *console) take(r *http.Request, tok string) (pendingAction, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	a, ok := c.pending[tok]
	if !ok || a.session != sessionOf(r) {
		return pendingAction{}, false
	}
	delete(c.pending, tok)
	if time.Now().After(a.expires) {
		return pendingAction{}, false
	}
	return a, true
}

// page is what every template gets.
type page struct {
	Title   string
	Nav     string
	Error   string
	Letters bool // a dead-letter topic is given
	Data    any
}

func (c *console) render(w http.ResponseWriter, status int, name string, p page) {
	p.Letters = c.broker != nil
	var b bytes.Buffer
	if err := consoleTemplates.ExecuteTemplate(&b, name, p); err != nil {
		http.Error(w, "idem console: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(b.Bytes())
}

// scopeView is one scope on the overview.
type scopeView struct {
	Scope     string
	Outcomes  []dedup.ScopeSummary
	Retention *retentionJSON
	Chart     *chart
}

// chart is the duplicate-age histogram as an SVG bar chart.
type chart struct {
	W, H, Base int
	Bars       []bar
	Total      uint64
}

type bar struct {
	X, Y, W, H, LabelX float64
	Label, Count       string
}

// newChart draws the duplicates per age bucket (not cumulative).
func newChart(a ages) *chart {
	if a.total() == 0 {
		return nil
	}
	const w, h, top, base = 640, 150, 16, 125
	ch := &chart{W: w, H: h, Base: base, Total: a.total()}
	n := len(a.counts)
	var most uint64
	per := make([]uint64, n)
	for i, cum := range a.counts {
		per[i] = cum
		if i > 0 {
			per[i] = cum - a.counts[i-1]
		}
		most = max(most, per[i])
	}
	slot := float64(w-20) / float64(n)
	for i, v := range per {
		bh := 0.0
		if most > 0 {
			bh = float64(v) / float64(most) * float64(base-top)
		}
		label := "+Inf"
		if !math.IsInf(a.bounds[i], 1) {
			label = "≤" + shortDuration(time.Duration(a.bounds[i]*float64(time.Second)))
		}
		x := 10 + float64(i)*slot
		ch.Bars = append(ch.Bars, bar{X: x + slot*0.1, Y: float64(base) - bh, W: slot * 0.8, H: bh, LabelX: x + slot/2, Label: label, Count: strconv.FormatUint(v, 10)})
	}
	return ch
}

// shortDuration is duration without its zero tails: 10m, not 10m0s.
func shortDuration(d time.Duration) string {
	s := duration(d)
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

func (c *console) overview(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	sum, err := c.admin.Summary(ctx)
	if err != nil {
		c.render(w, http.StatusInternalServerError, "overview", page{Title: "Overview", Nav: "overview", Error: err.Error()})
		return
	}
	var hist scraped
	var scrapeErr string
	if c.metrics != "" {
		if hist, err = scrape(ctx, c.metrics); err != nil {
			scrapeErr = "metrics: " + err.Error()
		}
	}
	advice, _ := adviseRetention(sum, hist, c.metrics != "" && scrapeErr == "", c.margin)
	byScope := map[string]*scopeView{}
	var scopes []*scopeView
	for _, s := range sum {
		v := byScope[s.Scope]
		if v == nil {
			v = &scopeView{Scope: s.Scope}
			byScope[s.Scope] = v
			scopes = append(scopes, v)
		}
		v.Outcomes = append(v.Outcomes, s)
	}
	totals := scopeTotals(sum)
	for i := range advice {
		if v := byScope[advice[i].Scope]; v != nil {
			v.Retention = &advice[i]
			a, _, _ := hist.agesOf(totals[v.Scope])
			v.Chart = newChart(a)
		}
	}
	sort.Slice(scopes, func(i, j int) bool { return scopes[i].Scope < scopes[j].Scope })
	c.render(w, http.StatusOK, "overview", page{Title: "Overview", Nav: "overview", Error: scrapeErr, Data: map[string]any{"Scopes": scopes, "Metrics": c.metrics}})
}

func (c *console) failed(w http.ResponseWriter, r *http.Request) {
	scope := r.URL.Query().Get("scope")
	rows, err := c.admin.Failed(r.Context(), dedup.RowFilter{Scope: scope, Limit: 100})
	p := page{Title: "Failed keys", Nav: "failed", Data: map[string]any{"Rows": rows, "Scope": scope}}
	if err != nil {
		p.Error = err.Error()
	}
	c.render(w, http.StatusOK, "failed", p)
}

// releaseDryRun shows what idem release --dry-run shows for the keys, and
// keeps the release of the failed ones among them.
func (c *console) releaseDryRun(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	scope, ids := q.Get("scope"), q["key"]
	p := page{Title: "Release failed keys", Nav: "failed"}
	if scope == "" || len(ids) == 0 {
		p.Error = "a scope and at least one key are required"
		c.render(w, http.StatusBadRequest, "dryrun", p)
		return
	}
	keys := make([]dedup.Key, len(ids))
	for i, id := range ids {
		keys[i] = dedup.Key{Scope: scope, ID: id}
	}
	rows, err := c.admin.Release(r.Context(), keys, true)
	if err != nil {
		p.Error = err.Error()
		c.render(w, http.StatusInternalServerError, "dryrun", p)
		return
	}
	var out bytes.Buffer
	if len(rows) > 0 {
		writeRows(&out, rows)
		out.WriteByte('\n')
	}
	writeReleased(&out, rows, true)
	if missing := notReleased(ids, rows); len(missing) > 0 {
		fmt.Fprintf(&out, "not released, no failed row in %s (not found, or done): %s\n", inert(scope), strings.Join(inertAll(missing), " "))
	}
	d := dryRun{Command: "idem release --dry-run --scope " + inert(scope) + " " + strings.Join(inertAll(ids), " "), Output: out.String(), Back: "/failed"}
	if len(rows) > 0 {
		found := make([]dedup.Key, len(rows))
		for i, row := range rows {
			found[i] = row.Key
		}
		d.Token = c.keep(r, pendingAction{kind: "release", keys: found, shown: rowsDigest(rows)})
		d.Confirm = fmt.Sprintf("Release %d failed key(s) in %s", len(rows), inert(scope))
		d.Question = fmt.Sprintf("Release %d failed key(s) in %s, so that their next message runs the handler again?", len(rows), inert(scope))
	}
	d.unconfirmable()
	p.Data = d
	c.render(w, http.StatusOK, "dryrun", p)
}

// unconfirmable takes the confirmation off a dry run whose action was
// not kept (keep refused a request from another page), and says why.
func (d *dryRun) unconfirmable() {
	if d.Confirm == "" || d.Token != "" {
		return
	}
	d.Confirm, d.Question = "", ""
	d.Output += "no confirmation: this dry run was opened from another page; open it from the console (or the address bar) to confirm it\n"
}

// dryRun is an action's dry-run page: the command's output, and the
// confirmation form when there is something to do.
type dryRun struct {
	Command, Output string
	Question        string
	Confirm         string // the button; empty: nothing to confirm
	Token           string
	Back            string
	Plan            *redrive.Plan // a redrive's: its letters, each with a choice
}

func (c *console) stuck(w http.ResponseWriter, r *http.Request) {
	recs, err := c.reqs.StuckRequests(r.Context(), 100)
	p := page{Title: "Stuck requests", Nav: "stuck", Data: recs}
	if err != nil {
		p.Error = err.Error()
	}
	c.render(w, http.StatusOK, "stuck", p)
}

// findStuck returns the stuck request k, if it is stuck.
func (c *console) findStuck(ctx context.Context, k dedup.Key) (dedup.RequestRecord, bool, error) {
	recs, err := c.reqs.StuckRequests(ctx, 10000)
	if err != nil {
		return dedup.RequestRecord{}, false, err
	}
	for _, rec := range recs {
		if rec.Key == k {
			return rec, true, nil
		}
	}
	return dedup.RequestRecord{}, false, nil
}

// releaseRequestDryRun shows a stuck request and keeps its release, bound
// to the lease token shown.
func (c *console) releaseRequestDryRun(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	k := dedup.Key{Scope: q.Get("scope"), ID: q.Get("key")}
	lease, err := strconv.ParseInt(q.Get("lease"), 10, 64)
	p := page{Title: "Release a stuck request", Nav: "stuck"}
	if k.Scope == "" || k.ID == "" || err != nil {
		p.Error = "a scope, a key and the lease token are required"
		c.render(w, http.StatusBadRequest, "dryrun", p)
		return
	}
	rec, ok, err := c.findStuck(r.Context(), k)
	if err != nil {
		p.Error = err.Error()
		c.render(w, http.StatusInternalServerError, "dryrun", p)
		return
	}
	d := dryRun{Command: fmt.Sprintf("release request %s %s (lease token %d)", inert(k.Scope), inert(k.ID), lease), Back: "/stuck"}
	switch {
	case !ok:
		d.Output = fmt.Sprintf("%s %s is not stuck: its request finished, holds a lease that runs, or is gone; nothing to release\n", inert(k.Scope), inert(k.ID))
	case rec.Token != lease:
		d.Output = fmt.Sprintf("%s %s moved on: its lease token is %d now, not %d; nothing to release (look again)\n", inert(k.Scope), inert(k.ID), rec.Token, lease)
	default:
		d.Output = fmt.Sprintf("would release request %s %s: lease token %d, lease ran out %s ago, first seen %s ago\n"+
			"its next request takes the key over with a larger token; its holder, should it be alive, is fenced out\n",
			inert(k.Scope), inert(k.ID), rec.Token, duration(-rec.LeaseLeft), age(rec.FirstAt))
		d.Token = c.keep(r, pendingAction{kind: "release-request", keys: []dedup.Key{k}, lease: rec.Token})
		d.Confirm = "Release the request"
		d.Question = fmt.Sprintf("Release the stuck request %s %s (lease token %d)? Its outcome is unknown: the next request with the key runs the handler again.", inert(k.Scope), inert(k.ID), rec.Token)
	}
	d.unconfirmable()
	p.Data = d
	c.render(w, http.StatusOK, "dryrun", p)
}

// letterGroup is the letters of one cause.
type letterGroup struct {
	Cause   string
	Letters []letterResult
}

func (c *console) redriveConfig(group string, skip bool) redrive.Config {
	return redrive.Config{Admin: c.admin, Topic: c.topic, Group: group, Max: c.max, MaxRedrives: c.maxRedrives, DryRun: true, Skip: skip}
}

func (c *console) groupParam(r *http.Request) string {
	if g := strings.TrimSpace(r.URL.Query().Get("group")); g != "" {
		return g
	}
	return c.group
}

// letters shows the dead letters a redrive would read, by cause: a dry run.
func (c *console) letters(w http.ResponseWriter, r *http.Request) {
	p := page{Title: "Dead letters", Nav: "letters"}
	if c.broker == nil {
		p.Error = "no dead-letter topic: run idem console with --topic and --brokers (Kafka) or --namesrv (RocketMQ)"
		c.render(w, http.StatusOK, "letters", p)
		return
	}
	group := c.groupParam(r)
	_, res, err := redrive.Run(r.Context(), c.broker, c.redriveConfig(group, false))
	if err != nil {
		p.Error = err.Error()
	}
	byCause := map[string]*letterGroup{}
	var groups []*letterGroup
	for _, l := range res {
		cause := l.Cause
		if cause == "" {
			cause = "(none)"
		}
		g := byCause[cause]
		if g == nil {
			g = &letterGroup{Cause: cause}
			byCause[cause] = g
			groups = append(groups, g)
		}
		g.Letters = append(g.Letters, l)
	}
	sort.Slice(groups, func(i, j int) bool { return groups[i].Cause < groups[j].Cause })
	p.Data = map[string]any{"Topic": c.topic, "Group": group, "Groups": groups, "Count": len(res)}
	c.render(w, http.StatusOK, "letters", p)
}

// redriveDryRun shows the plan of a redrive, as idem redrive --dry-run
// prints it, with a choice for each letter (send, skip, hold), and keeps
// the plan itself under the confirmation's token.
func (c *console) redriveDryRun(w http.ResponseWriter, r *http.Request) {
	p := page{Title: "Redrive dead letters", Nav: "letters"}
	if c.broker == nil {
		p.Error = "no dead-letter topic"
		c.render(w, http.StatusBadRequest, "dryrun", p)
		return
	}
	group := c.groupParam(r)
	skip := r.URL.Query().Get("skip") != ""
	plan, res, err := redrive.Run(r.Context(), c.broker, c.redriveConfig(group, skip))
	var out bytes.Buffer
	writeRedrive(&out, c.topic, res, err)
	if err != nil {
		fmt.Fprintln(&out, "error:", err)
	}
	cmd := fmt.Sprintf("idem redrive --dry-run --topic %s --group %s --max %d", inert(c.topic), inert(group), c.max)
	if skip {
		cmd += " --skip"
	}
	d := dryRun{Command: cmd, Back: "/letters?group=" + url.QueryEscape(group)}
	counts := map[string]int{}
	if plan != nil {
		counts = plan.Counts()
	}
	if err == nil && len(plan.Entries) > counts[redrive.VerdictStop] {
		fmt.Fprintf(&out, "plan %s\n", plan.Digest())
		d.Plan = plan
		d.Token = c.keep(r, pendingAction{kind: "redrive", plan: plan})
		d.Confirm = fmt.Sprintf("Redrive %d letter(s)", counts[redrive.VerdictSend])
		if counts[redrive.VerdictSend] == 0 {
			d.Confirm = fmt.Sprintf("Pass %d letter(s) by", len(plan.Entries)-counts[redrive.VerdictStop])
		}
		d.Question = fmt.Sprintf("Execute this plan of %s: send %d letter(s) back to their topic with their lineage, pass %d by (duplicates or skipped)? "+
			"Exactly these letters, as chosen below; if what a redrive would do with them changed since, nothing is done.",
			inert(c.topic), counts[redrive.VerdictSend], counts[redrive.VerdictDuplicate]+counts[redrive.VerdictSkip])
	} else if err == nil {
		fmt.Fprintln(&out, "nothing to do: no letter to redrive, or the first letter of each partition refused (skip it below with --skip, or release its key)")
	}
	d.Output = out.String()
	d.unconfirmable()
	p.Data = d
	c.render(w, http.StatusOK, "dryrun", p)
}

// chosen is the plan kept under a redrive's token with the operator's
// choice for each letter (the confirmation's form field c<index>: send,
// skip or hold) applied.
func chosen(kept *redrive.Plan, form url.Values) (*redrive.Plan, error) {
	p := *kept
	p.Entries = slices.Clone(kept.Entries)
	var hold []string
	for i, e := range kept.Entries {
		switch choice := form.Get("c" + strconv.Itoa(i)); choice {
		case "", "send":
		case "skip":
			if err := p.SkipLetter(e.Letter); err != nil {
				return nil, err
			}
		case "hold":
			hold = append(hold, e.Letter)
		default:
			return nil, fmt.Errorf("letter %s: unknown choice %q (send, skip or hold)", e.Letter, choice)
		}
	}
	for _, l := range hold {
		if slices.ContainsFunc(p.Entries, func(e redrive.Entry) bool { return e.Letter == l }) {
			if err := p.Hold(l); err != nil {
				return nil, err
			}
		}
	}
	return &p, nil
}

// confirm runs the action a dry run kept, once.
func (c *console) confirm(w http.ResponseWriter, r *http.Request) {
	p := page{Title: "Done", Nav: "overview"}
	a, ok := c.take(r, r.PostFormValue("action"))
	if !ok {
		p.Title = "Refused"
		p.Error = "this confirmation is unknown, used already or expired: nothing changed. Start again from its dry run."
		c.render(w, http.StatusForbidden, "done", p)
		return
	}
	// The action runs to its end even when the browser goes away.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	status := http.StatusOK
	back := "/"
	switch a.kind {
	case "release":
		back = "/failed"
		// Bound to the rows shown: a row that changed since (a new
		// incident recorded, another reason) is not released unseen.
		if now, err := c.admin.Release(ctx, a.keys, true); err != nil {
			p.Error, status = err.Error(), http.StatusInternalServerError
			break
		} else if rowsDigest(now) != a.shown {
			p.Title, status = "Refused", http.StatusConflict
			fmt.Fprintln(&out, "not released: the failed rows changed since the dry run (a new incident, or released already); nothing changed. Look again.")
			break
		}
		rows, err := c.admin.Release(ctx, a.keys, false)
		if err != nil {
			p.Error, status = err.Error(), http.StatusInternalServerError
			break
		}
		writeReleased(&out, rows, false)
		ids := make([]string, len(a.keys))
		for i, k := range a.keys {
			ids[i] = k.ID
		}
		if missing := notReleased(ids, rows); len(missing) > 0 {
			fmt.Fprintf(&out, "not released, no failed row in %s any more: %s\n", inert(a.keys[0].Scope), strings.Join(inertAll(missing), " "))
			status = http.StatusConflict
		}
	case "release-request":
		back = "/stuck"
		k := a.keys[0]
		// Released only while its token is the one shown, in one
		// statement: a request that moved on (taken over, finished, or
		// released since) is refused, and one that takes the key over
		// while the release runs is not fenced out of a run it has just
		// begun. The release grows the token, fencing the holder out.
		released, err := c.reqs.ReleaseRequest(ctx, k, a.lease)
		switch {
		case err != nil:
			p.Error, status = err.Error(), http.StatusInternalServerError
		case released:
			fmt.Fprintf(&out, "released request %s %s (lease token %d): its next request takes over\n", inert(k.Scope), inert(k.ID), a.lease)
		default:
			p.Title, status = "Refused", http.StatusConflict
			fmt.Fprintf(&out, "not released: %s %s moved on since (its lease token is no longer %d, or it finished)\n", inert(k.Scope), inert(k.ID), a.lease)
		}
	case "redrive":
		back = "/letters?group=" + url.QueryEscape(a.plan.Group)
		// The plan executed is the one shown with the operator's choices:
		// executed (its Digest names it) is what an audit records.
		executed, err := chosen(a.plan, r.PostForm)
		if err != nil {
			p.Title, p.Error, status = "Refused", err.Error()+": nothing changed", http.StatusBadRequest
			break
		}
		a.plan = executed // what the audit log records
		res, err := redrive.Execute(ctx, c.broker, c.admin, executed)
		var stale *redrive.StaleError
		if errors.As(err, &stale) && len(res) == 0 {
			p.Title, p.Error, status = "Refused", err.Error(), http.StatusConflict
			break
		}
		writeRedrive(&out, c.topic, res, err)
		fmt.Fprintf(&out, "plan %s executed\n", executed.Digest())
		if err != nil {
			p.Error, status = err.Error(), http.StatusInternalServerError
		}
	case "resolve-step":
		back = "/effects"
		status = c.resolveStep(ctx, a.step, &p, &out)
	}
	if err := c.recordConfirmed(ctx, r, a, status, p.Error, out.String()); err != nil { // the audit log (audit.go)
		// The action ran (or was refused) and the log does not say so:
		// the operator must know, and see what ran.
		p.Title, status = p.Title+", not recorded", http.StatusInternalServerError
		p.Error = strings.TrimPrefix(strings.TrimSpace(p.Error+"; "+err.Error()), "; ")
	}
	p.Data = map[string]any{"Output": out.String(), "Back": back}
	c.render(w, status, "done", p)
}
