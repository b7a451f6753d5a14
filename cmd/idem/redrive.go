package main

import (
	"context"
	"flag"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/dedup"
)

// letterResult is what redrive did with one dead letter.
type letterResult struct {
	Letter  string `json:"letter"` // dlq/partition/offset
	Scope   string `json:"scope,omitempty"`
	Key     string `json:"key,omitempty"`
	To      string `json:"to,omitempty"` // topic/partition
	Action  string `json:"action"`       // sent, would_send, refused, skipped
	Reason  string `json:"reason,omitempty"`
	Count   int    `json:"redrive_count,omitempty"`
	Release bool   `json:"released,omitempty"` // its failed row was released on the way (--release)
}

type redriveFlags struct {
	brokers, topic, to, group string
	max, maxRedrives          int
	release, dry, skip        bool
	timeout                   time.Duration
}

func runRedrive(ctx context.Context, e *env, fs *flag.FlagSet, args []string) int {
	var sf storeFlags
	sf.register(fs, e)
	var f redriveFlags
	fs.StringVar(&f.brokers, "brokers", e.getenv("IDEM_KAFKA_BROKERS"), "Kafka brokers, host:port[,host:port] (env IDEM_KAFKA_BROKERS)")
	fs.StringVar(&f.topic, "topic", "", "the dead-letter topic to read; required")
	fs.StringVar(&f.to, "to", "", "send to this topic; default each letter's original topic (idem-original-topic)")
	fs.StringVar(&f.group, "group", "idem-redrive", "the consumer group whose committed offsets say where the last redrive stopped")
	fs.IntVar(&f.max, "max", 1000, "handle at most this many letters in this run; 0: up to the end")
	fs.IntVar(&f.maxRedrives, "max-redrives", 5, "refuse a letter redriven this many times already")
	fs.BoolVar(&f.release, "release", false, "release a letter's failed key on the way (as idem release does)")
	fs.BoolVar(&f.dry, "dry-run", false, "show what would be done; send, release and commit nothing")
	fs.BoolVar(&f.skip, "skip", false, "pass refused letters by (commit past them) instead of stopping their partition")
	fs.DurationVar(&f.timeout, "timeout", 10*time.Second, "bound of one Kafka request")
	if _, code, ok := parse(fs, args); !ok {
		return code
	}
	switch {
	case f.topic == "":
		return usageErr(e, fs, "--topic (the dead-letter topic) is required")
	case f.brokers == "":
		return usageErr(e, fs, "no brokers: set --brokers or IDEM_KAFKA_BROKERS")
	case f.max < 0 || f.maxRedrives < 1:
		return usageErr(e, fs, "--max must not be negative, --max-redrives must be positive")
	}
	admin, closeStore, err := sf.open(ctx, false)
	if err != nil {
		return fail(e, err)
	}
	defer closeStore()
	rd := &redriver{f: f, admin: admin, brokers: strings.Split(f.brokers, ",")}
	res, err := rd.run(ctx)
	refused := 0
	counts := map[string]int{}
	for _, r := range res {
		counts[r.Action]++
		if r.Action == "refused" || r.Action == "skipped" {
			refused++
		}
	}
	if sf.json {
		out := map[string]any{"letters": res, "counts": counts, "dry_run": f.dry}
		if err != nil {
			out["error"] = err.Error()
		}
		printJSON(e, out)
	} else {
		for _, r := range res {
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
			fmt.Fprintln(e.stdout, line)
		}
		var parts []string
		for _, a := range sortedKeys(counts) {
			parts = append(parts, fmt.Sprintf("%d %s", counts[a], a))
		}
		if len(parts) == 0 {
			parts = append(parts, "nothing to redrive")
		}
		fmt.Fprintf(e.stdout, "%s: %s\n", f.topic, strings.Join(parts, ", "))
	}
	switch {
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

type redriver struct {
	f       redriveFlags
	admin   dedup.Admin
	brokers []string
	client  *kafkago.Client
	writer  *kafkago.Writer
}

// span is the part of one partition this run reads: [from, to).
type span struct {
	partition int
	from, to  int64
}

func (rd *redriver) run(ctx context.Context) ([]letterResult, error) {
	tr := &kafkago.Transport{DialTimeout: rd.f.timeout}
	defer tr.CloseIdleConnections()
	rd.client = &kafkago.Client{Addr: kafkago.TCP(rd.brokers...), Timeout: rd.f.timeout, Transport: tr}
	rd.writer = &kafkago.Writer{Addr: kafkago.TCP(rd.brokers...), Balancer: samePartition{}, RequiredAcks: kafkago.RequireAll,
		BatchTimeout: time.Millisecond, WriteTimeout: rd.f.timeout, Transport: tr}
	defer rd.writer.Close()

	spans, err := rd.spans(ctx)
	if err != nil {
		return nil, err
	}
	var out []letterResult
	left := rd.f.max
	for _, s := range spans {
		if rd.f.max > 0 && left == 0 {
			break
		}
		res, err := rd.partition(ctx, s, left)
		out = append(out, res...)
		left -= len(res)
		if err != nil {
			return out, err
		}
	}
	return out, nil
}

// spans reads where the group stopped and where each partition ends now.
func (rd *redriver) spans(ctx context.Context) ([]span, error) {
	md, err := rd.client.Metadata(ctx, &kafkago.MetadataRequest{Topics: []string{rd.f.topic}})
	if err != nil {
		return nil, fmt.Errorf("kafka: metadata: %w", err)
	}
	if len(md.Topics) != 1 || md.Topics[0].Error != nil {
		var terr error
		if len(md.Topics) == 1 {
			terr = md.Topics[0].Error
		}
		return nil, fmt.Errorf("kafka: topic %s: %v", rd.f.topic, terr)
	}
	var parts []int
	var reqs []kafkago.OffsetRequest
	for _, p := range md.Topics[0].Partitions {
		parts = append(parts, p.ID)
		reqs = append(reqs, kafkago.FirstOffsetOf(p.ID), kafkago.LastOffsetOf(p.ID))
	}
	sort.Ints(parts)
	lo, err := rd.client.ListOffsets(ctx, &kafkago.ListOffsetsRequest{Topics: map[string][]kafkago.OffsetRequest{rd.f.topic: reqs}})
	if err != nil {
		return nil, fmt.Errorf("kafka: list offsets: %w", err)
	}
	first, last := map[int]int64{}, map[int]int64{}
	for _, p := range lo.Topics[rd.f.topic] {
		if p.Error != nil {
			return nil, fmt.Errorf("kafka: list offsets of partition %d: %w", p.Partition, p.Error)
		}
		first[p.Partition], last[p.Partition] = p.FirstOffset, p.LastOffset
	}
	of, err := rd.client.OffsetFetch(ctx, &kafkago.OffsetFetchRequest{GroupID: rd.f.group, Topics: map[string][]int{rd.f.topic: parts}})
	if err != nil {
		return nil, fmt.Errorf("kafka: offsets of group %s: %w", rd.f.group, err)
	}
	if of.Error != nil {
		return nil, fmt.Errorf("kafka: offsets of group %s: %w", rd.f.group, of.Error)
	}
	committed := map[int]int64{}
	for _, p := range of.Topics[rd.f.topic] {
		if p.Error != nil {
			return nil, fmt.Errorf("kafka: offset of group %s, partition %d: %w", rd.f.group, p.Partition, p.Error)
		}
		committed[p.Partition] = p.CommittedOffset
	}
	var spans []span
	for _, p := range parts {
		from := first[p]
		if c, ok := committed[p]; ok && c > from {
			from = c
		}
		if from < last[p] {
			spans = append(spans, span{partition: p, from: from, to: last[p]})
		}
	}
	return spans, nil
}

// partition redrives the letters of s, at most limit of them (0: all), and
// commits the group's offset past each one it sent or skipped.
func (rd *redriver) partition(ctx context.Context, s span, limit int) ([]letterResult, error) {
	r := kafkago.NewReader(kafkago.ReaderConfig{Brokers: rd.brokers, Topic: rd.f.topic, Partition: s.partition,
		MinBytes: 1, MaxBytes: 16 << 20, MaxWait: 500 * time.Millisecond, Dialer: &kafkago.Dialer{Timeout: rd.f.timeout}})
	defer r.Close()
	if err := r.SetOffset(s.from); err != nil {
		return nil, err
	}
	var out []letterResult
	for next := s.from; next < s.to && (limit == 0 || len(out) < limit); {
		fctx, cancel := context.WithTimeout(ctx, 3*rd.f.timeout)
		m, err := r.FetchMessage(fctx)
		cancel()
		if err != nil {
			return out, fmt.Errorf("kafka: read %s/%d at %d: %w", rd.f.topic, s.partition, next, err)
		}
		if m.Offset >= s.to {
			break // past the end as it was at the start (compacted or transaction markers before it)
		}
		next = m.Offset + 1
		res, err := rd.letter(ctx, m)
		out = append(out, res)
		if err != nil {
			return out, err
		}
		if rd.f.dry {
			continue
		}
		if res.Action == "refused" && !rd.f.skip {
			break // the partition stops at a refused letter: the next run starts with it
		}
		if err := rd.commit(ctx, s.partition, next); err != nil {
			return out, err
		}
	}
	return out, nil
}

func (rd *redriver) commit(ctx context.Context, partition int, offset int64) error {
	res, err := rd.client.OffsetCommit(ctx, &kafkago.OffsetCommitRequest{GroupID: rd.f.group, GenerationID: -1,
		Topics: map[string][]kafkago.OffsetCommit{rd.f.topic: {{Partition: partition, Offset: offset}}}})
	if err != nil {
		return fmt.Errorf("kafka: commit the redrive's offset: %w", err)
	}
	for _, p := range res.Topics[rd.f.topic] {
		if p.Error != nil {
			return fmt.Errorf("kafka: commit the redrive's offset of partition %d: %w", p.Partition, p.Error)
		}
	}
	return nil
}

func header(m kafkago.Message, key string) (string, bool) {
	for _, h := range m.Headers {
		if h.Key == key {
			return string(h.Value), true
		}
	}
	return "", false
}

// letter decides about one dead letter and, unless refused, sends it back.
func (rd *redriver) letter(ctx context.Context, m kafkago.Message) (letterResult, error) {
	res := letterResult{Letter: fmt.Sprintf("%s/%d/%d", m.Topic, m.Partition, m.Offset)}
	refuse := func(format string, args ...any) (letterResult, error) {
		res.Action, res.Reason = "refused", fmt.Sprintf(format, args...)
		if rd.f.skip && !rd.f.dry {
			res.Action = "skipped"
		}
		return res, nil
	}
	res.Scope, _ = header(m, consumer.MetaKeyScope)
	res.Key, _ = header(m, consumer.MetaKey)
	to := rd.f.to
	if to == "" {
		to, _ = header(m, consumer.MetaTopic)
	}
	partition, _ := header(m, consumer.MetaPartition)
	p, perr := strconv.Atoi(partition)
	count := 0
	if c, ok := header(m, consumer.MetaRedriveCount); ok {
		count, _ = strconv.Atoi(c)
	}
	res.Count = count + 1
	switch {
	case to == "":
		return refuse("no %s header: not an idem dead letter (use --to)", consumer.MetaTopic)
	case perr != nil:
		return refuse("no valid %s header", consumer.MetaPartition)
	case res.Scope == "" || res.Key == "":
		return refuse("no key: it was dead-lettered before its key was known (bad input); it would fail the same way")
	case count >= rd.f.maxRedrives:
		// Before the value's case, which ends the switch for a letter
		// without a value (a tombstone, an empty body) that is sent on.
		return refuse("redriven %d times already (--max-redrives)", count)
	case m.Value == nil:
		if _, ok := header(m, consumer.MetaValueSHA256); ok {
			return refuse("its value was left out of the dead letter (too large)")
		}
	}
	res.To = fmt.Sprintf("%s/%d", to, p)
	rows, err := rd.admin.Find(ctx, res.Scope, res.Key)
	if err != nil {
		return res, err
	}
	for _, r := range rows {
		switch r.Outcome {
		case "done":
			return refuse("the key was applied (a done row): sent back, it would be skipped as a duplicate or refused as a mismatch")
		case "failed":
			if !rd.f.release {
				return refuse("the key is recorded as failed: release it first (idem release --scope %s %s), or use --release", res.Scope, res.Key)
			}
			if !rd.f.dry {
				if _, err := rd.admin.Release(ctx, []dedup.Key{r.Key}, false); err != nil {
					return res, err
				}
			}
			res.Release = true
		}
	}
	if rd.f.dry {
		res.Action = "would_send"
		return res, nil
	}
	headers := make([]kafkago.Header, 0, len(m.Headers)+2)
	for _, h := range m.Headers {
		switch h.Key {
		case consumer.MetaReason, consumer.MetaAttempts, consumer.MetaAttempt, consumer.MetaLane,
			consumer.MetaRedriveCount, consumer.MetaRedrivenFrom:
			// the letter's own, or replaced below
		default:
			headers = append(headers, h) // the message's headers (traceparent included) and its original coordinates and key
		}
	}
	headers = append(headers,
		kafkago.Header{Key: consumer.MetaRedriveCount, Value: []byte(strconv.Itoa(res.Count))},
		kafkago.Header{Key: consumer.MetaRedrivenFrom, Value: []byte(res.Letter)})
	wctx, cancel := context.WithTimeout(ctx, rd.f.timeout)
	defer cancel()
	if err := rd.writer.WriteMessages(wctx, kafkago.Message{Topic: to, Partition: p, Key: m.Key, Value: m.Value, Headers: headers}); err != nil {
		return res, fmt.Errorf("kafka: send %s to %s: %w", res.Letter, to, err)
	}
	res.Action = "sent"
	return res, nil
}

// samePartition sends a letter back to the partition it came from (modulo
// the topic's partitions now).
type samePartition struct{}

func (samePartition) Balance(m kafkago.Message, partitions ...int) int {
	if len(partitions) == 0 {
		return 0
	}
	i := m.Partition % len(partitions)
	if i < 0 {
		i = 0
	}
	return partitions[i]
}
