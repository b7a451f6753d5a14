package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/idemkit/idem/cmd/idem/internal/redrive"
)

// letterResult is what redrive did with one dead letter.
type letterResult = redrive.Result

type redriveFlags struct {
	broker, brokers, namesrv string
	topic, to, group         string
	max, maxRedrives         int
	release, dry, skip       bool
	plan                     string
	timeout                  time.Duration
}

// redriveOutput is idem redrive --json's output. A dry run's is the
// --plan FILE of the run that executes it.
type redriveOutput struct {
	Letters []letterResult `json:"letters"`
	Counts  map[string]int `json:"counts"`
	DryRun  bool           `json:"dry_run"`
	Plan    *redrive.Plan  `json:"plan,omitempty"` // the plan shown (dry run) or executed
	Digest  string         `json:"digest,omitempty"`
	Error   string         `json:"error,omitempty"`
}

func runRedrive(ctx context.Context, e *env, fs *flag.FlagSet, args []string) int {
	var sf storeFlags
	sf.register(fs, e)
	var f redriveFlags
	fs.StringVar(&f.broker, "broker", "", "the dead-letter topic's broker: kafka or rocketmq; default kafka, or rocketmq when only RocketMQ's name servers are given (--namesrv or IDEM_ROCKETMQ_NAMESRV)")
	fs.StringVar(&f.brokers, "brokers", e.getenv("IDEM_KAFKA_BROKERS"), "Kafka brokers, host:port[,host:port] (env IDEM_KAFKA_BROKERS)")
	fs.StringVar(&f.namesrv, "namesrv", e.getenv("IDEM_ROCKETMQ_NAMESRV"), "RocketMQ name servers, host:port[;host:port] (env IDEM_ROCKETMQ_NAMESRV)")
	fs.StringVar(&f.topic, "topic", "", "the dead-letter topic to read; required (with --plan, the plan's)")
	fs.StringVar(&f.to, "to", "", "send to this topic; default each letter's original topic (idem-original-topic)")
	fs.StringVar(&f.group, "group", redrive.DefaultGroup, "the consumer group whose committed offsets say where the last redrive stopped")
	fs.IntVar(&f.max, "max", 1000, "handle at most this many letters in this run; 0: up to the end")
	fs.IntVar(&f.maxRedrives, "max-redrives", redrive.DefaultMaxRedrives, "refuse a letter redriven this many times already")
	fs.BoolVar(&f.release, "release", false, "release a letter's failed key on the way (as idem release does)")
	fs.BoolVar(&f.dry, "dry-run", false, "show the plan: what a run would do with each letter; send, release and commit nothing")
	fs.BoolVar(&f.skip, "skip", false, "pass refused letters by (commit past them) instead of stopping their partition")
	fs.StringVar(&f.plan, "plan", "", "execute this plan, a dry run's --json output, exactly, or refuse it as stale; the plan sets --topic, --group, --to, --max-redrives, --release and --skip")
	fs.DurationVar(&f.timeout, "timeout", 10*time.Second, "bound of one broker request")
	if _, code, ok := parse(fs, args); !ok {
		return code
	}
	var shown *redrive.Plan
	if f.plan != "" {
		p, err := readPlan(f.plan)
		if err != nil {
			return usageErr(e, fs, "--plan %s: %v", f.plan, err)
		}
		switch {
		case f.dry:
			return usageErr(e, fs, "--plan executes a plan: it takes no --dry-run")
		case f.topic != "" && f.topic != p.Topic:
			return usageErr(e, fs, "--topic %s, but the plan is of %s", f.topic, p.Topic)
		case f.broker != "" && f.broker != p.Broker:
			return usageErr(e, fs, "--broker %s, but the plan is of %s", f.broker, p.Broker)
		}
		shown, f.topic, f.broker = p, p.Topic, p.Broker
	}
	switch {
	case f.topic == "":
		return usageErr(e, fs, "--topic (the dead-letter topic) is required")
	case f.max < 0 || f.maxRedrives < 1:
		return usageErr(e, fs, "--max must not be negative, --max-redrives must be positive")
	}
	broker, code, ok := f.chooseBroker(e, fs)
	if !ok {
		return code
	}
	admin, closeStore, err := sf.open(ctx, false)
	if err != nil {
		return fail(e, err)
	}
	defer closeStore()
	var plan *redrive.Plan
	var res []letterResult
	if shown != nil {
		plan = shown
		res, err = redrive.Execute(ctx, broker, admin, shown)
	} else {
		plan, res, err = redrive.Run(ctx, broker, redrive.Config{Admin: admin, Topic: f.topic, To: f.to, Group: f.group,
			Max: f.max, MaxRedrives: f.maxRedrives, Release: f.release, DryRun: f.dry, Skip: f.skip})
	}
	refused := 0
	for _, r := range res {
		if r.Action == redrive.Refused || r.Action == redrive.Skipped {
			refused++
		}
	}
	if !f.dry && (len(res) > 0 || err != nil) {
		if code := cliRecordRedrive(ctx, e, admin, f, plan, res, err); code != exitOK {
			return code
		}
	}
	if sf.json {
		out := redriveOutput{Letters: res, Counts: redriveCounts(res), DryRun: f.dry, Plan: plan}
		if out.Letters == nil {
			out.Letters = []letterResult{}
		}
		if plan != nil {
			out.Digest = plan.Digest()
		}
		if err != nil {
			out.Error = err.Error()
		}
		printJSON(e, out)
	} else {
		writeRedrive(e.stdout, f.topic, res, err)
		if f.dry && plan != nil && len(plan.Entries) > 0 {
			fmt.Fprintf(e.stdout, "plan %s: --json prints it, and idem redrive --plan FILE executes it as shown\n", plan.Digest())
		}
	}
	var wrong *redrive.WrongBrokerError
	var stale *redrive.StaleError
	switch {
	case errors.As(err, &wrong):
		fmt.Fprintf(e.stderr, "idem: %v\nidem redrive: %s\n", err, wrongBrokerHint(wrong))
		return exitUsage
	case errors.Is(err, redrive.ErrBrokerDeadLetterQueue) || errors.Is(err, redrive.ErrRetryTopic):
		fmt.Fprintln(e.stderr, "idem:", err)
		return exitUsage
	case errors.As(err, &stale) && len(res) == 0:
		fmt.Fprintln(e.stderr, "idem:", inert(err.Error())) // it quotes a letter's key
		return exitNotConfirmed
	case err != nil:
		return fail(e, err)
	case refused > 0:
		if !f.skip && (shown == nil || !shown.Skip) {
			fmt.Fprintln(e.stderr, "idem: letters refused; their partitions stop there: release their keys (idem release) and run again, or --skip them")
		}
		return exitPartial
	}
	return exitOK
}

// readPlan reads a plan: a dry run's --json output, its digest included.
// The digest catches a plan changed by hand or by accident; it is no
// signature (anyone can compute one): what Execute does is bounded by its
// own checks, which allow an operator only to take letters out.
func readPlan(name string) (*redrive.Plan, error) {
	b, err := os.ReadFile(name)
	if err != nil {
		return nil, err
	}
	var out redriveOutput
	if err := json.Unmarshal(b, &out); err != nil {
		return nil, err
	}
	switch {
	case out.Plan == nil:
		return nil, errors.New("no plan in it: give the output of idem redrive --dry-run --json")
	case out.Digest != "" && out.Digest != out.Plan.Digest():
		// The digest names the plan as printed; a plan edited by hand (letters
		// skipped or held) leaves it out. What an edit may do is checked
		// whatever the digest says: take letters out, never put one in
		// (redrive.Execute).
		return nil, fmt.Errorf("the plan's digest is %s, not %s: it was changed; an edited plan (letters skipped or held) leaves the digest out", out.Plan.Digest(), out.Digest)
	}
	return out.Plan, nil
}

func redriveCounts(res []letterResult) map[string]int {
	counts := map[string]int{}
	for _, r := range res {
		counts[r.Action]++
	}
	return counts
}

// writeRedrive prints what a redrive did (or, dry, would do) with each
// letter of topic, and the counts: idem redrive's output, the console's too.
func writeRedrive(w io.Writer, topic string, res []letterResult, err error) {
	for _, r := range res {
		fmt.Fprintln(w, inert(redriveLine(r))) // a letter's fields come from outside
	}
	counts := redriveCounts(res)
	var parts []string
	for _, a := range sortedKeys(counts) {
		parts = append(parts, fmt.Sprintf("%d %s", counts[a], a))
	}
	if len(parts) == 0 && err == nil {
		parts = append(parts, "nothing to redrive")
	}
	if len(parts) > 0 {
		fmt.Fprintf(w, "%s: %s\n", inert(topic), strings.Join(parts, ", "))
	}
}

func redriveLine(r letterResult) string {
	line := fmt.Sprintf("%-10s %s", r.Action, r.Letter)
	if r.Key != "" {
		line += fmt.Sprintf("  key %s/%s", r.Scope, r.Key)
	}
	if r.To != "" {
		line += "  → " + r.To
	}
	if r.Release {
		line += "  (released)"
	}
	if r.Reason != "" {
		line += ": " + r.Reason
	}
	return line
}

// chooseBroker picks the broker the flags name, with a usage error for a
// broker without addresses.
func (f *redriveFlags) chooseBroker(e *env, fs *flag.FlagSet) (redrive.Broker, int, bool) {
	kind := f.broker
	if kind == "" {
		kind = "kafka"
		if f.brokers == "" && f.namesrv != "" {
			kind = "rocketmq"
		}
	}
	rocketTopic := strings.HasPrefix(f.topic, "%DLQ%") || strings.HasPrefix(f.topic, "%RETRY%")
	switch kind {
	case "kafka":
		switch {
		case rocketTopic:
			return nil, usageErr(e, fs, "--topic %s is a RocketMQ topic: use --broker rocketmq", f.topic), false
		case f.brokers == "" && f.namesrv != "":
			return nil, usageErr(e, fs, "no Kafka brokers: set --brokers or IDEM_KAFKA_BROKERS (--namesrv is RocketMQ's: --broker rocketmq)"), false
		case f.brokers == "":
			return nil, usageErr(e, fs, "no brokers: set --brokers or IDEM_KAFKA_BROKERS"), false
		case strings.Contains(f.brokers, "@"):
			return nil, usageErr(e, fs, errBrokerCredentials), false
		}
		return redrive.Kafka{Brokers: addrs(f.brokers), Timeout: f.timeout}, 0, true
	case "rocketmq":
		switch {
		case f.namesrv == "" && f.brokers != "":
			return nil, usageErr(e, fs, "no RocketMQ name servers: set --namesrv or IDEM_ROCKETMQ_NAMESRV (--brokers are Kafka's)"), false
		case f.namesrv == "":
			return nil, usageErr(e, fs, "no name servers: set --namesrv or IDEM_ROCKETMQ_NAMESRV"), false
		}
		return redrive.RocketMQ{NameServers: addrs(f.namesrv), Timeout: f.timeout}, 0, true
	}
	return nil, usageErr(e, fs, "--broker %q: kafka or rocketmq", f.broker), false
}

// addrs splits host:port lists at commas and semicolons (RocketMQ's own
// separator).
// errBrokerCredentials refuses a broker list with user:password@ in it,
// without repeating it: idem connects to brokers without credentials.
const errBrokerCredentials = "--brokers: a broker is host:port, without user:password@ (not shown); idem does not log in to Kafka"

func addrs(s string) []string {
	var out []string
	for _, a := range strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ';' }) {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, a)
		}
	}
	return out
}

func wrongBrokerHint(w *redrive.WrongBrokerError) string {
	switch {
	case w.Want == "kafka" && w.Seems == "a RocketMQ name server":
		return "for a RocketMQ dead-letter topic, give the name servers with --namesrv (and --broker rocketmq when --brokers is set too)"
	case w.Want == "kafka":
		return "for a RocketMQ dead-letter topic, use --broker rocketmq and --namesrv with the name server's address, not a broker's"
	case w.Seems == "a Kafka broker":
		return "for a Kafka dead-letter topic, use --broker kafka and --brokers"
	}
	return "give the name server's address (port 9876 by default), not a broker's"
}
