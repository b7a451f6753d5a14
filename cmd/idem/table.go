package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/dedup"
)

// rowJSON is a dedup row as --json prints it.
type rowJSON struct {
	Scope   string `json:"scope"`
	Key     string `json:"key"`
	Outcome string `json:"outcome"`
	// Cause is a failed row's consumer.Cause, as the dead letter it was
	// recorded with and the metrics name it: permanent (the only failure
	// the consumer records). Empty for a done row.
	Cause       string     `json:"cause,omitempty"`
	Reason      string     `json:"reason,omitempty"`
	Source      string     `json:"source,omitempty"`
	Fingerprint string     `json:"fingerprint"`
	CreatedAt   time.Time  `json:"created_at"`
	ExpiresAt   *time.Time `json:"expires_at"` // null: kept for ever
}

func toJSON(rows []dedup.Row) []rowJSON {
	out := make([]rowJSON, 0, len(rows))
	for _, r := range rows {
		j := rowJSON{Scope: r.Key.Scope, Key: r.Key.ID, Outcome: r.Outcome, Cause: causeOf(r), Reason: r.Reason, Source: r.Source,
			Fingerprint: hex.EncodeToString(r.Fingerprint[:]), CreatedAt: r.CreatedAt.UTC()}
		if !r.ExpiresAt.IsZero() {
			exp := r.ExpiresAt.UTC()
			j.ExpiresAt = &exp
		}
		out = append(out, j)
	}
	return out
}

// causeOf is the cause a row's dead letter carried: the consumer records a
// failure only for consumer.CausePermanent; a later message with the key
// is dead-lettered as CauseFailedBefore, a repeat, and adds no row.
func causeOf(r dedup.Row) string {
	if r.Outcome == "failed" {
		return consumer.CausePermanent.String()
	}
	return ""
}

func printRows(e *env, rows []dedup.Row) { writeRows(e.stdout, rows) }

func writeRows(w io.Writer, rows []dedup.Row) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SCOPE\tKEY\tOUTCOME\tAGE\tSOURCE\tREASON")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", inert(r.Key.Scope), inert(r.Key.ID), r.Outcome, age(r.CreatedAt), inert(r.Source), oneLine(r.Reason, 80))
	}
	tw.Flush()
}

// oneLine is s on one line, inert, cut to n characters.
func oneLine(s string, n int) string {
	s = inert(strings.Join(strings.Fields(s), " "))
	if utf8.RuneCountInString(s) > n {
		s = string([]rune(s)[:n-1]) + "…"
	}
	return s
}

func runMigrate(ctx context.Context, e *env, fs *flag.FlagSet, args []string) int {
	var sf storeFlags
	sf.register(fs, e)
	admin, closeStore, code, ok := sf.parseOpen(ctx, e, fs, args, true)
	if !ok {
		return code
	}
	defer closeStore()
	if err := admin.Migrate(ctx); err != nil {
		return fail(e, err)
	}
	if sf.json {
		printJSON(e, map[string]any{"migrated": sf.table})
	} else {
		fmt.Fprintf(e.stdout, "migrated %s\n", sf.table)
	}
	return exitOK
}

type summaryJSON struct {
	Scope        string    `json:"scope"`
	Outcome      string    `json:"outcome"`
	Rows         int64     `json:"rows"`
	Expired      int64     `json:"expired"`
	OldestKey    string    `json:"oldest_key"`
	OldestAt     time.Time `json:"oldest_at"`
	RetentionSec float64   `json:"retention_seconds"` // the longest among the rows
	Forever      bool      `json:"forever"`           // some rows are kept for ever
	// Kind is "consumer", or "http" for HTTP Idempotency-Keys: rows that
	// hold a request's state, Finished (a response stored) or Processing
	// (a leased request without an outcome yet); Stuck are the Processing
	// ones whose lease ran out.
	Kind       string `json:"kind"`
	Finished   int64  `json:"finished,omitempty"`
	Processing int64  `json:"processing,omitempty"`
	Stuck      int64  `json:"stuck,omitempty"`
}

func runStatus(ctx context.Context, e *env, fs *flag.FlagSet, args []string) int {
	var sf storeFlags
	sf.register(fs, e)
	admin, closeStore, code, ok := sf.parseOpen(ctx, e, fs, args, false)
	if !ok {
		return code
	}
	defer closeStore()
	sum, err := admin.Summary(ctx)
	if err != nil {
		return fail(e, err)
	}
	if sf.json {
		out := make([]summaryJSON, 0, len(sum))
		for _, s := range sum {
			out = append(out, summaryJSON{s.Scope, s.Outcome, s.Rows, s.Expired, s.OldestKey, s.OldestAt.UTC(), s.Retention.Seconds(), s.Forever,
				scopeTotal{s}.kind(), s.Finished, s.Processing, s.Stuck})
		}
		printJSON(e, out)
		return exitOK
	}
	if len(sum) == 0 {
		fmt.Fprintln(e.stdout, "no rows")
		return exitOK
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "SCOPE\tOUTCOME\tROWS\tEXPIRED\tOLDEST\tRETENTION\t OLDEST KEY\t")
	for _, s := range sum {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\t %s\t\n", inert(s.Scope), s.Outcome, s.Rows, s.Expired, age(s.OldestAt), retention(s), inert(s.OldestKey))
	}
	tw.Flush()
	printRequests(e, sum)
	return exitOK
}

// printRequests lists the HTTP scopes' requests by state, and says what a
// stuck one is.
func printRequests(e *env, sum []dedup.ScopeSummary) {
	scopes := scopeTotals(sum)
	var stuck int64
	var names []string
	for _, name := range sortedKeys(scopes) {
		if s := scopes[name]; s.http() {
			names = append(names, name)
			stuck += s.Stuck
		}
	}
	if len(names) == 0 {
		return
	}
	fmt.Fprintln(e.stdout)
	tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "HTTP SCOPE\tFINISHED\tPROCESSING\tSTUCK\t")
	for _, name := range names {
		s := scopes[name]
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t\n", inert(name), s.Finished, s.Processing, s.Stuck)
	}
	tw.Flush()
	if stuck > 0 {
		fmt.Fprintf(e.stdout, "\n%d stuck: requests whose lease ran out without an outcome (the holder crashed or answered 5xx).\n"+
			"The next request with the key takes it over; the store's StuckRequests lists them, ReleaseRequest frees one.\n", stuck)
	}
}

func retention(s dedup.ScopeSummary) string {
	switch {
	case s.Forever:
		return "forever"
	case s.Retention == 0:
		return "-"
	}
	return duration(s.Retention)
}

func runShow(ctx context.Context, e *env, fs *flag.FlagSet, args []string) int {
	var sf storeFlags
	sf.register(fs, e)
	scope := fs.String("scope", e.getenv("IDEM_SCOPE"), "the key's scope, the consumer's Name (env IDEM_SCOPE); empty: every scope")
	pos, code, ok := parse(fs, args)
	if !ok {
		return code
	}
	if len(pos) != 1 {
		return usageErr(e, fs, "want one KEY, got %d arguments", len(pos))
	}
	admin, closeStore, err := sf.open(ctx, false)
	if err != nil {
		return fail(e, err)
	}
	defer closeStore()
	rows, err := admin.Find(ctx, *scope, pos[0])
	if err != nil {
		return fail(e, err)
	}
	if sf.json {
		printJSON(e, toJSON(rows))
	} else {
		for i, r := range rows {
			if i > 0 {
				fmt.Fprintln(e.stdout)
			}
			exp := "never"
			if !r.ExpiresAt.IsZero() {
				exp = r.ExpiresAt.UTC().Format(time.RFC3339) + " (in " + duration(time.Until(r.ExpiresAt)) + ")"
			}
			fmt.Fprintf(e.stdout, "scope        %s\nkey          %s\noutcome      %s\ncreated      %s (%s ago)\nexpires      %s\nfingerprint  %x\nsource       %s\n",
				inert(r.Key.Scope), inert(r.Key.ID), r.Outcome, r.CreatedAt.UTC().Format(time.RFC3339), age(r.CreatedAt), exp, r.Fingerprint[:], inert(r.Source))
			if r.Reason != "" {
				fmt.Fprintf(e.stdout, "reason       %s\n", inert(r.Reason))
			}
		}
	}
	if len(rows) == 0 {
		fmt.Fprintf(e.stderr, "idem: key %q not found\n", pos[0])
		return exitPartial
	}
	return exitOK
}

func runFailed(ctx context.Context, e *env, fs *flag.FlagSet, args []string) int {
	var sf storeFlags
	sf.register(fs, e)
	var f dedup.RowFilter
	fs.StringVar(&f.Scope, "scope", e.getenv("IDEM_SCOPE"), "only this scope (env IDEM_SCOPE)")
	fs.DurationVar(&f.OlderThan, "older-than", 0, "only rows at least this old (e.g. 24h)")
	fs.DurationVar(&f.NewerThan, "newer-than", 0, "only rows at most this old")
	fs.StringVar(&f.Reason, "reason", "", "only rows whose reason contains this text")
	fs.IntVar(&f.Limit, "limit", 100, "at most this many rows, oldest first")
	admin, closeStore, code, ok := sf.parseOpen(ctx, e, fs, args, false)
	if !ok {
		return code
	}
	defer closeStore()
	rows, err := admin.Failed(ctx, f)
	if err != nil {
		return fail(e, err)
	}
	if sf.json {
		printJSON(e, toJSON(rows))
		return exitOK
	}
	if len(rows) == 0 {
		fmt.Fprintln(e.stdout, "no failed rows")
		return exitOK
	}
	printRows(e, rows)
	fmt.Fprintf(e.stdout, "\n%d failed keys, one incident each: the dead letter with idem-cause=%s (idem_consumer_dead_letters_total{idem_dead_letter_cause=%q}).\n"+
		"A later message with one of these keys is dead-lettered as %s, a repeat counted apart, until the key is released.\n",
		len(rows), consumer.CausePermanent, consumer.CausePermanent.String(), consumer.CauseFailedBefore)
	return exitOK
}

func runRelease(ctx context.Context, e *env, fs *flag.FlagSet, args []string) int {
	var sf storeFlags
	sf.register(fs, e)
	scope := fs.String("scope", e.getenv("IDEM_SCOPE"), "the keys' scope, the consumer's Name (env IDEM_SCOPE); required")
	dry := fs.Bool("dry-run", false, "show what would be released; change nothing")
	yes := fs.Bool("yes", false, "do not ask")
	pos, code, ok := parse(fs, args)
	if !ok {
		return code
	}
	switch {
	case *scope == "":
		return usageErr(e, fs, "--scope is required: a key is released in one scope")
	case len(pos) == 0:
		return usageErr(e, fs, "no KEY given")
	}
	keys := make([]dedup.Key, len(pos))
	for i, id := range pos {
		keys[i] = dedup.Key{Scope: *scope, ID: id}
	}
	admin, closeStore, err := sf.open(ctx, false)
	if err != nil {
		return fail(e, err)
	}
	defer closeStore()
	rows, err := admin.Release(ctx, keys, true)
	if err != nil {
		return fail(e, err)
	}
	if !*dry && len(rows) > 0 {
		if !*yes {
			if !sf.json {
				printRows(e, rows)
			}
			if !confirm(e, fmt.Sprintf("release %d failed key(s) in %s, so that their next message runs the handler again?", len(rows), inert(*scope))) {
				fmt.Fprintln(e.stderr, "idem: not confirmed; nothing released (--yes does not ask)")
				return exitNotConfirmed
			}
			// Bound to the rows shown, as the console's release is: a
			// row recorded again while the question waited is not
			// released unseen.
			now, err := admin.Release(ctx, keys, true)
			if err != nil {
				return fail(e, err)
			}
			if rowsDigest(now) != rowsDigest(rows) {
				fmt.Fprintln(e.stderr, "idem: the failed rows changed since they were shown (a new incident, or released already); nothing released: run again")
				return exitPartial
			}
		}
		if rows, err = admin.Release(ctx, keys, false); err != nil {
			return fail(e, err)
		}
	}
	missing := notReleased(pos, rows)
	code = exitOK
	if len(missing) > 0 {
		code = exitPartial
	}
	if !*dry && len(rows) > 0 {
		outcome := outcomeOK
		if len(missing) > 0 {
			outcome = outcomePartial + ": not released, no failed row: " + strings.Join(missing, " ")
		}
		code = cliRecord(ctx, e, admin, "release", map[string]any{"scope": *scope, "keys": pos, "released": toJSON(rows)}, outcome, code)
	}
	if sf.json {
		printJSON(e, map[string]any{"dry_run": *dry, "released": toJSON(rows), "not_failed": missing})
	} else {
		writeReleased(e.stdout, rows, *dry)
	}
	if len(missing) > 0 {
		fmt.Fprintf(e.stderr, "idem: not released, no failed row in %s (not found, or done): %s\n", inert(*scope), strings.Join(inertAll(missing), " "))
	}
	return code
}

// notReleased returns the ids that rows, the released rows, do not hold:
// keys that were not failed or not there, which release leaves alone.
func notReleased(ids []string, rows []dedup.Row) []string {
	released := map[string]bool{}
	for _, r := range rows {
		released[r.Key.ID] = true
	}
	var missing []string
	for _, id := range ids {
		if !released[id] {
			missing = append(missing, id)
		}
	}
	return missing
}

// rowsDigest identifies rows as shown: each one's key, outcome, creation,
// fingerprint, source and reason. A release confirmed from a dry run
// goes ahead only while the rows' digest is the one shown.
func rowsDigest(rows []dedup.Row) string {
	parts := make([]string, len(rows))
	for i, r := range rows {
		parts[i] = strings.Join([]string{r.Key.Scope, r.Key.ID, r.Outcome, r.CreatedAt.UTC().Format(time.RFC3339Nano),
			hex.EncodeToString(r.Fingerprint[:]), r.Source, r.Reason}, "\x00")
	}
	sort.Strings(parts)
	sum := sha256.Sum256([]byte(strings.Join(parts, "\x01")))
	return hex.EncodeToString(sum[:])
}

// writeReleased prints the failed rows released (dry: that would be):
// idem release's output, the console's too.
func writeReleased(w io.Writer, rows []dedup.Row, dry bool) {
	verb := "released"
	if dry {
		verb = "would release"
	}
	for _, r := range rows {
		fmt.Fprintf(w, "%s %s %s (failed %s ago: %s)\n", verb, inert(r.Key.Scope), inert(r.Key.ID), age(r.CreatedAt), oneLine(r.Reason, 100))
	}
}

func runPurge(ctx context.Context, e *env, fs *flag.FlagSet, args []string) int {
	var sf storeFlags
	sf.register(fs, e)
	limit := fs.Int("limit", 1000, "rows per batch (one short transaction each)")
	maxBatches := fs.Int("max-batches", 0, "stop after this many batches; 0: until no expired row is left")
	if _, code, ok := parse(fs, args); !ok {
		return code
	}
	if *limit <= 0 {
		return usageErr(e, fs, "--limit must be positive")
	}
	admin, closeStore, err := sf.open(ctx, false)
	if err != nil {
		return fail(e, err)
	}
	defer closeStore()
	total, batches := 0, 0
	for *maxBatches == 0 || batches < *maxBatches {
		n, err := admin.Purge(ctx, *limit)
		if err != nil {
			fmt.Fprintf(e.stderr, "idem: purged %d rows before: %v\n", total, err)
			return cliRecord(ctx, e, admin, "purge", map[string]any{"limit": *limit, "max_batches": *maxBatches, "purged": total, "batches": batches},
				outcomeError+": "+err.Error(), exitError)
		}
		total += n
		batches++
		if n < *limit {
			break
		}
	}
	if code := cliRecord(ctx, e, admin, "purge", map[string]any{"limit": *limit, "max_batches": *maxBatches, "purged": total, "batches": batches}, outcomeOK, exitOK); code != exitOK {
		return code
	}
	if sf.json {
		printJSON(e, map[string]any{"purged": total, "batches": batches})
	} else {
		fmt.Fprintf(e.stdout, "purged %d expired rows in %d batches\n", total, batches)
	}
	return exitOK
}
