package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/idemkit/idem/dedup"
)

// Entity order (consumer.Config.Entity): idem stale lists the stale
// events the store recorded — events at or below their entity's watermark,
// not applied — with the entity and both versions, and an entity's
// watermark.

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
	if sf.json {
		out := make([]staleJSON, 0, len(evs))
		for _, ev := range evs {
			out = append(out, staleJSON{Scope: ev.Key.Scope, Key: ev.Key.ID, Entity: ev.Entity, Version: ev.Version.String(),
				Watermark: ev.Watermark.String(), At: ev.At.UTC()})
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
	writeStale(e.stdout, evs)
	fmt.Fprintf(e.stdout, "\n%d stale events: events at or below their entity's watermark when they came, acknowledged and not applied.\n", len(evs))
	return exitOK
}

// writeStale prints stale events as a table, every field from outside
// inert.
func writeStale(w io.Writer, evs []dedup.StaleEvent) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "AT\tSCOPE\tKEY\tENTITY\tVERSION\tWATERMARK")
	for _, ev := range evs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", ev.At.UTC().Format(time.RFC3339), inert(ev.Key.Scope), inert(ev.Key.ID), inert(ev.Entity),
			ev.Version, ev.Watermark)
	}
	tw.Flush()
}
