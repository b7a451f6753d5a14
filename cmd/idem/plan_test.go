package main

import (
	"context"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/idemkit/idem/consumer"
)

// deadLetter blocks each payment, produces it and waits until it is
// dead-lettered, one after the other, so that the dead-letter topic holds
// their letters in this order.
func (p *payments) deadLetter(ids ...string) {
	p.t.Helper()
	for _, id := range ids {
		if _, err := p.pool.Exec(context.Background(), `INSERT INTO blocked VALUES ($1) ON CONFLICT DO NOTHING`, id); err != nil {
			p.t.Fatal(err)
		}
		n := p.consumer.Stats().DeadLettered
		p.produce(id)
		p.waitFor(id+" dead-lettered", func(s consumer.Stats) bool { return s.DeadLettered == n+1 })
	}
}

// fix unblocks the payments and releases their keys, so that a redrive
// sends their letters.
func (p *payments) fix(ids ...string) {
	p.t.Helper()
	if _, err := p.pool.Exec(context.Background(), `DELETE FROM blocked WHERE txn_id = ANY($1)`, ids); err != nil {
		p.t.Fatal(err)
	}
	if code, _, _ := idem(p.t, "", p.envs, append([]string{"release", "--scope", "pay", "--yes"}, ids...)...); code != exitOK {
		p.t.Fatalf("release %v: exit %d", ids, code)
	}
}

// redrive runs idem redrive --json with args and checks its exit.
func (p *payments) redrive(wantCode int, args ...string) redriveJSON {
	p.t.Helper()
	code, out, errOut := idem(p.t, "", p.envs, append([]string{"redrive", "--topic", p.dlq, "--json"}, args...)...)
	if code != wantCode {
		p.t.Fatalf("redrive %v: exit %d, want %d\n%s%s", args, code, wantCode, out, errOut)
	}
	return decode[redriveJSON](p.t, out)
}

// actions lists each letter's key and action, a dry run's would_send as
// sent.
func actions(rd redriveJSON) []string {
	var out []string
	for _, l := range rd.Letters {
		out = append(out, l.Key+" "+strings.Replace(l.Action, "would_send", "sent", 1))
	}
	return out
}

// TestRedriveDryRunIsTheRun: three letters in one partition, the middle
// one's key still failed. The dry run shows what the run then does: the
// first sent, the partition stopped at the second, the third not reached
// (the dry run used to go past the refused letter and list the third as
// would_send). The next run starts with the refused letter.
func TestRedriveDryRunIsTheRun(t *testing.T) {
	p := newPayments(t)
	p.start()
	p.deadLetter("T01", "T02", "T03")
	p.fix("T01", "T03")
	topicEnd := p.end(p.topic)
	dry := p.redrive(exitPartial, "--dry-run")
	run := p.redrive(exitPartial)
	if got, want := actions(dry), actions(run); !slices.Equal(got, want) || !slices.Equal(want, []string{"T01 sent", "T02 refused"}) {
		t.Errorf("the dry run showed %v, the run did %v; want [T01 sent, T02 refused]", got, want)
	}
	if end := p.end(p.topic); end != topicEnd+1 {
		t.Errorf("%d copies sent, want 1", end-topicEnd)
	}
	p.waitFor("T01's copy applied", func(s consumer.Stats) bool { return s.Applied == 1 })
	if got := p.ledger(); got["T01"] != 1 || got["T03"] != 0 {
		t.Errorf("ledger %v", got)
	}
	if next := p.redrive(exitPartial, "--dry-run"); !slices.Equal(actions(next), []string{"T02 refused"}) {
		t.Errorf("the next dry run: %v, want it to start with T02's letter", actions(next))
	}
}

// TestRedrivePlanFile: `idem redrive --plan FILE` executes the dry run's
// plan exactly: a letter dead-lettered after the dry run is not sent. A
// plan that went stale (another redrive sent its letter since) is refused
// and sends nothing.
func TestRedrivePlanFile(t *testing.T) {
	p := newPayments(t)
	p.start()
	p.deadLetter("T02", "T03")
	p.fix("T02", "T03")
	dir := t.TempDir()
	_, shown, _ := idem(t, "", p.envs, "redrive", "--topic", p.dlq, "--dry-run", "--json")
	plan := filepath.Join(dir, "plan.json")
	if err := os.WriteFile(plan, []byte(shown), 0o600); err != nil {
		t.Fatal(err)
	}
	p.deadLetter("T04") // after the dry run
	p.fix("T04")
	topicEnd := p.end(p.topic)
	rd := p.redrive(exitOK, "--plan", plan)
	if got := actions(rd); !slices.Equal(got, []string{"T02 sent", "T03 sent"}) {
		t.Errorf("the plan's run: %v, want T02 and T03 sent", got)
	}
	if end := p.end(p.topic); end != topicEnd+2 {
		t.Errorf("%d copies sent, want 2", end-topicEnd)
	}
	p.waitFor("T02 and T03 applied", func(s consumer.Stats) bool { return s.Applied == 2 })
	if got := p.ledger(); got["T02"] != 1 || got["T03"] != 1 || got["T04"] != 0 {
		t.Errorf("ledger %v", got)
	}

	// A plan of T04's letter; a redrive sends it meanwhile; the plan is
	// stale.
	_, shown, _ = idem(t, "", p.envs, "redrive", "--topic", p.dlq, "--dry-run", "--json")
	if err := os.WriteFile(plan, []byte(shown), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := actions(p.redrive(exitOK)); !slices.Equal(got, []string{"T04 sent"}) {
		t.Fatalf("the redrive between: %v", got)
	}
	topicEnd = p.end(p.topic)
	code, _, errOut := idem(t, "", p.envs, "redrive", "--plan", plan, "--json")
	if code != exitNotConfirmed || !strings.Contains(errOut, "stale plan") {
		t.Errorf("a stale plan: exit %d, %q", code, errOut)
	}
	if end := p.end(p.topic); end != topicEnd {
		t.Errorf("a stale plan sent %d copies", end-topicEnd)
	}
}

// TestRedriveTwinOfAnAppliedKey: a key dead-lettered twice (its permanent
// letter and the failed_before letter of its re-send), then another key's
// letter. The key is fixed and released; a redrive of one letter applies
// it. The next redrive passes the twin by as a duplicate and sends the
// letter after it (the twin used to be refused, "the key was applied",
// and stop the partition for good).
func TestRedriveTwinOfAnAppliedKey(t *testing.T) {
	p := newPayments(t)
	p.start()
	p.deadLetter("T03", "T03", "T05")
	p.fix("T03", "T05")
	if got := actions(p.redrive(exitOK, "--max", "1")); !slices.Equal(got, []string{"T03 sent"}) {
		t.Fatalf("the first redrive: %v", got)
	}
	p.waitFor("T03 applied", func(s consumer.Stats) bool { return s.Applied == 1 })
	rd := p.redrive(exitOK)
	if got := actions(rd); !slices.Equal(got, []string{"T03 duplicate", "T05 sent"}) {
		t.Errorf("the second redrive: %v, want T03's twin a duplicate and T05 sent", got)
	}
	p.waitFor("T05 applied", func(s consumer.Stats) bool { return s.Applied == 2 })
	if got := p.ledger(); got["T03"] != 1 || got["T05"] != 1 {
		t.Errorf("ledger %v", got)
	}
	if next := p.redrive(exitOK); len(next.Letters) != 0 {
		t.Errorf("a redrive after: %v, want nothing left", actions(next))
	}
}

// TestConsoleConfirmsThePlanShown: the console's confirmation executes the
// plan it showed, with the operator's choices, or nothing. Shown [T03
// T05], a redrive sends T03 and T07 is dead-lettered meanwhile: the
// confirmation is refused as stale (it used to send T05 and T07). Shown
// [T05 T06] with T06 held: T05 alone is sent. Shown [T06 T07] with T06
// skipped: T06 passed by, T07 sent.
func TestConsoleConfirmsThePlanShown(t *testing.T) {
	f := newConsoleFixture(t)
	f.fix("T03")
	f.deadLetter("T05", "T06")
	f.fix("T05", "T06")
	confirm := func(tok string, choices ...string) (int, string) {
		t.Helper()
		form := url.Values{"action": {tok}}
		for i := 0; i+1 < len(choices); i += 2 {
			form.Set(choices[i], choices[i+1])
		}
		return f.do(t, http.MethodPost, "/confirm", form, nil)
	}

	f.console.max = 2
	body, tok := f.dryRun(t, "/redrive")
	if !strings.Contains(body, "key pay/T03") || !strings.Contains(body, "key pay/T05") || strings.Contains(body, "key pay/T06") {
		t.Fatalf("the dry run does not show [T03 T05]:\n%s", body)
	}
	if got := actions(f.redrive(exitOK, "--max", "1")); !slices.Equal(got, []string{"T03 sent"}) {
		t.Fatalf("the redrive between: %v", got)
	}
	f.deadLetter("T07")
	f.fix("T07")
	topicEnd := f.end(f.topic)
	if code, body := confirm(tok); code != http.StatusConflict || !strings.Contains(body, "stale plan") {
		t.Errorf("confirm a stale plan: %d\n%s", code, body)
	}
	if end := f.end(f.topic); end != topicEnd {
		t.Fatalf("a stale plan sent %d copies", end-topicEnd)
	}

	// [T05 T06], T06 held: T05 sent.
	if body, tok = f.dryRun(t, "/redrive"); !strings.Contains(body, "key pay/T05") || !strings.Contains(body, "key pay/T06") {
		t.Fatalf("the dry run does not show [T05 T06]:\n%s", body)
	}
	if code, body := confirm(tok, "c1", "hold"); code != http.StatusOK || !strings.Contains(body, "1 sent") || strings.Contains(body, "T06") {
		t.Errorf("confirm with T06 held: %d\n%s", code, body)
	}
	if end := f.end(f.topic); end != topicEnd+1 {
		t.Errorf("%d copies sent, want T05's", end-topicEnd)
	}
	// [T06 T07], T06 skipped: T07 sent.
	if body, tok = f.dryRun(t, "/redrive"); !strings.Contains(body, "key pay/T06") || !strings.Contains(body, "key pay/T07") {
		t.Fatalf("the dry run does not show [T06 T07]:\n%s", body)
	}
	if code, body := confirm(tok, "c0", "skip"); code != http.StatusOK || !strings.Contains(body, "1 sent") || !strings.Contains(body, "1 skipped") {
		t.Errorf("confirm with T06 skipped: %d\n%s", code, body)
	}
	if end := f.end(f.topic); end != topicEnd+2 {
		t.Errorf("%d copies sent, want T05's and T07's", end-topicEnd)
	}
	f.waitFor("T05 and T07 applied", func(s consumer.Stats) bool { return s.Applied == 4+3 })
	if got := f.ledger(); got["T03"] != 1 || got["T05"] != 1 || got["T06"] != 0 || got["T07"] != 1 {
		t.Errorf("ledger %v", got)
	}
}

// TestConsoleRefusesAPlanSentMeanwhile: "Redrive 1 letter(s)" whose letter
// another redrive sent meanwhile is refused as stale (it used to send
// nothing and say "Done").
func TestConsoleRefusesAPlanSentMeanwhile(t *testing.T) {
	f := newConsoleFixture(t)
	f.fix("T03")
	body, tok := f.dryRun(t, "/redrive")
	if !strings.Contains(body, "Redrive 1 letter(s)") {
		t.Fatalf("the dry run of T03:\n%s", body)
	}
	if got := actions(f.redrive(exitOK)); !slices.Equal(got, []string{"T03 sent"}) {
		t.Fatalf("the redrive between: %v", got)
	}
	topicEnd := f.end(f.topic)
	code, body := f.confirm(t, tok, nil)
	if code != http.StatusConflict || !strings.Contains(body, "stale plan") {
		t.Errorf("confirm a plan whose letter was sent since: %d\n%s", code, body)
	}
	if end := f.end(f.topic); end != topicEnd {
		t.Errorf("a stale plan sent %d copies", end-topicEnd)
	}
}
