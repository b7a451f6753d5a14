// Command idem operates idem's dedup table: migrate it, see what it holds,
// let failed keys through again, send dead letters back to their topic,
// purge expired rows, and check retention against the duplicates seen.
//
//	idem status                      rows by scope and outcome; HTTP scopes by request state
//	idem release --scope pay 4200…   delete a failed row, after a confirmation
//	idem redrive --topic pay.dlq     send dead letters whose keys were released back
//	idem redrive --broker rocketmq --namesrv 127.0.0.1:9876 --topic pay_DLQ
//	idem retries --topic pay --group pay   copies waiting in retry, by delay (Kafka)
//	idem audit                       the actions executed: who, when, the plan, the outcome
//	idem effects                     provider calls whose outcome is unknown or in doubt
//	idem effects resolve --scope pay --key 4200 --step refund --as succeeded --reference R
//
// Run `idem --help` for every subcommand and its flags. Postgres is chosen
// with --pg or IDEM_PG_URL, SQLite with --sqlite or IDEM_SQLITE; Kafka's
// brokers with --brokers or IDEM_KAFKA_BROKERS, RocketMQ's name servers
// with --namesrv or IDEM_ROCKETMQ_NAMESRV (redrive --broker rocketmq).
// Secrets (the Postgres URL, the console's token, a metrics URL with
// credentials) come from the environment or a file (--pg-file,
// --token-file, --metrics-file), never printed; as arguments, ps shows
// them to every local user.
//
// Exit status: 0 done; 1 an error (the database or broker failed); 2 a
// usage error; 3 done in part: a key not found or not released, a dead
// letter refused, retention below the duplicates seen; 4 not confirmed,
// nothing changed.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/idemkit/idem/adapters/rocketmq"
)

// Exit statuses.
const (
	exitOK           = 0
	exitError        = 1
	exitUsage        = 2
	exitPartial      = 3
	exitNotConfirmed = 4
)

// env is what a command runs with: its streams and the environment.
type env struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	getenv         func(string) string
	interactive    bool // stdin is a terminal: ask before changing anything
}

// command is one subcommand.
type command struct {
	name, args, short string
	long              string
	run               func(ctx context.Context, e *env, fs *flag.FlagSet, args []string) int
}

// commands lists the subcommands, in the order --help shows them.
func commands() []command {
	return []command{
		{"migrate", "", "create or upgrade the dedup table", "Creates the dedup table (and on Postgres its migrations table) when missing, as Store.Migrate does.", runMigrate},
		{"status", "", "rows by scope and outcome, the oldest of each", "Counts the rows by scope and outcome, with the oldest key of each, the rows expired and waiting for purge, and the retention the rows were written with. HTTP scopes (httpidem: rows that hold a request's state) are listed again by state: finished, processing, and stuck — processing past their lease, a holder that crashed or answered 5xx.", runStatus},
		{"show", "KEY", "a key's outcome, when, fingerprint, reason", "Shows the rows of KEY: in --scope, or in every scope (a scan of the table).", runShow},
		{"failed", "", "list failed keys (filter by scope, age, reason)", "Lists failed rows, oldest first: keys whose message failed for good and was dead-lettered, one incident each (its letter's idem-cause is permanent). A later message with such a key is dead-lettered without running the handler, as failed_before, a repeat counted apart in the letters and the metrics, until the row is released. SOURCE names the message as the consumer's logs do: lane/offset, and the broker's message ID where it differs.", runFailed},
		{"release", "KEY...", "delete failed rows, so a redelivery runs again", "Deletes the failed rows of the keys in --scope (never a done row), so that the next message with the key runs the handler. It shows what it will delete and asks first; --yes does not ask, --dry-run only shows.", runRelease},
		{"redrive", "", "send dead letters back to their topic", "Reads a Kafka or RocketMQ dead-letter topic (--broker) from where the last redrive stopped (a consumer group's offsets, --group) to its end as it was at the start, and sends each letter back to its original topic with lineage headers (idem-original-*, idem-redrive-count, idem-redriven-from), by which a consumer keyed by message ID or by offsets deduplicates the copy as the original: a letter redriven twice is applied once. On Kafka a letter goes back to its original partition; on RocketMQ (idem's <topic>_DLQ letters, not the broker's %DLQ%<group>) to its original queue when the topic still has it, else to any queue, and the consumer keys it by the original's message ID. The group's offset passes a letter only once its copy was sent. A letter whose key is done (applied) is a duplicate: passed by, not sent. A letter whose key is failed and not released (unless --release) is refused: its partition or queue stops there, so that a later run starts with it. A letter without a key, or whose value was left out, is refused too (--skip passes refused letters by). --dry-run prints the plan — each letter by position with its verdict — and a run executes the plan it makes; --plan FILE executes a dry run's --json plan exactly, or refuses it as stale (exit 4). An address that answers like the other broker is named as such.", runRedrive},
		{"retries", "", "messages waiting in retry, by delay (Kafka)", "Lists the retry topics of --topic (<topic>.retry.<delay>, consumer.NonBlocking with kafka.Config.RetryDelays) and, per partition, the copies waiting: the end offset less the consumer group's committed offset (--group), and when the oldest of them is due (idem-retry-due). It changes nothing. There is no redrive of retry copies: they come back when due (see docs/retries.md).", runRetries},
		{"effects", "", "provider calls of unknown outcome; resolve one", "Lists the effect journal's unresolved steps (package effect: a handler's calls to a payment provider): unknown (the next delivery reads it back), in_doubt (dead-lettered: it waits for an operator) and pending steps whose holder's lease ran out (a holder that died mid-call), the oldest first attempt first, with their age, provider key, attempts and last error; --state lists others. idem effects resolve records what an operator found out about one, as a plan shown then executed (idem effects resolve --help).", runEffects},
		{"stale", "", "stale events: not applied, older than their entity's watermark", "Lists the stale events the store recorded, the newest first: events of an entity (consumer.Config.Entity) whose version was at or below the entity's watermark when they came, acknowledged and not applied (or dead-lettered with cause stale), with the message's key, the entity, the event's version and the watermark it met. --scope and --entity select; with both, the entity's watermark is shown too. It changes nothing.", runStale},
		{"parked", "", "record keys held in order behind a message in retry", "Lists the record keys the store keeps parked (consumer.NonBlocking.KeyOrdered), the longest parked first: a key with a message in retry, its head, whose later messages follow it into retry untried until each is the head. With each: the head (its original's lane/offset), the messages the key holds (DEPTH), how long ago it was parked and since its head became the head (on this machine's clock), and whether it outlived its limits (EXPIRED: its messages are dead-lettered with cause parked_too_long as they come back, and the key is released with its last). --scope, --topic and --key select. It changes nothing.", runParked},
		{"purge", "", "delete expired rows now", "Deletes the rows past their retention in bounded batches, as a cron job calling Purge would.", runPurge},
		{"console", "", "the store and dead letters in a browser", "Serves an operator console on --addr (127.0.0.1:7464): per scope the rows by state, the duplicate-age histogram and idem retention's advice (--metrics); failed keys with Release; stuck leased HTTP requests with Release; the effect journal's unresolved provider calls with Resolve (as idem effects resolve); the stale events the store recorded, with their provider steps (as idem stale); the keys parked behind a message in retry (as idem parked); the dead letters of --topic by cause with Redrive (--brokers or --namesrv, as idem redrive). A page never changes anything: each action shows its dry run first, and runs on a confirmation carrying a one-time token bound to the session and to what was shown; every action it runs goes to the audit log (idem audit). Every request needs the console's token, on loopback too: IDEM_CONSOLE_TOKEN or --token-file (at least 16 characters), or, on loopback without one, a token it draws and prints once with the URL to open; off loopback it does not start without one. The first visit with ?token=TOKEN trades it for a session cookie; scripts send Authorization: Bearer TOKEN.", runConsole},
		{"audit", "", "the operator actions executed, newest first", "Lists the audit log: every action idem or its console executed (release, redrive and the letters it skipped, purge, resolve-step), who ran it (the OS user, or the console's token name), when, the plan it executed (JSON) and its outcome. It changes nothing.", runAudit},
		{"retention", "", "check retention against the ages of duplicates", "Compares each scope's retention with the ages at which duplicates arrived: from a consumer's Prometheus /metrics (--metrics URL, the histogram idem_consumer_duplicate_age_seconds of consumer/otelconsumer) or, for an HTTP scope, the ages of the retries an HTTP service answered with the stored response (idem_http_replay_age_seconds of httpidem/otelhttpidem). Retention should stay above the 99.9th percentile of those ages, with a margin.", runRetention},
	}
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	fi, err := os.Stdin.Stat()
	interactive := err == nil && fi.Mode()&os.ModeCharDevice != 0
	// The RocketMQ client (redrive --broker rocketmq) logs at INFO to
	// stdout by itself: only its errors, to stderr.
	rocketmq.SetClientLogger(slog.New(slog.NewTextHandler(os.Stderr, nil)), slog.LevelError)
	os.Exit(run(ctx, os.Args[1:], &env{stdin: os.Stdin, stdout: os.Stdout, stderr: os.Stderr, getenv: os.Getenv, interactive: interactive}))
}

func usage(w io.Writer) {
	fmt.Fprint(w, `idem operates idem's dedup table and dead letters.

Usage: idem COMMAND [flags] [args]

Commands:
`)
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-10s %-8s %s\n", c.name, c.args, c.short)
	}
	fmt.Fprint(w, `
The store: --pg URL or IDEM_PG_URL (Postgres; --schema/IDEM_PG_SCHEMA, default
public), or --sqlite PATH or IDEM_SQLITE; --table/IDEM_TABLE, default idem_dedup;
--partition-width/IDEM_PG_PARTITION_WIDTH for a partitioned Postgres table.
Kafka (redrive): --brokers or IDEM_KAFKA_BROKERS, host:port[,host:port].
RocketMQ (redrive --broker rocketmq): --namesrv or IDEM_ROCKETMQ_NAMESRV,
host:port[;host:port].
Every command takes --json: one JSON document on stdout.
Secrets (IDEM_PG_URL, IDEM_CONSOLE_TOKEN, IDEM_METRICS_URL) go in the
environment or a file (--pg-file, --token-file, --metrics-file), not in
arguments, which ps shows to every local user.

Exit status: 0 done; 1 an error; 2 a usage error; 3 done in part (a key not
found or not released, a dead letter refused, retention too short); 4 not
confirmed, nothing changed.

Run 'idem COMMAND --help' for a command's flags.
`)
}

func run(ctx context.Context, args []string, e *env) int {
	if len(args) == 0 {
		usage(e.stderr)
		return exitUsage
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		usage(e.stdout)
		return exitOK
	}
	for _, c := range commands() {
		if c.name != args[0] {
			continue
		}
		fs := flag.NewFlagSet("idem "+c.name, flag.ContinueOnError)
		fs.SetOutput(e.stderr)
		fs.Usage = func() {
			fmt.Fprintf(fs.Output(), "Usage: idem %s [flags] %s\n\n%s\n\nFlags:\n", c.name, c.args, wrap(c.long, 78))
			fs.PrintDefaults()
		}
		return c.run(ctx, e, fs, args[1:])
	}
	fmt.Fprintf(e.stderr, "idem: unknown command %q\n\n", args[0])
	usage(e.stderr)
	return exitUsage
}

// parse parses flags, allowing them after the positional arguments too
// (idem show KEY --scope pay).
func parse(fs *flag.FlagSet, args []string) ([]string, int, bool) {
	var pos []string
	for {
		// The flag package's own message quotes the value given, which
		// may be a secret typed into the wrong flag: say it without.
		out := fs.Output()
		fs.SetOutput(io.Discard)
		err := fs.Parse(args)
		fs.SetOutput(out)
		if err != nil {
			if errors.Is(err, flag.ErrHelp) {
				fs.Usage()
				return nil, exitOK, false
			}
			fmt.Fprintf(out, "%s: %s\n", fs.Name(), flagError(err))
			fs.Usage()
			return nil, exitUsage, false
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, 0, true
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

func fail(e *env, err error) int {
	fmt.Fprintln(e.stderr, "idem:", err)
	return exitError
}

func usageErr(e *env, fs *flag.FlagSet, format string, args ...any) int {
	fmt.Fprintf(e.stderr, "idem %s: %s\n", strings.TrimPrefix(fs.Name(), "idem "), fmt.Sprintf(format, args...))
	return exitUsage
}

func printJSON(e *env, v any) {
	enc := json.NewEncoder(e.stdout)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// confirm asks a yes/no question on stdin; anything but y or yes is no.
func confirm(e *env, question string) bool {
	fmt.Fprintf(e.stderr, "%s [y/N] ", question)
	var answer string
	_, _ = fmt.Fscanln(e.stdin, &answer)
	answer = strings.ToLower(strings.TrimSpace(answer))
	return answer == "y" || answer == "yes"
}

// age prints how long ago t was, roughly.
func age(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return duration(time.Since(t))
}

func duration(d time.Duration) string {
	switch {
	case d < 0:
		return "0s"
	case d < time.Minute:
		return d.Round(time.Second).String()
	case d < time.Hour:
		return d.Round(time.Minute).String()
	case d < 48*time.Hour:
		return strings.TrimSuffix(d.Round(time.Minute).String(), "0s")
	default:
		return fmt.Sprintf("%.1fd", d.Hours()/24)
	}
}

func wrap(s string, width int) string {
	var b strings.Builder
	line := 0
	for _, w := range strings.Fields(s) {
		if line > 0 && line+1+len(w) > width {
			b.WriteByte('\n')
			line = 0
		} else if line > 0 {
			b.WriteByte(' ')
			line++
		}
		b.WriteString(w)
		line += len(w)
	}
	return b.String()
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
