package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os/user"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/idemkit/idem/cmd/idem/internal/redrive"
	"github.com/idemkit/idem/dedup"
)

// The audit log: every action the command or the console executes (a
// release, a redrive and the letters it skips, a purge, a step resolved) is recorded in the
// store (dedup.Auditor) with who ran it, the plan it executed and how it
// ended. idem audit lists it; the console shows it on /audit and counts
// its actions on /metrics.

// Outcomes of an action, the first word of its audit entry's outcome and
// the outcome label of idem_operator_actions_total.
const (
	outcomeOK      = "ok"
	outcomePartial = "partial"
	outcomeRefused = "refused"
	outcomeError   = "error"
)

// cliActor is who runs the command: the OS user.
func cliActor(e *env) string {
	if u, err := user.Current(); err == nil && u.Username != "" {
		return "cli:" + u.Username
	}
	return "cli:" + or(e.getenv("USER"), "unknown")
}

// recordAction writes an action to the audit log. The action ran already:
// a failure to record it is reported, and is the command's error.
func recordAction(ctx context.Context, admin dedup.Auditor, actor, kind string, plan any, outcome string) error {
	b, err := json.Marshal(plan)
	if err != nil {
		return fmt.Errorf("the %s ran, but the audit log did not record it: %w", kind, err)
	}
	a := dedup.Action{Actor: storable(cut(actor, 256)), Kind: kind, Plan: storableJSON(b), Outcome: storable(cut(or(outcome, outcomeOK), 2000))}
	// The action ran: record it even when the command is being stopped.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := admin.RecordAction(ctx, a); err != nil {
		return fmt.Errorf("the %s ran, but the audit log did not record it: %w", kind, err)
	}
	return nil
}

// storableJSON makes a plan's JSON storable whatever its strings hold:
// a NUL in a string (a dead letter's header, a key from outside) is
// written \u0000, which Postgres's jsonb refuses (SQLSTATE 22P05); it
// becomes the six characters \u0000 in the string instead. Outside
// strings JSON has no backslash, so every one starts an escape.
func storableJSON(b []byte) []byte {
	const nul = `\u0000`
	if !bytes.Contains(b, []byte(nul)) {
		return b
	}
	out := make([]byte, 0, len(b)+16)
	for i := 0; i < len(b); i++ {
		switch {
		case b[i] != '\\' || i+1 >= len(b):
			out = append(out, b[i])
		case bytes.HasPrefix(b[i:], []byte(nul)):
			out = append(out, `\\u0000`...)
			i += len(nul) - 1
		default: // another escape, kept whole: \\ is not the start of \u0000
			out = append(out, b[i], b[i+1])
			i++
		}
	}
	return out
}

// storable is a text field as the audit log can hold it: valid UTF-8,
// a NUL (which Postgres's text refuses) written \x00.
func storable(s string) string {
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", `\x00`)
}

// cliRecord is recordAction for the command: a failure is printed, and
// turns the exit status into an error.
func cliRecord(ctx context.Context, e *env, admin dedup.Auditor, kind string, plan any, outcome string, code int) int {
	if err := recordAction(ctx, admin, cliActor(e), kind, plan, outcome); err != nil {
		fmt.Fprintln(e.stderr, "idem:", err)
		return exitError
	}
	return code
}

// cut shortens s to at most n bytes, on a character boundary.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[:n]
	for len(s) > 0 && !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s
}

// actionJSON is an audit entry as idem audit --json prints it.
type actionJSON struct {
	ID      int64           `json:"id"`
	At      time.Time       `json:"at"`
	Actor   string          `json:"actor"`
	Action  string          `json:"action"`
	Plan    json.RawMessage `json:"plan"`
	Outcome string          `json:"outcome"`
}

func runAudit(ctx context.Context, e *env, fs *flag.FlagSet, args []string) int {
	var sf storeFlags
	sf.register(fs, e)
	limit := fs.Int("limit", 100, "at most this many entries, newest first")
	admin, closeStore, code, ok := sf.parseOpen(ctx, e, fs, args, false)
	if !ok {
		return code
	}
	defer closeStore()
	acts, err := admin.Actions(ctx, *limit)
	if err != nil {
		return fail(e, err)
	}
	if sf.json {
		out := make([]actionJSON, 0, len(acts))
		for _, a := range acts {
			out = append(out, actionJSON{a.ID, a.At.UTC(), a.Actor, a.Kind, json.RawMessage(a.Plan), a.Outcome})
		}
		printJSON(e, out)
		return exitOK
	}
	if len(acts) == 0 {
		fmt.Fprintln(e.stdout, "no actions recorded")
		return exitOK
	}
	writeActions(e.stdout, acts)
	return exitOK
}

// writeActions prints audit entries as a table, every field inert.
func writeActions(w io.Writer, acts []dedup.Action) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "AT\tACTOR\tACTION\tOUTCOME\tPLAN")
	for _, a := range acts {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", a.At.UTC().Format(time.RFC3339), inert(a.Actor), inert(a.Kind), oneLine(a.Outcome, 60), oneLine(string(a.Plan), 100))
	}
	tw.Flush()
}

// consolePlan is what a confirmation executed, as the audit log keeps it:
// the action kept from the dry run, and what came of it.
type consolePlan struct {
	Kind  string    `json:"kind"`
	Keys  []keyJSON `json:"keys,omitempty"`
	Lease int64     `json:"lease_token,omitempty"`
	Topic string    `json:"topic,omitempty"`
	// Plan is the redrive's plan as executed: the one shown, with the
	// operator's choices; Digest names it as the page showed it.
	Plan   *redrive.Plan `json:"plan,omitempty"`
	Digest string        `json:"digest,omitempty"`
	// Step is a resolve-step's plan: the step as shown, its token, and
	// what was recorded.
	Step   *resolvePlan `json:"step,omitempty"`
	Shown  string       `json:"rows_digest,omitempty"`
	Result []string     `json:"result,omitempty"`
	Client string       `json:"client"`
}

type keyJSON struct {
	Scope string `json:"scope"`
	Key   string `json:"key"`
}

// recordConfirmed records an action the console executed (confirm), with
// its outcome from the page's status, and counts it. Its error says the
// action ran and was not recorded; the page must show it.
func (c *console) recordConfirmed(ctx context.Context, r *http.Request, a pendingAction, status int, errText, output string) error {
	outcome := outcomeOK
	switch {
	case status >= 500:
		outcome = outcomeError + ": " + errText
	case status == http.StatusConflict && strings.HasPrefix(output, "not released"):
		outcome = outcomeRefused + ": " + strings.TrimSpace(output)
	case status == http.StatusConflict && strings.HasPrefix(errText, "stale plan"):
		outcome = outcomeRefused + ": " + errText
	case status == http.StatusBadRequest: // the confirmation's form refused before anything ran
		outcome = outcomeRefused + ": " + errText
	case status >= 400:
		outcome = outcomePartial + ": " + strings.TrimSpace(output)
	}
	plan := consolePlan{Kind: a.kind, Lease: a.lease, Plan: a.plan, Step: a.step, Shown: a.shown, Client: client(r)}
	if a.plan != nil {
		plan.Digest = a.plan.Digest()
	}
	for _, k := range a.keys {
		plan.Keys = append(plan.Keys, keyJSON{k.Scope, k.ID})
	}
	if a.kind == "redrive" {
		plan.Topic = c.topic
	}
	for _, line := range strings.Split(strings.TrimSpace(output), "\n") {
		if line != "" {
			plan.Result = append(plan.Result, line)
		}
	}
	word, _, _ := strings.Cut(outcome, ":")
	c.countAction(a.kind, word)
	actor := "console"
	if c.auth != nil {
		actor = "console:" + c.auth.name
	}
	err := recordAction(ctx, c.admin, actor, a.kind, plan, outcome)
	if err != nil && c.auth != nil {
		c.auth.log.Error("idem console: "+err.Error(), "action", a.kind)
	}
	return err
}

// consoleMetrics are the console's own: the operator actions it executed.
type consoleMetrics struct {
	reg     *prometheus.Registry
	actions *prometheus.CounterVec
}

func newConsoleMetrics() *consoleMetrics {
	m := &consoleMetrics{reg: prometheus.NewRegistry(), actions: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "idem_operator_actions_total",
		Help: "Operator actions the idem console executed, by action (release, release-request, redrive, resolve-step) and outcome (ok, partial, refused, error).",
	}, []string{"action", "outcome"})}
	m.reg.MustRegister(m.actions)
	return m
}

func (c *console) countAction(kind, outcome string) {
	if c.metricsOut != nil {
		c.metricsOut.actions.WithLabelValues(kind, outcome).Inc()
	}
}

// metricsHandler serves the console's metrics (behind its token).
func (c *console) metricsHandler() http.Handler {
	if c.metricsOut == nil {
		c.metricsOut = newConsoleMetrics()
	}
	return promhttp.HandlerFor(c.metricsOut.reg, promhttp.HandlerOpts{})
}

// auditPage shows the audit log.
func (c *console) auditPage(w http.ResponseWriter, r *http.Request) {
	acts, err := c.admin.Actions(r.Context(), 200)
	p := page{Title: "Audit log", Nav: "audit", Data: acts}
	if err != nil {
		p.Error = err.Error()
	}
	c.render(w, http.StatusOK, "audit", p)
}

// cliRecordRedrive records what idem redrive did: the plan it executed
// (its digest, as --dry-run and --json name it) and each letter's action.
func cliRecordRedrive(ctx context.Context, e *env, admin dedup.Auditor, f redriveFlags, plan *redrive.Plan, res []letterResult, runErr error) int {
	counts := redriveCounts(res)
	outcome := outcomeOK
	switch {
	case errors.As(runErr, new(*redrive.StaleError)) && len(res) == 0: // refused before any letter
		outcome = outcomeRefused + ": " + runErr.Error()
	case runErr != nil:
		outcome = outcomeError + ": " + runErr.Error()
	case counts[redrive.Refused] > 0:
		outcome = fmt.Sprintf("%s: %d refused", outcomePartial, counts[redrive.Refused])
	}
	rec := map[string]any{"topic": f.topic, "to": f.to, "group": f.group, "release": f.release, "skip": f.skip, "letters": res, "counts": counts}
	if plan != nil {
		rec["plan"], rec["digest"] = plan, plan.Digest()
	}
	return cliRecord(ctx, e, admin, "redrive", rec, outcome, exitOK)
}
