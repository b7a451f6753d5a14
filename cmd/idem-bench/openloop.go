package main

// The open-loop rows (issue 41, "Latency under open-loop load"): a producer
// offers a fixed rate to a fresh, empty topic while the row consumes it,
// and the latency of each message runs from its produce time to the
// commit of its effect.
//
//	bin/idem-bench -rows watermill-tuned,idem-b1,idem-b100,idem-offsets -offered 0.25,0.5,0.9
//	bin/idem-bench -rows watermill-tuned,idem-b100 -rate 1000,5000
//
// -offered takes fractions of each row's capacity as measured by its
// closed-loop run in the same invocation; -rate takes rates in messages a
// second, the same for every row. Each open-loop row is named
// row@level ("idem-b100@50%", "sarama@1000/s").
//
// Produce time is the time the message was scheduled for, not the time
// the producer got to it (a producer that falls behind does not hide the
// wait, "coordinated omission"); it travels in the payload ("t", Unix
// nanoseconds), and every key is unique, so every message has an effect.
// The end is where each row's closed-loop latency ends: after the
// transaction commits (idem: when the engine acknowledges the batch it
// committed). The messages scheduled in the first -open-warmup (the
// consumer group joining) are consumed but not timed.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	kafkago "github.com/segmentio/kafka-go"
)

type openSettings struct {
	Offered []float64     `json:"offered,omitempty"`     // fractions of each row's capacity
	Rates   []float64     `json:"rates,omitempty"`       // messages a second
	For     time.Duration `json:"open_for_ns,omitempty"` // timed part of each open-loop row
	Rows    string        `json:"open_rows,omitempty"`
	Warmup  time.Duration `json:"open_warmup_ns,omitempty"`

	offered, rates string
}

func openFlags(o *openSettings) {
	flag.StringVar(&o.offered, "offered", "", "open-loop rows: offer these fractions of each row's measured capacity, e.g. 0.25,0.5,0.9 (the row must be in -rows); latency from produce to effect commit")
	flag.StringVar(&o.rates, "rate", "", "open-loop rows: offer these rates in messages a second to every open-loop-capable row in -rows, e.g. 1000,5000")
	flag.StringVar(&o.Rows, "open-rows", "", "open-loop rows: run only these of -rows open-loop; default: every one that can ("+strings.Join(openRows, ", ")+")")
	flag.DurationVar(&o.For, "open-for", 20*time.Second, "open-loop rows: how long each offers its rate after the warm-up")
	flag.DurationVar(&o.Warmup, "open-warmup", 5*time.Second, "open-loop rows: produced at the rate but not timed, while the consumer group joins")
}

// openRows are the rows that can run open-loop: those that read the Kafka
// topic of e.topic.
var openRows = []string{"raw", "naive", "watermill", "watermill-tuned", "sarama", "idem-b1", "idem-b100", "idem-handler-b100", "idem-offsets", "idem-handler-offsets"}

func (s settings) openLoop() bool { return len(s.Offered)+len(s.Rates) > 0 }

// checkOpen parses the open-loop flags into s.
func checkOpen(s *settings) error {
	o := &s.openSettings
	var err error
	if o.Offered, err = parseRates("-offered", o.offered); err != nil {
		return err
	}
	if o.Rates, err = parseRates("-rate", o.rates); err != nil {
		return err
	}
	for _, f := range o.Offered {
		if f > 1 {
			return fmt.Errorf("-offered %v: a fraction of the capacity, at most 1", f)
		}
	}
	for r := range strings.SplitSeq(o.Rows, ",") {
		if r != "" && !slices.Contains(openRows, r) {
			return fmt.Errorf("-open-rows: %q cannot run open-loop; these can: %s", r, strings.Join(openRows, ", "))
		}
	}
	if s.openLoop() && (o.For <= 0 || o.Warmup < 0) {
		return fmt.Errorf("-open-for %v, -open-warmup %v: want a positive duration and one not negative", o.For, o.Warmup)
	}
	return nil
}

func parseRates(name, v string) ([]float64, error) {
	if v == "" {
		return nil, nil
	}
	var out []float64
	for f := range strings.SplitSeq(v, ",") {
		x, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || x <= 0 {
			return nil, fmt.Errorf("%s %q: want positive numbers separated by commas", name, v)
		}
		out = append(out, x)
	}
	return out, nil
}

// openRun is the open-loop row being run.
type openRun struct {
	from time.Time // payloads produced before it are not timed
}

// The payload of an open-loop message: the closed-loop payload's txn_id
// first (the Kafka key is its digits, p[11:24]), then its produce time in
// Unix nanoseconds, 19 digits at p[31:50].
const (
	openStamp    = `{"txn_id":"T000000000000","t":"`
	openStampLen = 19
)

// producedAt is the produce time an open-loop payload carries.
func producedAt(p []byte) (time.Time, bool) {
	if len(p) < len(openStamp)+openStampLen || string(p[24:len(openStamp)]) != openStamp[24:] {
		return time.Time{}, false
	}
	ns, err := strconv.ParseInt(string(p[len(openStamp):len(openStamp)+openStampLen]), 10, 64)
	if err != nil {
		return time.Time{}, false
	}
	return time.Unix(0, ns), true
}

// openPayloads makes n payloads of about size bytes, every key unique,
// their produce time still zeros.
func openPayloads(n, size int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		p := fmt.Sprintf(`{"txn_id":"T%012d","t":"%019d","order_id":"O-%d","amount":%d,"pad":""}`, i, 0, i, 100+i%10000)
		if pad := size - len(p); pad > 0 {
			p = strings.Replace(p, `"pad":""`, `"pad":"`+strings.Repeat("x", pad)+`"`, 1)
		}
		out[i] = []byte(p)
	}
	return out
}

// stamp writes t into an open-loop payload.
func stamp(p []byte, t time.Time) {
	var b [openStampLen]byte
	copy(p[len(openStamp):], fmt.Appendf(b[:0], "%019d", t.UnixNano()))
}

// produceAt writes payloads to topic at rate messages a second from t0,
// each stamped with the time it was due.
func produceAt(ctx context.Context, brokers []string, topic string, payloads [][]byte, rate float64, t0 time.Time) error {
	w := &kafkago.Writer{Addr: kafkago.TCP(brokers...), Topic: topic, Balancer: &kafkago.Hash{}, BatchSize: 1000,
		BatchBytes: 4 << 20, BatchTimeout: time.Millisecond, RequiredAcks: kafkago.RequireOne}
	defer w.Close()
	due := func(i int) time.Time { return t0.Add(time.Duration(float64(i) / rate * float64(time.Second))) }
	msgs := make([]kafkago.Message, 0, 1000)
	timer := time.NewTimer(0)
	defer timer.Stop()
	for i := 0; i < len(payloads); {
		now := time.Now()
		j := i
		for j < len(payloads) && j-i < 1000 && !due(j).After(now) {
			j++
		}
		if j == i {
			timer.Reset(due(i).Sub(now))
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-timer.C:
			}
			continue
		}
		msgs = msgs[:0]
		for k := i; k < j; k++ {
			stamp(payloads[k], due(k))
			msgs = append(msgs, kafkago.Message{Key: payloads[k][11:24], Value: payloads[k]})
		}
		if err := w.WriteMessages(ctx, msgs...); err != nil {
			return fmt.Errorf("open-loop producer: %w", err)
		}
		i = j
	}
	return nil
}

// benchOpen runs the open-loop rows: for each level, each open-loop-capable
// row of names at that rate, on a topic of its own.
func benchOpen(ctx context.Context, e *env, names []string, capacity map[string]Row) ([]Row, error) {
	s := e.s
	type level struct {
		label string
		rate  func(row string) float64
	}
	var levels []level
	for _, f := range s.Offered {
		levels = append(levels, level{fmt.Sprintf("%g%%", 100*f), func(row string) float64 { return f * capacity[row].PerSecond }})
	}
	for _, r := range s.Rates {
		levels = append(levels, level{fmt.Sprintf("%g/s", r), func(string) float64 { return r }})
	}
	var out []Row
	for _, l := range levels {
		for _, name := range names {
			if !slices.Contains(openRows, name) || s.openSettings.Rows != "" && !slices.Contains(strings.Split(s.openSettings.Rows, ","), name) {
				continue
			}
			rate := l.rate(name)
			if rate <= 0 {
				continue
			}
			r, err := runOpen(ctx, e, name, rate)
			r.Name = name + "@" + l.label
			out = append(out, r)
			if err != nil {
				return out, fmt.Errorf("%s: %w", r.Name, err)
			}
		}
	}
	return out, nil
}

// runOpen runs row name at rate messages a second on a fresh topic.
func runOpen(ctx context.Context, e *env, name string, rate float64) (Row, error) {
	s := e.s
	n := max(1, int(rate*(s.Warmup+s.For).Seconds()))
	topic := fmt.Sprintf("%s-open-%s-%d", e.topic, name, time.Now().UnixNano())
	if err := prefill(ctx, e.brokers, topic, s.Partitions, nil); err != nil {
		return Row{Name: name}, fmt.Errorf("creating topic %s: %w", topic, err)
	}
	payloads := openPayloads(n, s.Size)
	fmt.Fprintf(e.log, "open loop: %s at %.0f msg/s, %d messages (%v warm-up, %v timed)...\n", name, rate, n, s.Warmup, s.For)

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	t0 := time.Now()
	produced := make(chan error, 1)
	go func() { produced <- produceAt(ctx, e.brokers, topic, payloads, rate, t0) }()

	topic0 := e.topic
	e.topic, e.open = topic, &openRun{from: t0.Add(s.Warmup)}
	defer func() { e.topic, e.open = topic0, nil }()
	r, err := runRow(ctx, e, name, n)
	if err != nil {
		cancel()
	}
	err = errors.Join(err, <-produced)
	r.Offered = rate
	if err == nil && r.Effects != int64(n) && name != "raw" {
		err = fmt.Errorf("%d effects for %d messages of unique keys", r.Effects, n)
	}
	fmt.Fprintf(e.log, "  p50 %.2f ms, p99 %.2f ms, p999 %.2f ms\n", r.P50Ms, r.P99Ms, r.P999Ms)
	return r, err
}

func printOpen(w io.Writer, s settings, rows []Row) {
	if len(rows) == 0 {
		return
	}
	fmt.Fprintf(w, "\nopen loop: each row offered its rate for %v after a %v warm-up, on a topic of its own, every key unique; latency from produce (the time the message was due) to the commit of its effect\n\n", s.For, s.Warmup)
	fmt.Fprintf(w, "| row | offered msg/s | messages | msg/s | Postgres CPU s/100k | machine busy | p50 ms | p99 ms | p999 ms | effects |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range rows {
		fmt.Fprintf(w, "| %s | %.0f | %d | %.0f | %.2f | %.0f%% | %.2f | %.2f | %.2f | %d |\n", r.Name, r.Offered, r.Messages, r.PerSecond,
			r.DBCPU100k, 100*r.MachineBusy, r.P50Ms, r.P99Ms, r.P999Ms, r.Effects)
	}
}
