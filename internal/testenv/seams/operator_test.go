package seams_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/consumer/wire"
	"github.com/idemkit/idem/internal/testenv/kafkatest"
)

// The Kafka mode's operator redrive (issue 37: "operator redrive through
// the planner", checked as "an operator plan executed as shown"): the
// operator runs the idem command as a user does — `idem redrive --dry-run
// --json`, then `idem redrive --plan FILE` — against the run's Kafka and
// Postgres. The planner (cmd/idem/internal/redrive) is internal to the
// command, so the test drives the built binary.

// idemBinary builds cmd/idem once per test binary; idemDir is removed in
// TestMain.
var (
	idemOnce  sync.Once
	idemDir   string
	idemPath  string
	idemBuild error
)

func idemBin(t testing.TB) string {
	idemOnce.Do(func() {
		idemDir, idemBuild = os.MkdirTemp("", "seams-idem-")
		if idemBuild != nil {
			return
		}
		idemPath = filepath.Join(idemDir, "idem")
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		out, err := exec.CommandContext(ctx, "go", "build", "-o", idemPath, "github.com/idemkit/idem/cmd/idem").CombinedOutput()
		if err != nil {
			idemBuild = fmt.Errorf("go build ./cmd/idem: %v\n%s", err, out)
		}
	})
	if idemBuild != nil {
		t.Fatalf("seams: %v", idemBuild)
	}
	return idemPath
}

// removeIdemBin removes the built command, if any.
func removeIdemBin() {
	if idemDir != "" {
		_ = os.RemoveAll(idemDir)
	}
}

// What the operator does with the plan the dry run showed
// (kopOperatorRedrive.choice).
const (
	planAsShown    = iota // executes it as shown
	planSkip              // skips a letter the planner would send or stop at
	planHold              // holds a letter, and the letters after it in its partition
	planNewLetters        // a payment is dead-lettered first: its letter is not in the plan
	planOtherFirst        // another operator's plan is executed first: the plan is stale
	planChoices
)

var planChoiceNames = []string{"executes it as shown", "skips a letter", "holds a letter",
	"executes it after a new letter was written", "executes it after another operator's redrive"}

// kopOperatorRedrive is an operator's redrive through the planner: fix
// the causes (fix) of the poisoned payments with dead letters, or not;
// make the plan (with --release or without); do what choice says; execute
// the plan with --plan. pick chooses the letter skipped or held; late is
// the payment dead-lettered by planNewLetters.
type kopOperatorRedrive struct {
	fix, release bool
	choice, pick int
	late         newPay
}

func (o kopOperatorRedrive) String() string {
	s := "operator redrive through the plan"
	if o.release {
		s += " (--release)"
	}
	if o.fix {
		s = "fix the poisoned payments' cause, " + s
	}
	s += ": the operator " + planChoiceNames[o.choice]
	if o.choice == planSkip || o.choice == planHold {
		s += fmt.Sprintf(" (pick %d)", o.pick)
	}
	if o.choice == planNewLetters {
		s += " (" + o.late.id + ")"
	}
	return s
}

// planDoc is the part of a plan the model reads.
type planDoc struct {
	Group   string `json:"group"`
	Entries []struct {
		Letter  string `json:"letter"`
		Queue   string `json:"queue"`
		Offset  int64  `json:"offset"`
		Scope   string `json:"scope"`
		Key     string `json:"key"`
		Verdict string `json:"verdict"`
	} `json:"entries"`
}

// The plan's verdicts (cmd/idem/internal/redrive/plan.go).
const (
	verdictSend      = "send"
	verdictDuplicate = "skip_duplicate"
	verdictSkip      = "skip"
	verdictStop      = "stop"
)

func (o kopOperatorRedrive) apply(ctx context.Context, r *kafkaRunner) {
	if o.fix {
		r.mu.Lock()
		var fixed []string
		for _, id := range r.order {
			if p := r.pays[id]; p.poisoned && p.letters > 0 {
				p.poisoned = false
				fixed = append(fixed, id)
			}
		}
		r.mu.Unlock()
		for _, id := range fixed {
			r.beh.fix(id)
			r.beh.set(id, false, 0)
			r.resolveInDoubt(ctx, id)
		}
	}
	raw, plan := r.dryRun(ctx, o.release)
	atPlan := r.redriveOffsets(ctx)
	r.checkDoneKeys(ctx, plan)
	shown := plan
	switch o.choice {
	case planSkip, planHold:
		var can []int
		for i, e := range plan.Entries {
			if o.choice == planHold || e.Verdict == verdictSend || e.Verdict == verdictStop {
				can = append(can, i)
			}
		}
		if len(can) == 0 {
			r.count("operator plans without a letter to skip or hold")
			break
		}
		raw, shown = editPlan(r.t, raw, plan.Entries[can[o.pick%len(can)]].Letter, o.choice == planHold)
		r.count("operator plans edited")
	case planNewLetters:
		late := o.late
		late.poisoned, late.flaky = true, 0
		r.produce(late, false)
		if ok, left := r.settle(ctx, false, kafkaSettle); !ok {
			r.t.Fatalf("seams: seed=%d mode=kafka step=%d: %s not dead-lettered after %v: %s", r.rep.seed, r.rep.stepNow(), late.id, kafkaSettle, left)
		}
	case planOtherFirst:
		other, otherPlan := r.dryRun(ctx, o.release)
		r.executePlan(ctx, other, otherPlan, r.redriveOffsets(ctx))
	}
	r.executePlan(ctx, raw, shown, atPlan)
}

// redriveOffsets returns the redrive group's committed offsets of the
// dead-letter topic (-1: none).
func (r *kafkaRunner) redriveOffsets(ctx context.Context) []int64 {
	offs, err := r.admin.Committed(ctx, r.redriveGroup(), r.topic+".dlq")
	if err != nil {
		r.t.Fatalf("seams: the redrive group's offsets: %v", err)
	}
	return offs
}

// idem runs the idem command against the run's Kafka and store, and
// returns its standard output and exit status.
func (r *kafkaRunner) idem(ctx context.Context, args ...string) ([]byte, int) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, idemBin(r.t), args...)
	cmd.Env = append(os.Environ(), "IDEM_KAFKA_BROKERS="+strings.Join(r.brokers, ","), "IDEM_PG_URL="+r.pgURL,
		"IDEM_PG_SCHEMA="+r.schema, "IDEM_PG_PARTITION_WIDTH=", "IDEM_SQLITE=", "IDEM_TABLE=")
	if r.cfg.store == "pg-partitioned" {
		cmd.Env = append(cmd.Env, "IDEM_PG_PARTITION_WIDTH=24h")
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return stdout.Bytes(), 0
	case errors.As(err, &exit) && ctx.Err() == nil:
		if c := exit.ExitCode(); c == 3 || c == 4 {
			return stdout.Bytes(), c
		}
	}
	r.t.Fatalf("seams: seed=%d mode=kafka step=%d: idem %s: %v\n%s%s", r.rep.seed, r.rep.stepNow(), strings.Join(args, " "), err, stdout.Bytes(), stderr.Bytes())
	return nil, 0
}

// redriveGroup is the operator's redrive group: the run's own.
func (r *kafkaRunner) redriveGroup() string { return r.group + "-redrive" }

// dryRun makes the plan: `idem redrive --dry-run --json`.
func (r *kafkaRunner) dryRun(ctx context.Context, release bool) ([]byte, planDoc) {
	args := []string{"redrive", "--topic", r.topic + ".dlq", "--group", r.redriveGroup(), "--dry-run", "--json"}
	if release {
		args = append(args, "--release")
	}
	out, code := r.idem(ctx, args...)
	var doc struct {
		Plan *planDoc `json:"plan"`
	}
	if err := json.Unmarshal(out, &doc); err != nil || doc.Plan == nil || code == 4 { // 3: a letter refused
		r.t.Fatalf("seams: idem %s: exit %d, no plan in its output (%v):\n%s", strings.Join(args, " "), code, err, out)
	}
	return out, *doc.Plan
}

// editPlan skips letter in the dry run's output raw, or holds it (takes
// it and the letters after it in its partition out), as the console and
// Plan.SkipLetter and Plan.Hold do; the digest, which named the plan as
// shown, is left out.
func editPlan(t testing.TB, raw []byte, letter string, hold bool) ([]byte, planDoc) {
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	var plan map[string]any
	dec := json.NewDecoder(bytes.NewReader(doc["plan"]))
	dec.UseNumber()
	if err := dec.Decode(&plan); err != nil {
		t.Fatal(err)
	}
	entries, _ := plan["entries"].([]any)
	var kept []any
	queue := ""
	for _, x := range entries {
		e := x.(map[string]any)
		switch {
		case e["letter"] == letter && hold:
			queue = e["queue"].(string)
			continue
		case hold && queue != "" && e["queue"] == queue:
			continue
		case e["letter"] == letter:
			e["planned"], e["verdict"] = e["verdict"], verdictSkip
			if reason, _ := e["reason"].(string); reason != "" {
				e["reason"] = "skipped by the operator: " + reason
			} else {
				e["reason"] = "skipped by the operator"
			}
		}
		kept = append(kept, e)
	}
	if kept == nil {
		kept = []any{}
	}
	plan["entries"] = kept
	out, err := json.Marshal(map[string]any{"plan": plan})
	if err != nil {
		t.Fatal(err)
	}
	var shown struct{ Plan planDoc }
	if err := json.Unmarshal(out, &shown); err != nil {
		t.Fatal(err)
	}
	return out, shown.Plan
}

// checkDoneKeys: a letter whose key is done (applied) is planned as a
// duplicate, never as a stop or a send.
func (r *kafkaRunner) checkDoneKeys(ctx context.Context, plan planDoc) {
	for _, e := range plan.Entries {
		if e.Key == "" || e.Verdict == verdictDuplicate {
			continue
		}
		rows, err := r.pg.Admin().Find(ctx, e.Scope, e.Key)
		if err != nil {
			r.t.Fatalf("seams: find %s/%s: %v", e.Scope, e.Key, err)
		}
		for _, row := range rows {
			if row.Outcome == "done" && e.Verdict != verdictSkip {
				r.rep.violation(checkPlanDoneKey, e.Letter, "letter %s of key %s/%s, which is done, is planned %s, not %s",
					e.Letter, e.Scope, e.Key, e.Verdict, verdictDuplicate)
			}
		}
	}
}

// redriveCopies counts the copies on the topic that a redrive sent, by
// the letter they came from (idem-redriven-from).
func (r *kafkaRunner) redriveCopies() map[string]int {
	out := map[string]int{}
	for _, m := range r.admin.ReadAll(r.t, r.topic) {
		if from, ok := kafkatest.HeaderOK(m, wire.MetaRedrivenFrom); ok {
			out[from]++
		}
	}
	return out
}

// letterPays maps the dead letters' positions to their payments.
func (r *kafkaRunner) letterPays() map[string]string {
	out := map[string]string{}
	for _, m := range r.admin.ReadAll(r.t, r.topic+".dlq") {
		var pl payload
		_ = json.Unmarshal(m.Value, &pl)
		out[fmt.Sprintf("%s/%d/%d", m.Topic, m.Partition, m.Offset)] = pl.Pay
	}
	return out
}

// executePlan runs `idem redrive --plan FILE` with raw, the plan shown
// (or edited as shown), and checks that it was executed as shown: exactly
// its send entries reached the topic, once each, and the redrive group's
// offsets are where the plan ends; or that it was refused as stale and
// did nothing. atPlan are the redrive group's offsets when the plan was
// made: a plan whose partition moved since is stale.
func (r *kafkaRunner) executePlan(ctx context.Context, raw []byte, plan planDoc, atPlan []int64) {
	file := filepath.Join(r.t.TempDir(), "plan.json")
	if err := os.WriteFile(file, raw, 0o600); err != nil {
		r.t.Fatal(err)
	}
	dlq := r.topic + ".dlq"
	before := r.redriveCopies()
	offsets := r.redriveOffsets(ctx)
	// The payments the plan sends are expected applied once the copies
	// arrive: not dead (a copy that fails again is dead-lettered again).
	pays := r.letterPays()
	wasDead := map[string]bool{}
	r.mu.Lock()
	for _, e := range plan.Entries {
		if p := r.pays[pays[e.Letter]]; p != nil && e.Verdict == verdictSend {
			if _, ok := wasDead[p.id]; !ok {
				wasDead[p.id] = p.dead
			}
			p.dead = false
		}
	}
	r.mu.Unlock()

	out, code := r.idem(ctx, "redrive", "--plan", file, "--json")

	after := r.redriveCopies()
	sent := map[string]int{}
	for l, n := range after {
		if d := n - before[l]; d != 0 {
			sent[l] = d
		}
	}
	now := r.redriveOffsets(ctx)
	r.mu.Lock()
	for id, dead := range wasDead {
		p := r.pays[id]
		n := 0
		for l, c := range sent {
			if pays[l] == id {
				n += c
			}
		}
		if n == 0 && !p.dead {
			p.dead = dead // nothing of it was sent
		}
		p.redrives += n
	}
	r.mu.Unlock()

	if code == 4 {
		r.count("operator plans refused as stale")
		if len(sent) > 0 || !slices.Equal(offsets, now) {
			r.rep.violation(checkPlanStale, plan.Group, "a plan refused as stale (exit 4) sent %v and moved the redrive group's offsets from %v to %v\n\tplan: %s",
				sent, offsets, now, raw)
		}
		return
	}
	r.count("operator plans executed")
	var moved []string
	for _, e := range plan.Entries {
		if q, err := strconv.Atoi(e.Queue); err == nil && q >= 0 && q < len(atPlan) && q < len(offsets) && atPlan[q] != offsets[q] {
			moved = append(moved, fmt.Sprintf("%s/%d from %d to %d", dlq, q, atPlan[q], offsets[q]))
		}
	}
	if len(moved) > 0 {
		slices.Sort(moved)
		moved = slices.Compact(moved)
		r.rep.violation(checkPlanStale, plan.Group, "a stale plan was executed (exit %d): the redrive group's offsets moved since it was made: %s\n\tplan: %s",
			code, strings.Join(moved, ", "), raw)
	}
	want := map[string]bool{}
	ends := slices.Clone(offsets)
	var wrong []string
	for _, e := range plan.Entries {
		if e.Verdict == verdictSend {
			want[e.Letter] = true
		}
		q, err := strconv.Atoi(e.Queue)
		if err != nil || q < 0 || q >= len(ends) {
			wrong = append(wrong, fmt.Sprintf("letter %s of queue %q, not a partition of %s", e.Letter, e.Queue, dlq))
			continue
		}
		ends[q] = e.Offset + 1
		if e.Verdict == verdictStop {
			ends[q] = e.Offset
		}
	}
	for l := range want {
		if sent[l] != 1 {
			wrong = append(wrong, fmt.Sprintf("letter %s planned %s was sent %d times", l, verdictSend, sent[l]))
		}
	}
	for l, n := range sent {
		if !want[l] {
			verdict := "absent from the plan"
			for _, e := range plan.Entries {
				if e.Letter == l {
					verdict = "planned " + e.Verdict
				}
			}
			wrong = append(wrong, fmt.Sprintf("letter %s %s was sent %d times", l, verdict, n))
		}
	}
	if !slices.Equal(ends, now) {
		wrong = append(wrong, fmt.Sprintf("the redrive group's offsets of %s are %v, the plan ends at %v (they were %v)", dlq, now, ends, offsets))
	}
	if len(wrong) > 0 {
		slices.Sort(wrong)
		r.rep.violation(checkPlanExecuted, plan.Group, "the plan was not executed as shown (exit %d): %s\n\tplan: %s\n\toutput: %s",
			code, strings.Join(wrong, "; "), raw, out)
	}
	if len(sent) > 0 {
		r.count("operator redrives sent")
	}
}
