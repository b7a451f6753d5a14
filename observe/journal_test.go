package observe_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/internal/testenv/pgtest"
	"github.com/idemkit/idem/internal/testenv/promtest"
	"github.com/idemkit/idem/observe"
)

// TestJournalGauges watches a real Postgres effect journal: a scrape of
// an empty one lists every state at 0; then steps in each state, one
// pending whose holder's lease runs out, and an operator's resolution:
// idem_effect_steps counts each state as the journal holds it and
// idem_effect_steps_unresolved the unknown, in-doubt and lapsed pending
// ones, as the journal's own Steps lists them, with the age of the oldest
// one's first attempt.
func TestJournalGauges(t *testing.T) {
	pool, schema := testenv.SchemaPool(t)
	ctx := testenv.Context(t, 2*time.Minute)
	store := pgtest.Store(t, pool, schema)
	obs, err := observe.New(observe.Config{Logger: testenv.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer obs.Close(context.Background())
	if err := obs.WatchJournal("refunds", store); err != nil {
		t.Fatal(err)
	}
	if err := obs.WatchJournal("refunds", store); err == nil {
		t.Error("a second journal named refunds: no error")
	}
	base := promtest.Serve(t, obs)
	journal := map[string]string{"idem_journal": "refunds"}
	state := func(s string) map[string]string { return with(journal, "state", s) }

	fams := promtest.Scrape(t, base)
	for st := dedup.StepPending; st <= dedup.StepInDoubt; st++ {
		if v, n := promtest.Sum(fams, "idem_effect_steps", state(st.String())); n != 1 || v != 0 {
			t.Errorf("idem_effect_steps{state=%q} of an empty journal: %d samples, %v", st, n, v)
		}
	}
	for _, name := range []string{"idem_effect_steps_unresolved", "idem_effect_steps_unresolved_oldest_age_seconds"} {
		if v, n := promtest.Sum(fams, name, journal); n != 1 || v != 0 {
			t.Errorf("%s of an empty journal: %d samples, %v", name, n, v)
		}
	}

	// R1 succeeded, R2 failed, R3 and R4 unknown, R5 in doubt, R6 pending
	// under a running lease, R7 pending with a lease that runs out.
	step := func(id string, out dedup.StepState, lease time.Duration) {
		t.Helper()
		ref := dedup.StepRef{Key: dedup.Key{Scope: "refunds", ID: id}, Step: "refund"}
		rec, err := store.BeginStep(ctx, ref, "pk-"+id, dedup.Fingerprint{}, lease)
		if err != nil {
			t.Fatal(err)
		}
		if out != dedup.StepPending {
			if err := store.FinishStep(ctx, ref, rec.Token, dedup.StepOutcome{State: out}); err != nil {
				t.Fatal(err)
			}
		}
	}
	step("R1", dedup.StepSucceeded, time.Minute)
	step("R2", dedup.StepFailed, time.Minute)
	step("R3", dedup.StepUnknown, time.Minute)
	step("R4", dedup.StepUnknown, time.Minute)
	step("R5", dedup.StepInDoubt, time.Minute)
	step("R6", dedup.StepPending, time.Hour)
	step("R7", dedup.StepPending, 50*time.Millisecond)

	want := map[string]float64{"pending": 2, "succeeded": 1, "failed": 1, "unknown": 2, "in_doubt": 1}
	check := func(what string, unresolved float64) {
		t.Helper()
		var age float64
		testenv.WaitUntilProgress(t, 30*time.Second, what, func() (bool, string) {
			fams := promtest.Scrape(t, base)
			got := map[string]float64{}
			for s := range want {
				got[s], _ = promtest.Sum(fams, "idem_effect_steps", state(s))
			}
			u, _ := promtest.Sum(fams, "idem_effect_steps_unresolved", journal)
			age, _ = promtest.Sum(fams, "idem_effect_steps_unresolved_oldest_age_seconds", journal)
			return fmt.Sprint(got) == fmt.Sprint(want) && u == unresolved, fmt.Sprintf("steps %v, unresolved %v", got, u)
		})
		listed, err := store.Steps(ctx, dedup.StepFilter{})
		if err != nil || float64(len(listed)) != unresolved {
			t.Fatalf("%s: the journal lists %d unresolved steps (%v), the gauge %v", what, len(listed), err, unresolved)
		}
		// The oldest unresolved step's age, as read after the scrape: at
		// most that, and more than 0.
		if after := listed[0].SinceFirstAttempt.Seconds(); age <= 0 || age > after {
			t.Errorf("%s: oldest age %v, want in (0, %v] (%s %s)", what, age, after, listed[0].Ref.Key.ID, listed[0].State)
		}
	}
	check("R3, R4, R5 and the lapsed R7 unresolved", 4)

	// An operator resolves R5: succeeded, and no longer unresolved.
	ok, err := store.ResolveStep(ctx, dedup.StepRef{Key: dedup.Key{Scope: "refunds", ID: "R5"}, Step: "refund"}, 0,
		dedup.StepOutcome{State: dedup.StepSucceeded, Result: []byte("ref-5")})
	if err != nil || !ok {
		t.Fatalf("resolve R5: %v, %v", ok, err)
	}
	want["in_doubt"], want["succeeded"] = 0, 2
	check("R5 resolved", 3)
}
