package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/idemkit/idem/dedup"
)

// The effect journal (dedup.Journal, written by package effect): idem
// effects lists the steps whose outcome nobody knows, idem effects resolve
// records an operator's finding for one of them, as a plan shown and then
// executed.

// stepJSON is a journal step as --json prints it.
type stepJSON struct {
	Scope       string `json:"scope"`
	Key         string `json:"key"`
	Step        string `json:"step"`
	State       string `json:"state"`
	ProviderKey string `json:"provider_key"`
	Attempts    int    `json:"attempts"`
	// Token is the holder's fencing token: a resolution confirmed from
	// this record goes ahead only while it is still the step's.
	Token int64 `json:"token"`
	// LeaseRanOut is a pending step whose holder's lease ran out: a
	// holder that died mid-call, its outcome unknown.
	LeaseRanOut    bool       `json:"lease_ran_out,omitempty"`
	FirstAttemptAt time.Time  `json:"first_attempt_at"`
	LastAttemptAt  time.Time  `json:"last_attempt_at"`
	AgeSeconds     float64    `json:"age_seconds"` // since the first attempt
	LeaseExpiresAt *time.Time `json:"lease_expires_at,omitempty"`
	Result         string     `json:"result,omitempty"`
	Error          string     `json:"error,omitempty"`
	UpdatedAt      time.Time  `json:"updated_at"`
}

func toStepJSON(r dedup.StepRecord) stepJSON {
	j := stepJSON{Scope: r.Ref.Key.Scope, Key: r.Ref.Key.ID, Step: r.Ref.Step, State: r.State.String(), ProviderKey: r.ProviderKey,
		Attempts: r.Attempts, Token: r.Token, LeaseRanOut: leaseRanOut(r), FirstAttemptAt: r.FirstAttemptAt.UTC(), LastAttemptAt: r.LastAttemptAt.UTC(),
		AgeSeconds: r.SinceFirstAttempt.Seconds(), Result: string(r.Result), Error: r.Error, UpdatedAt: r.UpdatedAt.UTC()}
	if r.State == dedup.StepPending && !r.LeaseExpires.IsZero() {
		exp := r.LeaseExpires.UTC()
		j.LeaseExpiresAt = &exp
	}
	return j
}

// leaseRanOut reports a pending step whose holder's lease ran out.
func leaseRanOut(r dedup.StepRecord) bool { return r.State == dedup.StepPending && r.LeaseLeft <= 0 }

// stepState is a step's state as the tables print it.
func stepState(r dedup.StepRecord) string {
	if leaseRanOut(r) {
		return "pending, lease ran out"
	}
	return r.State.String()
}

// runEffects lists journal steps, or runs idem effects resolve.
func runEffects(ctx context.Context, e *env, fs *flag.FlagSet, args []string) int {
	if len(args) > 0 && args[0] == "resolve" {
		rfs := flag.NewFlagSet("idem effects resolve", flag.ContinueOnError)
		rfs.SetOutput(e.stderr)
		rfs.Usage = func() {
			fmt.Fprintf(rfs.Output(), "Usage: idem effects resolve --scope S --key K --step NAME --as succeeded|failed --reference REF\n\n%s\n\nFlags:\n", wrap(resolveLong, 78))
			rfs.PrintDefaults()
		}
		return runResolveStep(ctx, e, rfs, args[1:])
	}
	var sf storeFlags
	sf.register(fs, e)
	var f dedup.StepFilter
	states := fs.String("state", "", "only steps in these states, comma-separated: pending, succeeded, failed, unknown, in_doubt; empty: the unresolved ones")
	fs.StringVar(&f.Scope, "scope", e.getenv("IDEM_SCOPE"), "only this scope (env IDEM_SCOPE)")
	fs.IntVar(&f.Limit, "limit", 100, "at most this many steps, the oldest first attempt first")
	pos, code, ok := parse(fs, args)
	if !ok {
		return code
	}
	if len(pos) > 0 {
		return usageErr(e, fs, "unexpected argument %q (idem effects, or idem effects resolve)", inert(pos[0]))
	}
	if *states != "" {
		for _, s := range strings.Split(*states, ",") {
			st, err := dedup.ParseStepState(strings.TrimSpace(s))
			if err != nil {
				return usageErr(e, fs, "--state: %s", strings.TrimPrefix(err.Error(), "dedup: "))
			}
			f.States = append(f.States, st)
		}
	}
	if f.Limit <= 0 {
		return usageErr(e, fs, "--limit must be positive")
	}
	st, err := sf.openStore(ctx, false)
	if err != nil {
		return fail(e, err)
	}
	defer st.close()
	recs, err := st.journal.Steps(ctx, f)
	if err != nil {
		return fail(e, err)
	}
	if sf.json {
		out := make([]stepJSON, 0, len(recs))
		for _, r := range recs {
			out = append(out, toStepJSON(r))
		}
		printJSON(e, out)
		return exitOK
	}
	if len(recs) == 0 {
		if len(f.States) == 0 {
			fmt.Fprintln(e.stdout, "no unresolved steps")
		} else {
			fmt.Fprintln(e.stdout, "no steps")
		}
		return exitOK
	}
	writeSteps(e.stdout, recs)
	if len(f.States) == 0 {
		fmt.Fprintf(e.stdout, "\n%d unresolved steps: calls whose outcome nobody knows. An unknown step is read back at its message's next delivery;\n"+
			"an in_doubt one was dead-lettered and waits for you: ask the provider about its provider key, then\n"+
			"idem effects resolve --scope S --key K --step NAME --as succeeded --reference REF (or --as failed).\n", len(recs))
	}
	return exitOK
}

// writeSteps prints journal steps as a table, every field from outside
// inert: the console's list too.
func writeSteps(w io.Writer, recs []dedup.StepRecord) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SCOPE\tKEY\tSTEP\tSTATE\tAGE\tPROVIDER KEY\tATTEMPTS\tERROR")
	for _, r := range recs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\n", inert(r.Ref.Key.Scope), inert(r.Ref.Key.ID), inert(r.Ref.Step), stepState(r),
			duration(r.SinceFirstAttempt), inert(r.ProviderKey), r.Attempts, oneLine(r.Error, 80))
	}
	tw.Flush()
}

const resolveLong = "Records what an operator found out about a step whose outcome is unknown (unknown, in_doubt, or pending with its lease run out): " +
	"--as succeeded with the provider's reference (the step's result from then on: a redelivery of its message gets it without calling), " +
	"or --as failed (the provider did nothing: the message fails for good, dead-lettered as permanent). " +
	"It reads the step and shows the plan — the step as it is now, with its fencing token, and what will be recorded — and asks first; " +
	"--yes does not ask, --dry-run only shows (--json: the plan), --token executes a plan shown before. " +
	"The plan executes only while the step's token is the one shown: a step taken over or resolved meanwhile is refused as stale (exit 4). " +
	"The resolution goes to the audit log (idem audit) as resolve-step, with who ran it."

// resolvePlan is what idem effects resolve executes, as shown and as the
// audit log keeps it.
type resolvePlan struct {
	Scope     string `json:"scope"`
	Key       string `json:"key"`
	Step      string `json:"step"`
	As        string `json:"as"`
	Reference string `json:"reference,omitempty"`
	// Token is the step's fencing token as read: the resolution goes ahead
	// only while it is still the step's.
	Token int64 `json:"token"`
	// Step as it was read, when the plan was made.
	Seen *stepJSON `json:"seen,omitempty"`
}

// resolveJSON is what idem effects resolve --json prints.
type resolveJSON struct {
	DryRun   bool        `json:"dry_run"`
	Resolved bool        `json:"resolved"`
	Refused  string      `json:"refused,omitempty"` // why not: stale, resolved already, a lease runs, no such step
	Plan     resolvePlan `json:"plan"`
}

// errStale is a resolution refused because the step changed since its plan
// was shown.
var errStale = errors.New("stale plan")

// planResolve reads ref and makes the plan of its resolution as state. It
// returns a reason, and exit code 3, when the step cannot be resolved: not
// there, resolved already, or a holder's lease runs.
func planResolve(ctx context.Context, j dedup.Journal, ref dedup.StepRef, state dedup.StepState, reference string) (resolvePlan, dedup.StepRecord, string, error) {
	plan := resolvePlan{Scope: ref.Key.Scope, Key: ref.Key.ID, Step: ref.Step, As: state.String(), Reference: reference}
	rec, found, err := j.Step(ctx, ref)
	if err != nil {
		return plan, rec, "", err
	}
	if !found {
		return plan, rec, "no such step in the journal", nil
	}
	seen := toStepJSON(rec)
	plan.Token, plan.Seen = rec.Token, &seen
	switch {
	case rec.State == dedup.StepSucceeded || rec.State == dedup.StepFailed:
		return plan, rec, "the step is " + rec.State.String() + " already: nothing to resolve", nil
	case rec.State == dedup.StepPending && rec.LeaseLeft > 0:
		return plan, rec, fmt.Sprintf("the step is pending and its holder's lease runs for %s: a call may be in flight; run again once it ran out", duration(rec.LeaseLeft)), nil
	}
	return plan, rec, "", nil
}

// writeResolvePlan prints a plan, every field from outside inert.
func writeResolvePlan(w io.Writer, p resolvePlan, rec dedup.StepRecord) {
	fmt.Fprintf(w, "step          %s %s %s\nstate         %s (token %d)\nprovider key  %s\nattempts      %d, the first %s ago, the last %s ago\n",
		inert(p.Scope), inert(p.Key), inert(p.Step), stepState(rec), rec.Token, inert(rec.ProviderKey), rec.Attempts,
		duration(rec.SinceFirstAttempt), duration(rec.SinceLastAttempt))
	if rec.Error != "" {
		fmt.Fprintf(w, "error         %s\n", oneLine(rec.Error, 200))
	}
	fmt.Fprintf(w, "will record   %s", p.As)
	if p.Reference != "" {
		fmt.Fprintf(w, ", reference %s", inert(p.Reference))
	}
	fmt.Fprintf(w, " (only while the token is still %d)\n", p.Token)
}

func runResolveStep(ctx context.Context, e *env, fs *flag.FlagSet, args []string) int {
	var sf storeFlags
	sf.register(fs, e)
	scope := fs.String("scope", e.getenv("IDEM_SCOPE"), "the step's scope, the consumer's Name (env IDEM_SCOPE); required")
	key := fs.String("key", "", "the message's dedup key; required")
	step := fs.String("step", "", "the step's name; required")
	as := fs.String("as", "", "succeeded (the provider executed the request) or failed (it did nothing); required")
	reference := fs.String("reference", "", "the provider's reference of what it executed (required with --as succeeded): the step's result from then on")
	token := fs.Int64("token", 0, "execute only while the step's token is this one, as a --dry-run showed it")
	dry := fs.Bool("dry-run", false, "show the plan; change nothing")
	yes := fs.Bool("yes", false, "do not ask")
	pos, code, ok := parse(fs, args)
	if !ok {
		return code
	}
	var state dedup.StepState
	switch *as {
	case "succeeded":
		state = dedup.StepSucceeded
	case "failed":
		state = dedup.StepFailed
	}
	ref := dedup.StepRef{Key: dedup.Key{Scope: *scope, ID: *key}, Step: *step}
	switch {
	case len(pos) > 0:
		return usageErr(e, fs, "unexpected argument %q: the step is named by --scope, --key and --step", inert(pos[0]))
	case *scope == "" || *key == "" || *step == "":
		return usageErr(e, fs, "--scope, --key and --step are required: they name the step")
	case state == 0:
		return usageErr(e, fs, "--as must be succeeded or failed, not %q", inert(*as))
	case state == dedup.StepSucceeded && *reference == "":
		return usageErr(e, fs, "--as succeeded needs --reference: the provider's reference of what it executed")
	case *token < 0:
		return usageErr(e, fs, "--token must be positive")
	}
	if err := ref.Validate(); err != nil {
		return usageErr(e, fs, "%s", strings.TrimPrefix(err.Error(), "dedup: "))
	}
	st, err := sf.openStore(ctx, false)
	if err != nil {
		return fail(e, err)
	}
	defer st.close()
	plan, rec, refusal, err := planResolve(ctx, st.journal, ref, state, *reference)
	if err != nil {
		return fail(e, err)
	}
	if *token > 0 && plan.Token != *token {
		// Whatever it is now, it is not the step the plan was made of.
		refusal = fmt.Sprintf("%v: the step's token is %d, not %d as shown: it was taken over, resolved or purged since", errStale, plan.Token, *token)
	}
	if *dry || refusal != "" {
		if sf.json {
			printJSON(e, resolveJSON{DryRun: *dry, Refused: refusal, Plan: plan})
		} else if plan.Seen != nil {
			writeResolvePlan(e.stdout, plan, rec)
		}
		switch {
		case refusal == "":
			if !sf.json {
				fmt.Fprintf(e.stdout, "dry run: nothing recorded; --token %d --yes executes this plan\n", plan.Token)
			}
			return exitOK
		case strings.HasPrefix(refusal, errStale.Error()):
			fmt.Fprintln(e.stderr, "idem:", refusal)
			if *dry {
				return exitNotConfirmed
			}
			return cliRecord(ctx, e, st.admin, "resolve-step", plan, outcomeRefused+": "+refusal, exitNotConfirmed)
		}
		fmt.Fprintf(e.stderr, "idem: %s %s %s: %s\n", inert(*scope), inert(*key), inert(*step), refusal)
		return exitPartial
	}
	if !*yes {
		if !sf.json {
			writeResolvePlan(e.stdout, plan, rec)
		}
		if !confirm(e, fmt.Sprintf("record step %s of %s as %s?", inert(*step), inert(*key), plan.As)) {
			fmt.Fprintln(e.stderr, "idem: not confirmed; nothing recorded (--yes does not ask)")
			return exitNotConfirmed
		}
	}
	actor := cliActor(e)
	resolved, err := st.journal.ResolveStep(ctx, ref, plan.Token, dedup.StepOutcome{State: state, Result: []byte(*reference), Error: "resolved by " + actor})
	if err != nil {
		return cliRecord(ctx, e, st.admin, "resolve-step", plan, outcomeError+": "+err.Error(), fail(e, err))
	}
	if !resolved {
		msg := fmt.Sprintf("%v: step %s %s %s changed since its plan was shown (token %d): taken over, resolved or pending again; nothing recorded: run again",
			errStale, inert(*scope), inert(*key), inert(*step), plan.Token)
		code := cliRecord(ctx, e, st.admin, "resolve-step", plan, outcomeRefused+": "+msg, exitNotConfirmed)
		fmt.Fprintln(e.stderr, "idem:", msg)
		return code
	}
	if code := cliRecord(ctx, e, st.admin, "resolve-step", plan, outcomeOK, exitOK); code != exitOK {
		return code
	}
	if sf.json {
		printJSON(e, resolveJSON{Resolved: true, Plan: plan})
	} else {
		fmt.Fprintf(e.stdout, "resolved %s %s %s as %s\n", inert(*scope), inert(*key), inert(*step), plan.As)
	}
	return exitOK
}

// effects is the console's list of unresolved steps, as idem effects.
func (c *console) effects(w http.ResponseWriter, r *http.Request) {
	p := page{Title: "Provider calls of unknown outcome", Nav: "effects"}
	recs, err := c.journal.Steps(r.Context(), dedup.StepFilter{Scope: r.URL.Query().Get("scope"), Limit: 100})
	if err != nil {
		p.Error = err.Error()
	}
	p.Data = recs
	c.render(w, http.StatusOK, "effects", p)
}

// resolveStepDryRun shows the plan of a step's resolution, as idem effects
// resolve --dry-run prints it, and keeps it: the confirmation records it
// only while the step's token is the one read here. A token in the query
// (listed: the list's) that is no longer the step's shows the step moved
// on. (The console takes a query's token for its own: see console_auth.go.)
func (c *console) resolveStepDryRun(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	ref := dedup.StepRef{Key: dedup.Key{Scope: q.Get("scope"), ID: q.Get("key")}, Step: q.Get("step")}
	reference := q.Get("reference")
	p := page{Title: "Resolve a provider call", Nav: "effects"}
	var state dedup.StepState
	switch q.Get("as") {
	case "succeeded":
		state = dedup.StepSucceeded
	case "failed":
		state = dedup.StepFailed
	}
	listed, tokErr := strconv.ParseInt(or(q.Get("listed"), "0"), 10, 64)
	switch {
	case ref.Validate() != nil:
		p.Error = "a scope, a key and a step are required"
	case state == 0:
		p.Error = "resolve as succeeded or failed"
	case state == dedup.StepSucceeded && reference == "":
		p.Error = "succeeded needs the provider's reference of what it executed"
	case tokErr != nil:
		p.Error = "listed: the token listed is a number"
	}
	if p.Error != "" {
		c.render(w, http.StatusBadRequest, "dryrun", p)
		return
	}
	plan, rec, refusal, err := planResolve(r.Context(), c.journal, ref, state, reference)
	if err != nil {
		p.Error = err.Error()
		c.render(w, http.StatusInternalServerError, "dryrun", p)
		return
	}
	if refusal == "" && listed > 0 && listed != plan.Token {
		refusal = fmt.Sprintf("the step moved on since it was listed: its token is %d now, not %d; look again", plan.Token, listed)
	}
	cmd := fmt.Sprintf("idem effects resolve --dry-run --scope %s --key %s --step %s --as %s", inert(ref.Key.Scope), inert(ref.Key.ID), inert(ref.Step), plan.As)
	if reference != "" {
		cmd += " --reference " + inert(reference)
	}
	var out bytes.Buffer
	if plan.Seen != nil {
		writeResolvePlan(&out, plan, rec)
	}
	d := dryRun{Command: cmd, Back: "/effects"}
	if refusal != "" {
		fmt.Fprintf(&out, "nothing to resolve: %s\n", refusal)
	} else {
		d.Token = c.keep(r, pendingAction{kind: "resolve-step", keys: []dedup.Key{ref.Key}, step: &plan})
		d.Confirm = "Record " + plan.As
		d.Question = fmt.Sprintf("Record step %s of %s %s as %s? Its message, run again, will find it %s and not call the provider.",
			inert(ref.Step), inert(ref.Key.Scope), inert(ref.Key.ID), plan.As, plan.As)
	}
	d.Output = out.String()
	d.unconfirmable()
	p.Data = d
	c.render(w, http.StatusOK, "dryrun", p)
}

// resolveStep executes a resolution the console kept: only while the
// step's token is the one shown. It returns the page's status.
func (c *console) resolveStep(ctx context.Context, plan *resolvePlan, p *page, out io.Writer) int {
	ref := dedup.StepRef{Key: dedup.Key{Scope: plan.Scope, ID: plan.Key}, Step: plan.Step}
	state := dedup.StepSucceeded
	if plan.As == dedup.StepFailed.String() {
		state = dedup.StepFailed
	}
	actor := "console"
	if c.auth != nil {
		actor = "console:" + c.auth.name
	}
	resolved, err := c.journal.ResolveStep(ctx, ref, plan.Token, dedup.StepOutcome{State: state, Result: []byte(plan.Reference), Error: "resolved by " + actor})
	switch {
	case err != nil:
		p.Error = err.Error()
		return http.StatusInternalServerError
	case !resolved:
		p.Title = "Refused"
		p.Error = fmt.Sprintf("%v: step %s %s %s changed since its plan was shown (token %d): taken over, resolved or pending again; nothing recorded. Look again.",
			errStale, inert(plan.Scope), inert(plan.Key), inert(plan.Step), plan.Token)
		return http.StatusConflict
	}
	fmt.Fprintf(out, "resolved %s %s %s as %s\n", inert(plan.Scope), inert(plan.Key), inert(plan.Step), plan.As)
	return http.StatusOK
}
