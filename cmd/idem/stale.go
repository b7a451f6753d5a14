package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/idemkit/idem/dedup"
)

// Entity order (consumer.Config.Entity): idem stale lists the stale
// events the store recorded — events at or below their entity's watermark,
// not applied — with the entity and both versions, and an entity's
// watermark. A stale event whose key has provider steps that did not fail
// (effect.Do in an attempt rolled back before its entity moved on) is
// shown with them: its effect may have happened, and nothing booked it.
// The consumer dead-letters such an event in doubt after its commit; the
// store's record is what is left when that letter was lost to a crash.

// staleLister is what idem stale needs of a store that keeps entity
// watermarks (dedup.Watermarks, whatever its transaction type).
type staleLister interface {
	StaleEvents(ctx context.Context, f dedup.StaleFilter) ([]dedup.StaleEvent, error)
	Watermark(ctx context.Context, scope, entity string) (dedup.Version, bool, error)
}

// staleJSON is a stale event as --json prints it.
type staleJSON struct {
	Scope     string    `json:"scope"`
	Key       string    `json:"key"`
	Entity    string    `json:"entity"`
	Version   string    `json:"version"`   // the event's, major.minor
	Watermark string    `json:"watermark"` // the entity's when the event came
	At        time.Time `json:"at"`
	// Steps are the provider steps of the event's key that did not fail:
	// effects that may have happened and are not booked.
	Steps []staleStepJSON `json:"steps,omitempty"`
}

// staleStepJSON is a provider step of a stale event's key.
type staleStepJSON struct {
	Step        string `json:"step"`
	State       string `json:"state"`
	ProviderKey string `json:"provider_key"`
}

// runStale lists recorded stale events.
func runStale(ctx context.Context, e *env, fs *flag.FlagSet, args []string) int {
	var sf storeFlags
	sf.register(fs, e)
	var f dedup.StaleFilter
	fs.StringVar(&f.Scope, "scope", e.getenv("IDEM_SCOPE"), "only this scope (env IDEM_SCOPE)")
	fs.StringVar(&f.Entity, "entity", "", "only this entity (with --scope: and its watermark)")
	fs.IntVar(&f.Limit, "limit", 100, "at most this many events, the newest first")
	pos, code, ok := parse(fs, args)
	if !ok {
		return code
	}
	if len(pos) > 0 {
		return usageErr(e, fs, "unexpected argument %q", inert(pos[0]))
	}
	if f.Limit <= 0 {
		return usageErr(e, fs, "--limit must be positive")
	}
	st, err := sf.openStore(ctx, false)
	if err != nil {
		return fail(e, err)
	}
	defer st.close()
	marks, ok := st.journal.(staleLister)
	if !ok {
		return fail(e, fmt.Errorf("the store keeps no entity watermarks"))
	}
	evs, err := marks.StaleEvents(ctx, f)
	if err != nil {
		return fail(e, err)
	}
	steps, err := staleSteps(ctx, st.journal, evs)
	if err != nil {
		return fail(e, err)
	}
	if sf.json {
		out := make([]staleJSON, 0, len(evs))
		for i, ev := range evs {
			j := staleJSON{Scope: ev.Key.Scope, Key: ev.Key.ID, Entity: ev.Entity, Version: ev.Version.String(),
				Watermark: ev.Watermark.String(), At: ev.At.UTC()}
			for _, r := range steps[i] {
				j.Steps = append(j.Steps, staleStepJSON{Step: r.Ref.Step, State: r.State.String(), ProviderKey: r.ProviderKey})
			}
			out = append(out, j)
		}
		printJSON(e, out)
		return exitOK
	}
	if f.Scope != "" && f.Entity != "" {
		v, had, err := marks.Watermark(ctx, f.Scope, f.Entity)
		switch {
		case err != nil:
			return fail(e, err)
		case had:
			fmt.Fprintf(e.stdout, "entity %s of scope %s: watermark %s\n\n", inert(f.Entity), inert(f.Scope), v)
		default:
			fmt.Fprintf(e.stdout, "entity %s of scope %s: no watermark (no event applied, or forgotten past retention)\n\n", inert(f.Entity), inert(f.Scope))
		}
	}
	if len(evs) == 0 {
		fmt.Fprintln(e.stdout, "no stale events")
		return exitOK
	}
	writeStale(e.stdout, evs, steps)
	fmt.Fprintf(e.stdout, "\n%d stale events: events at or below their entity's watermark when they came, acknowledged and not applied.\n", len(evs))
	withSteps := 0
	for _, s := range steps {
		if len(s) > 0 {
			withSteps++
		}
	}
	if withSteps > 0 {
		fmt.Fprintf(e.stdout, "%d of them called a provider (STEPS) before their entity moved on: the effect may have happened and nothing booked it; check with the provider and book or reverse it by hand.\n", withSteps)
	}
	return exitOK
}

// staleSteps returns, for each of evs, the provider steps of its key that
// did not fail, from j; none when the store keeps no journal.
func staleSteps(ctx context.Context, j dedup.Journal, evs []dedup.StaleEvent) ([][]dedup.StepRecord, error) {
	out := make([][]dedup.StepRecord, len(evs))
	if j == nil {
		return out, nil
	}
	for i, ev := range evs {
		recs, err := j.Steps(ctx, dedup.StepFilter{Scope: ev.Key.Scope, Key: ev.Key.ID,
			States: []dedup.StepState{dedup.StepPending, dedup.StepSucceeded, dedup.StepUnknown, dedup.StepInDoubt}})
		switch {
		case errors.Is(err, dedup.ErrNoJournal):
			return out, nil
		case err != nil:
			return nil, fmt.Errorf("reading the provider steps of stale event %s/%s: %w", inert(ev.Key.Scope), inert(ev.Key.ID), err)
		}
		out[i] = recs
	}
	return out, nil
}

// writeStale prints stale events as a table, every field from outside
// inert.
func writeStale(w io.Writer, evs []dedup.StaleEvent, steps [][]dedup.StepRecord) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "AT\tSCOPE\tKEY\tENTITY\tVERSION\tWATERMARK\tSTEPS")
	for i, ev := range evs {
		var b strings.Builder
		for k, r := range steps[i] {
			if k > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "%s %s", inert(r.Ref.Step), r.State)
		}
		if b.Len() == 0 {
			b.WriteString("-")
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", ev.At.UTC().Format(time.RFC3339), inert(ev.Key.Scope), inert(ev.Key.ID), inert(ev.Entity),
			ev.Version, ev.Watermark, b.String())
	}
	tw.Flush()
}

// staleView is the console's page of stale events (GET /stale).
type staleView struct {
	Scope, Entity string // the filter
	// Watermark is the entity's, with both Scope and Entity; empty when
	// it has none.
	Watermark string
	Rows      []staleRow
	WithSteps int // rows whose key has provider steps
}

// staleRow is a stale event with its key's provider steps that did not
// fail, as "step state" pairs.
type staleRow struct {
	dedup.StaleEvent
	Steps []string
}

// stale lists the recorded stale events, the newest first, as idem stale
// does (scope and entity in the query filter them), with their keys'
// provider steps that did not fail: an effect that may have happened and
// that nothing booked.
func (c *console) stale(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f := dedup.StaleFilter{Scope: q.Get("scope"), Entity: q.Get("entity"), Limit: 100}
	v := staleView{Scope: f.Scope, Entity: f.Entity}
	p := page{Title: "Stale events", Nav: "stale", Data: &v}
	marks, ok := c.journal.(staleLister)
	if !ok {
		p.Error = "the store keeps no entity watermarks"
		c.render(w, http.StatusOK, "stale", p)
		return
	}
	evs, err := marks.StaleEvents(r.Context(), f)
	var steps [][]dedup.StepRecord
	if err == nil {
		steps, err = staleSteps(r.Context(), c.journal, evs)
	}
	if err == nil && f.Scope != "" && f.Entity != "" {
		var wm dedup.Version
		var had bool
		if wm, had, err = marks.Watermark(r.Context(), f.Scope, f.Entity); had {
			v.Watermark = wm.String()
		}
	}
	if err != nil {
		p.Error = err.Error()
		c.render(w, http.StatusOK, "stale", p)
		return
	}
	for i, ev := range evs {
		row := staleRow{StaleEvent: ev}
		for _, s := range steps[i] {
			row.Steps = append(row.Steps, s.Ref.Step+" "+s.State.String())
		}
		if len(row.Steps) > 0 {
			v.WithSteps++
		}
		v.Rows = append(v.Rows, row)
	}
	c.render(w, http.StatusOK, "stale", p)
}
