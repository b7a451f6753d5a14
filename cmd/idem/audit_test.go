package main

import (
	"bytes"
	"encoding/json"
	"maps"
	"net/http"
	"os/user"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/internal/testenv"
)

// TestAuditLog: every action executed, by the console (a release, one
// refused as stale) and by the command (a release, a redrive, a purge), is
// in the audit log with who ran it, its plan and its outcome; idem audit
// lists it, the console shows it on /audit and counts it on /metrics,
// both behind the token. Dry runs and unconfirmed actions are not there.
func TestAuditLog(t *testing.T) {
	f := newConsoleFixture(t)
	ctx := testenv.Context(t, 2*time.Minute)
	if _, err := f.pool.Exec(ctx, `DELETE FROM blocked`); err != nil {
		t.Fatal(err)
	}
	// Dry runs record nothing.
	f.dryRun(t, "/release?scope=pay&key=T03")
	idem(t, "", f.envs, "release", "--scope", "pay", "--dry-run", "T03")
	idem(t, "n\n", f.envs, "release", "--scope", "pay", "T03")
	if acts, err := f.store.Admin().Actions(ctx, 0); err != nil || len(acts) != 0 {
		t.Fatalf("after dry runs, the audit log: %+v, %v", acts, err)
	}

	// The console: a release refused as stale, then one that runs.
	_, stale := f.dryRun(t, "/release?scope=pay&key=T03")
	if _, err := f.store.Admin().Release(ctx, []dedup.Key{{Scope: "pay", ID: "T03"}}, false); err != nil {
		t.Fatal(err)
	}
	if err := f.store.RecordFailure(ctx, dedup.Claim{Key: dedup.Key{Scope: "pay", ID: "T03"}, Fingerprint: dedup.FingerprintOf([]byte("T03")), Source: "pay/0/3"}, "account blocked again"); err != nil {
		t.Fatal(err)
	}
	if code, _ := f.confirm(t, stale, nil); code != http.StatusConflict {
		t.Fatalf("the stale release: %d", code)
	}
	_, tok := f.dryRun(t, "/release?scope=pay&key=T03")
	if code, body := f.confirm(t, tok, nil); code != http.StatusOK {
		t.Fatalf("the release: %d\n%s", code, body)
	}
	// The command: T03's letter redriven, a released key, a purge.
	if code, _, _ := idem(t, "", f.envs, "redrive", "--topic", f.dlq); code != exitOK {
		t.Fatalf("redrive: exit %d", code)
	}
	if err := f.store.RecordFailure(ctx, dedup.Claim{Key: dedup.Key{Scope: "pay", ID: "F9"}, Fingerprint: dedup.FingerprintOf([]byte("F9"))}, "closed"); err != nil {
		t.Fatal(err)
	}
	if code, _, _ := idem(t, "", f.envs, "release", "--scope", "pay", "--yes", "F9", "nope"); code != exitPartial {
		t.Fatalf("release F9 nope: exit %d", code)
	}
	if code, _, _ := idem(t, "", f.envs, "purge"); code != exitOK {
		t.Fatalf("purge: exit %d", code)
	}

	code, out, _ := idem(t, "", f.envs, "audit", "--json")
	acts := decode[[]actionJSON](t, out)
	if code != exitOK || len(acts) != 5 {
		t.Fatalf("idem audit: exit %d, %d entries, want 5: %+v", code, len(acts), acts)
	}
	u, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	cli := "cli:" + u.Username
	type want struct{ actor, action, outcome, plan string }
	for i, w := range []want{
		{cli, "purge", "ok", `"purged":`},
		{cli, "release", "partial: not released, no failed row: nope", `"key":"F9"`},
		{cli, "redrive", "ok", `"action":"sent"`},
		{"console:tester", "release", "ok", `"key":"T03"`},
		{"console:tester", "release", "refused: not released: the failed rows changed", `"rows_digest":`},
	} {
		a := acts[i]
		var compact bytes.Buffer
		if err := json.Compact(&compact, a.Plan); err == nil {
			a.Plan = compact.Bytes()
		}
		if a.Actor != w.actor || a.Action != w.action || !strings.HasPrefix(a.Outcome, w.outcome) || !strings.Contains(string(a.Plan), w.plan) || a.At.IsZero() {
			t.Errorf("entry %d: %s %s %q %s, want %s %s %q with %s", i, a.Actor, a.Action, a.Outcome, a.Plan, w.actor, w.action, w.outcome, w.plan)
		}
		if !json.Valid(a.Plan) {
			t.Errorf("entry %d's plan is not JSON: %s", i, a.Plan)
		}
	}
	code, out, _ = idem(t, "", f.envs, "audit")
	if code != exitOK || !strings.Contains(out, "console:tester") || !strings.Contains(out, cli) {
		t.Errorf("idem audit: exit %d\n%s", code, out)
	}
	assertInert(t, "idem audit", out)

	code, body := f.do(t, http.MethodGet, "/audit", nil, nil)
	if code != http.StatusOK || !strings.Contains(body, "console:tester") || !strings.Contains(body, cli) || strings.Count(body, "<tr>") != 6 {
		t.Errorf("GET /audit: %d\n%s", code, body)
	}
	code, body = f.do(t, http.MethodGet, "/metrics", nil, nil)
	if code != http.StatusOK || !strings.Contains(body, `idem_operator_actions_total{action="release",outcome="ok"} 1`) ||
		!strings.Contains(body, `idem_operator_actions_total{action="release",outcome="refused"} 1`) {
		t.Errorf("GET /metrics: %d\n%s", code, body)
	}
	for _, target := range []string{"/audit", "/metrics"} {
		if code, _ := f.do(t, http.MethodGet, target, nil, noAuth); code != http.StatusUnauthorized {
			t.Errorf("GET %s without the token: %d", target, code)
		}
	}
}

// TestStorableJSON: a NUL in a plan's strings becomes the text \u0000,
// which jsonb holds; a backslash followed by u0000 in a string stays
// what it was, and the rest of the JSON is untouched.
func TestStorableJSON(t *testing.T) {
	in := map[string]string{"cause": "permanent\x00", "key": `lit\u0000eral`, "ok": "plain"}
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	var out map[string]string
	if err := json.Unmarshal(storableJSON(b), &out); err != nil {
		t.Fatalf("storableJSON(%s) is not JSON: %v", b, err)
	}
	want := map[string]string{"cause": `permanent\u0000`, "key": `lit\u0000eral`, "ok": "plain"}
	if !maps.Equal(out, want) || bytes.Contains(storableJSON(b), []byte(`"permanent\u0000"`)) {
		t.Errorf("storableJSON(%s) = %s, want the strings %q", b, storableJSON(b), want)
	}
}

// TestConsoleShowsAnActionNotRecorded: a confirmed action that ran and
// could not be recorded (the audit table is gone here) says so, with a
// 500, and still shows what ran: never Done with a 200.
func TestConsoleShowsAnActionNotRecorded(t *testing.T) {
	f := newConsoleFixture(t)
	ctx := testenv.Context(t, time.Minute)
	_, tok := f.dryRun(t, "/release?scope=pay&key=T03")
	if _, err := f.pool.Exec(ctx, `DROP TABLE `+pgx.Identifier{f.schema, "idem_dedup_audit"}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	code, body := f.confirm(t, tok, nil)
	if code != http.StatusInternalServerError || !strings.Contains(body, "released pay T03") || !strings.Contains(errorLine(body), "did not record it") {
		t.Errorf("a release that ran and was not recorded: %d, want 500 with what ran and that it was not recorded: %s\n%s", code, errorLine(body), body)
	}
	rows, err := f.store.Admin().Release(ctx, []dedup.Key{{Scope: "pay", ID: "T03"}}, true)
	if err != nil || len(rows) != 0 {
		t.Errorf("the release did not run: %v, %d failed row(s) left", err, len(rows))
	}
}
