package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/sqlitestore"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/internal/testenv/pgtest"
)

// stepAt puts ref in the journal in state: a call begun (pending under
// lease) and, unless state is pending, finished so.
func stepAt(t *testing.T, j dedup.Journal, ref dedup.StepRef, state dedup.StepState, lease time.Duration, errText string) dedup.StepRecord {
	t.Helper()
	ctx := testenv.Context(t, time.Minute)
	rec, err := j.BeginStep(ctx, ref, "pk-"+ref.Key.ID+"-"+ref.Step, dedup.Fingerprint{}, lease)
	if err != nil || rec.Verdict != dedup.StepCall {
		t.Fatalf("begin %v: %+v, %v", ref, rec, err)
	}
	if state != dedup.StepPending {
		out := dedup.StepOutcome{State: state, Error: errText}
		if state == dedup.StepSucceeded || state == dedup.StepFailed {
			out.Result = []byte(`{"refund":"done"}`)
		}
		if err := j.FinishStep(ctx, ref, rec.Token, out); err != nil {
			t.Fatal(err)
		}
	}
	return rec
}

func pay(id, step string) dedup.StepRef {
	return dedup.StepRef{Key: dedup.Key{Scope: "refunds", ID: id}, Step: step}
}

// stdinFunc is a stdin that runs fn when the confirmation reads its
// answer: what happens while an operator looks at the plan.
type stdinFunc struct {
	fn     func()
	answer io.Reader
}

func (s *stdinFunc) Read(p []byte) (int, error) {
	if s.fn != nil {
		s.fn()
		s.fn = nil
	}
	return s.answer.Read(p)
}

// idemWithStdin is idem with a stdin of the test's own.
func idemWithStdin(t *testing.T, stdin io.Reader, envs map[string]string, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	e := &env{stdin: stdin, stdout: &out, stderr: &errOut, getenv: func(k string) string { return envs[k] }}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	code := run(ctx, args, e)
	t.Logf("idem %q -> %d\n%s%s", args, code, out.String(), errOut.String())
	return code, out.String(), errOut.String()
}

// TestEffectsPostgres: idem effects lists the unresolved steps of a real
// Postgres journal (unknown, in doubt, pending past its lease; not a
// succeeded one nor one whose holder's lease runs), every field inert;
// idem effects resolve shows its plan, records nothing unconfirmed,
// resolves on a yes with the reference as the step's result, refuses a
// step taken over while the question waited or since a dry run (exit 4),
// refuses a step that is not unresolved (exit 3), and leaves each
// execution in the audit log.
func TestEffectsPostgres(t *testing.T) {
	pool, schema := testenv.SchemaPool(t)
	ctx := testenv.Context(t, 2*time.Minute)
	store := pgtest.Store(t, pool, schema)
	envs := map[string]string{"IDEM_PG_URL": testenv.PostgresURL(t), "IDEM_PG_SCHEMA": schema}

	stepAt(t, store, pay("R1", "refund"), dedup.StepSucceeded, time.Minute, "")
	stepAt(t, store, pay("R2", "refund"), dedup.StepUnknown, time.Minute, "timeout\x1b[2K\nFAKE row")
	stepAt(t, store, pay("R3", "refund"), dedup.StepInDoubt, time.Minute, "the provider keeps keys 24h; the first attempt was 25h ago")
	stepAt(t, store, pay("R4", "refund"), dedup.StepPending, 50*time.Millisecond, "")
	stepAt(t, store, pay("R5", "refund"), dedup.StepPending, time.Hour, "")
	testenv.WaitUntil(t, 30*time.Second, "R4's lease to run out", func() bool {
		rec, _, err := store.Step(ctx, pay("R4", "refund"))
		return err == nil && rec.LeaseLeft <= 0
	})

	code, out, _ := idem(t, "", envs, "effects", "--json")
	steps := decode[[]stepJSON](t, out)
	got := map[string]stepJSON{}
	for _, s := range steps {
		got[s.Key] = s
	}
	if code != exitOK || len(steps) != 3 || got["R2"].State != "unknown" || got["R3"].State != "in_doubt" || got["R4"].State != "pending" || !got["R4"].LeaseRanOut ||
		got["R3"].ProviderKey != "pk-R3-refund" || got["R3"].Attempts != 1 || got["R3"].AgeSeconds <= 0 {
		t.Fatalf("idem effects --json: exit %d, %+v; want R2 unknown, R3 in_doubt, R4 pending past its lease", code, steps)
	}
	code, out, _ = idem(t, "", envs, "effects")
	if code != exitOK || !strings.Contains(out, "pk-R3-refund") || !strings.Contains(out, "pending, lease ran out") || strings.Contains(out, "R5") {
		t.Errorf("idem effects: exit %d\n%s", code, out)
	}
	assertInert(t, "idem effects", out)
	code, out, _ = idem(t, "", envs, "effects", "--state", "succeeded,pending", "--json")
	if steps := decode[[]stepJSON](t, out); code != exitOK || len(steps) != 3 {
		t.Errorf("--state succeeded,pending: exit %d, %+v (want R1, R4, R5)", code, steps)
	}
	if code, _, _ := idem(t, "", envs, "effects", "--state", "lost"); code != exitUsage {
		t.Errorf("--state lost: exit %d", code)
	}

	resolve := []string{"effects", "resolve", "--scope", "refunds", "--key", "R3", "--step", "refund", "--as", "succeeded", "--reference", "2026120722001"}
	// Not confirmed: the plan shown, nothing recorded.
	code, out, _ = idem(t, "n\n", envs, resolve...)
	if code != exitNotConfirmed || !strings.Contains(out, "pk-R3-refund") || !strings.Contains(out, "will record   succeeded, reference 2026120722001") {
		t.Fatalf("resolve, not confirmed: exit %d\n%s", code, out)
	}
	if rec, _, _ := store.Step(ctx, pay("R3", "refund")); rec.State != dedup.StepInDoubt {
		t.Fatalf("after no: R3 %v", rec.State)
	}
	// Confirmed: resolved, the reference the step's result from now on.
	if code, _, _ = idem(t, "y\n", envs, resolve...); code != exitOK {
		t.Fatalf("resolve: exit %d", code)
	}
	rec, err := store.BeginStep(ctx, pay("R3", "refund"), "pk-R3-refund", dedup.Fingerprint{}, time.Minute)
	if err != nil || rec.Verdict != dedup.StepDone || rec.State != dedup.StepSucceeded || string(rec.Result) != "2026120722001" || !strings.HasPrefix(rec.Error, "resolved by cli:") {
		t.Fatalf("R3 after its resolution: %+v, %v", rec, err)
	}

	// Taken over while the operator read the plan: refused, not recorded.
	var takeover dedup.StepRecord
	stdin := &stdinFunc{answer: strings.NewReader("y\n"), fn: func() {
		takeover, err = store.BeginStep(ctx, pay("R2", "refund"), "pk-R2-refund", dedup.Fingerprint{}, time.Minute)
	}}
	code, _, errOut := idemWithStdin(t, stdin, envs, "effects", "resolve", "--scope", "refunds", "--key", "R2", "--step", "refund", "--as", "failed")
	if err != nil || takeover.Verdict != dedup.StepResolve {
		t.Fatalf("the takeover: %+v, %v", takeover, err)
	}
	if code != exitNotConfirmed || !strings.Contains(errOut, "stale plan") {
		t.Fatalf("resolve of a step taken over meanwhile: exit %d, %q", code, errOut)
	}
	if rec, _, _ := store.Step(ctx, pay("R2", "refund")); rec.State != dedup.StepUnknown || rec.Token != takeover.Token {
		t.Fatalf("R2 after the stale resolution: %+v", rec)
	}

	// A dry run's plan, executed by --token: refused once the step moved.
	dry := []string{"effects", "resolve", "--scope", "refunds", "--key", "R4", "--step", "refund", "--as", "failed", "--dry-run", "--json"}
	code, out, _ = idem(t, "", envs, dry...)
	var shown struct{ Plan resolvePlan }
	if err := json.Unmarshal([]byte(out), &shown); err != nil || code != exitOK || shown.Plan.Token == 0 || shown.Plan.Seen == nil {
		t.Fatalf("dry run: exit %d, %v\n%s", code, err, out)
	}
	if _, err := store.BeginStep(ctx, pay("R4", "refund"), "pk-R4-refund", dedup.Fingerprint{}, 50*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	testenv.WaitUntil(t, 30*time.Second, "R4's new lease to run out", func() bool {
		rec, _, err := store.Step(ctx, pay("R4", "refund"))
		return err == nil && rec.LeaseLeft <= 0
	})
	tok := []string{"effects", "resolve", "--scope", "refunds", "--key", "R4", "--step", "refund", "--as", "failed", "--yes", "--token", jsonInt(shown.Plan.Token)}
	if code, _, errOut := idem(t, "", envs, tok...); code != exitNotConfirmed || !strings.Contains(errOut, "stale plan") {
		t.Fatalf("--token of a step taken over since: exit %d, %q", code, errOut)
	}
	if rec, _, _ := store.Step(ctx, pay("R4", "refund")); rec.State != dedup.StepPending {
		t.Fatalf("R4 after the stale --token: %+v", rec)
	}

	// Not unresolved: a succeeded step, a holder's running lease, no step.
	for _, key := range []string{"R1", "R5", "R9"} {
		if code, _, _ := idem(t, "", envs, "effects", "resolve", "--scope", "refunds", "--key", key, "--step", "refund", "--as", "failed", "--yes"); code != exitPartial {
			t.Errorf("resolve %s: exit %d, want %d", key, code, exitPartial)
		}
	}
	if rec, _, _ := store.Step(ctx, pay("R5", "refund")); rec.State != dedup.StepPending {
		t.Errorf("R5, whose holder's lease runs: %+v", rec)
	}

	code, out, _ = idem(t, "", envs, "audit", "--json")
	acts := decode[[]actionJSON](t, out)
	if code != exitOK || len(acts) != 3 {
		t.Fatalf("idem audit: exit %d, %d entries, want 3 (two refused, one ok): %+v", code, len(acts), acts)
	}
	for i, w := range []struct{ key, outcome string }{{"R4", "refused: stale plan"}, {"R2", "refused: stale plan"}, {"R3", "ok"}} {
		a := acts[i]
		var p resolvePlan
		if err := json.Unmarshal(a.Plan, &p); err != nil || a.Action != "resolve-step" || p.Key != w.key || p.Token == 0 || !strings.HasPrefix(a.Outcome, w.outcome) || !strings.HasPrefix(a.Actor, "cli:") {
			t.Errorf("entry %d: %s %s %q %s (%v), want resolve-step of %s, %q", i, a.Actor, a.Action, a.Outcome, a.Plan, err, w.key, w.outcome)
		}
	}
	var p resolvePlan
	if err := json.Unmarshal(acts[2].Plan, &p); err != nil || p.Reference != "2026120722001" || p.As != "succeeded" || p.Seen == nil || p.Seen.State != "in_doubt" {
		t.Errorf("R3's audited plan: %s", acts[2].Plan)
	}
}

func jsonInt(n int64) string { b, _ := json.Marshal(n); return string(b) }

// TestEffectsSQLite: the same commands on an SQLite store's journal.
func TestEffectsSQLite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "idem.db")
	envs := map[string]string{"IDEM_SQLITE": path}
	if code, _, _ := idem(t, "", envs, "migrate"); code != exitOK {
		t.Fatalf("migrate: exit %d", code)
	}
	db, err := sqlitestore.Open(path, sqlitestore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	st, err := sqlitestore.New(db, sqlitestore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	stepAt(t, st, pay("S1", "payout"), dedup.StepInDoubt, time.Minute, "no read-back")
	stepAt(t, st, pay("S2", "payout"), dedup.StepSucceeded, time.Minute, "")

	code, out, _ := idem(t, "", envs, "effects", "--json")
	if steps := decode[[]stepJSON](t, out); code != exitOK || len(steps) != 1 || steps[0].Key != "S1" || steps[0].State != "in_doubt" {
		t.Fatalf("idem effects: exit %d, %+v", code, steps)
	}
	if code, _, _ := idem(t, "", envs, "effects", "resolve", "--scope", "refunds", "--key", "S1", "--step", "payout", "--as", "failed", "--yes"); code != exitOK {
		t.Fatalf("resolve: exit %d", code)
	}
	ctx := testenv.Context(t, time.Minute)
	if rec, _, err := st.Step(ctx, pay("S1", "payout")); err != nil || rec.State != dedup.StepFailed || !strings.HasPrefix(rec.Error, "resolved by cli:") {
		t.Fatalf("S1: %+v, %v", rec, err)
	}
	if code, out, _ := idem(t, "", envs, "effects"); code != exitOK || !strings.Contains(out, "no unresolved steps") {
		t.Errorf("idem effects after: exit %d\n%s", code, out)
	}
	if code, out, _ := idem(t, "", envs, "audit", "--json"); code != exitOK || !strings.Contains(out, `"resolve-step"`) {
		t.Errorf("audit: exit %d\n%s", code, out)
	}
	// Usage errors name what is wrong.
	for _, args := range [][]string{
		{"--key", "S1", "--step", "payout", "--as", "failed"},
		{"--scope", "refunds", "--key", "S1", "--step", "payout", "--as", "maybe"},
		{"--scope", "refunds", "--key", "S1", "--step", "payout", "--as", "succeeded"},
	} {
		if code, _, _ := idem(t, "", envs, append([]string{"effects", "resolve"}, args...)...); code != exitUsage {
			t.Errorf("resolve %q: exit %d", args, code)
		}
	}
}

// TestConsoleResolvesAStep: the console lists a real Postgres journal's
// unresolved steps, every field inert; Resolve shows the plan and keeps
// it, its confirmation records it once; a step taken over between the
// plan and the confirmation is refused (409, nothing recorded), and one
// that moved on since the list was shown gets no confirmation at all.
// Both executions are in the audit log.
func TestConsoleResolvesAStep(t *testing.T) {
	pool, schema := testenv.SchemaPool(t)
	ctx := testenv.Context(t, 2*time.Minute)
	store := pgtest.Store(t, pool, schema)
	r1 := stepAt(t, store, pay("R1", "refund"), dedup.StepInDoubt, time.Minute, "no read-back\x1b]8;;http://evil\x07")
	r2 := stepAt(t, store, pay("R2", "refund"), dedup.StepUnknown, time.Minute, "timeout")
	stepAt(t, store, pay("R3", "refund"), dedup.StepSucceeded, time.Minute, "")
	c := &console{admin: store.Admin(), reqs: store, journal: store, checkHost: true}
	auth, err := newConsoleAuth(testConsoleToken, "tester", "7464", false, testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	c.auth = auth
	f := &consoleFixture{console: c, h: c.handler(), store: store}

	for _, target := range []string{"/effects", "/resolve-step?scope=refunds&key=R1&step=refund&as=failed"} {
		if code, _ := f.do(t, http.MethodGet, target, nil, noAuth); code != http.StatusUnauthorized {
			t.Errorf("GET %s without the token: %d, want 401", target, code)
		}
	}
	code, body := f.do(t, http.MethodGet, "/effects", nil, nil)
	if code != http.StatusOK || !strings.Contains(body, "pk-R1-refund") || !strings.Contains(body, "pk-R2-refund") || strings.Contains(body, "pk-R3-refund") ||
		strings.Contains(body, "\x1b") || !strings.Contains(body, `\x1b]8;;http://evil\x07`) {
		t.Fatalf("GET /effects: %d\n%s", code, body)
	}

	target := "/resolve-step?" + url.Values{"scope": {"refunds"}, "key": {"R1"}, "step": {"refund"}, "as": {"succeeded"},
		"reference": {"2026120722001"}, "listed": {jsonInt(r1.Token)}}.Encode()
	page, tok := f.dryRun(t, target)
	if !strings.Contains(page, "will record   succeeded, reference 2026120722001") {
		t.Errorf("the plan:\n%s", page)
	}
	if rec, _, _ := store.Step(ctx, pay("R1", "refund")); rec.State != dedup.StepInDoubt {
		t.Fatalf("the dry run recorded: %+v", rec)
	}
	if code, body := f.confirm(t, tok, nil); code != http.StatusOK || !strings.Contains(body, "resolved refunds R1 refund as succeeded") {
		t.Fatalf("confirm: %d\n%s", code, body)
	}
	if rec, _, _ := store.Step(ctx, pay("R1", "refund")); rec.State != dedup.StepSucceeded || string(rec.Result) != "2026120722001" || rec.Error != "resolved by console:tester" {
		t.Fatalf("R1 after the confirmation: %+v", rec)
	}
	if code, _ := f.confirm(t, tok, nil); code != http.StatusForbidden {
		t.Errorf("the confirmation again: %d", code)
	}

	// R2: planned, then taken over before the confirmation.
	target = "/resolve-step?" + url.Values{"scope": {"refunds"}, "key": {"R2"}, "step": {"refund"}, "as": {"failed"}, "listed": {jsonInt(r2.Token)}}.Encode()
	_, tok = f.dryRun(t, target)
	takeover, err := store.BeginStep(ctx, pay("R2", "refund"), "pk-R2-refund", dedup.Fingerprint{}, time.Minute)
	if err != nil || takeover.Verdict != dedup.StepResolve {
		t.Fatalf("the takeover: %+v, %v", takeover, err)
	}
	if code, body := f.confirm(t, tok, nil); code != http.StatusConflict || !strings.Contains(body, "stale plan") {
		t.Fatalf("confirm of a step taken over: %d\n%s", code, body)
	}
	if rec, _, _ := store.Step(ctx, pay("R2", "refund")); rec.State != dedup.StepUnknown || rec.Token != takeover.Token {
		t.Fatalf("R2 after the stale confirmation: %+v", rec)
	}
	// The list's token is no longer R2's: no confirmation offered.
	if code, body := f.do(t, http.MethodGet, target, nil, nil); code != http.StatusOK || actionToken.MatchString(body) || !strings.Contains(body, "moved on") {
		t.Errorf("a dry run from an old list: %d\n%s", code, body)
	}

	acts, err := store.Admin().Actions(ctx, 0)
	if err != nil || len(acts) != 2 {
		t.Fatalf("audit log: %+v, %v", acts, err)
	}
	for i, w := range []struct{ key, outcome string }{{"R2", "refused: stale plan"}, {"R1", "ok"}} {
		var p consolePlan
		if err := json.Unmarshal(acts[i].Plan, &p); err != nil || acts[i].Kind != "resolve-step" || acts[i].Actor != "console:tester" ||
			p.Step == nil || p.Step.Key != w.key || p.Step.Token == 0 || !strings.HasPrefix(acts[i].Outcome, w.outcome) {
			t.Errorf("entry %d: %s %s %q %s (%v), want resolve-step of %s, %q", i, acts[i].Actor, acts[i].Kind, acts[i].Outcome, acts[i].Plan, err, w.key, w.outcome)
		}
	}
}
