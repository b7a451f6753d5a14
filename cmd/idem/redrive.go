package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
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
	timeout                  time.Duration
}

func runRedrive(ctx context.Context, e *env, fs *flag.FlagSet, args []string) int {
	var sf storeFlags
	sf.register(fs, e)
	var f redriveFlags
	fs.StringVar(&f.broker, "broker", "", "the dead-letter topic's broker: kafka or rocketmq; default kafka, or rocketmq when only RocketMQ's name servers are given (--namesrv or IDEM_ROCKETMQ_NAMESRV)")
	fs.StringVar(&f.brokers, "brokers", e.getenv("IDEM_KAFKA_BROKERS"), "Kafka brokers, host:port[,host:port] (env IDEM_KAFKA_BROKERS)")
	fs.StringVar(&f.namesrv, "namesrv", e.getenv("IDEM_ROCKETMQ_NAMESRV"), "RocketMQ name servers, host:port[;host:port] (env IDEM_ROCKETMQ_NAMESRV)")
	fs.StringVar(&f.topic, "topic", "", "the dead-letter topic to read; required")
	fs.StringVar(&f.to, "to", "", "send to this topic; default each letter's original topic (idem-original-topic)")
	fs.StringVar(&f.group, "group", redrive.DefaultGroup, "the consumer group whose committed offsets say where the last redrive stopped")
	fs.IntVar(&f.max, "max", 1000, "handle at most this many letters in this run; 0: up to the end")
	fs.IntVar(&f.maxRedrives, "max-redrives", redrive.DefaultMaxRedrives, "refuse a letter redriven this many times already")
	fs.BoolVar(&f.release, "release", false, "release a letter's failed key on the way (as idem release does)")
	fs.BoolVar(&f.dry, "dry-run", false, "show what would be done; send, release and commit nothing")
	fs.BoolVar(&f.skip, "skip", false, "pass refused letters by (commit past them) instead of stopping their partition")
	fs.DurationVar(&f.timeout, "timeout", 10*time.Second, "bound of one broker request")
	if _, code, ok := parse(fs, args); !ok {
		return code
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
	res, err := redrive.Run(ctx, broker, redrive.Config{Admin: admin, Topic: f.topic, To: f.to, Group: f.group,
		Max: f.max, MaxRedrives: f.maxRedrives, Release: f.release, DryRun: f.dry, Skip: f.skip})
	refused := 0
	for _, r := range res {
		if r.Action == redrive.Refused || r.Action == redrive.Skipped {
			refused++
		}
	}
	if !f.dry && (len(res) > 0 || err != nil) {
		if code := cliRecordRedrive(ctx, e, admin, f, res, err); code != exitOK {
			return code
		}
	}
	if sf.json {
		out := map[string]any{"letters": res, "counts": redriveCounts(res), "dry_run": f.dry}
		if err != nil {
			out["error"] = err.Error()
		}
		printJSON(e, out)
	} else {
		writeRedrive(e.stdout, f.topic, res, err)
	}
	var wrong *redrive.WrongBrokerError
	switch {
	case errors.As(err, &wrong):
		fmt.Fprintf(e.stderr, "idem: %v\nidem redrive: %s\n", err, wrongBrokerHint(wrong))
		return exitUsage
	case errors.Is(err, redrive.ErrBrokerDeadLetterQueue) || errors.Is(err, redrive.ErrRetryTopic):
		fmt.Fprintln(e.stderr, "idem:", err)
		return exitUsage
	case err != nil:
		return fail(e, err)
	case refused > 0:
		if !f.skip {
			fmt.Fprintln(e.stderr, "idem: letters refused; their partitions stop there: release their keys (idem release) and run again, or --skip them")
		}
		return exitPartial
	}
	return exitOK
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
