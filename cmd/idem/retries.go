package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/idemkit/idem/adapters/kafka"
	"github.com/idemkit/idem/consumer/wire"
)

// retryTopicJSON is one retry topic of idem retries: a delay's copies.
type retryTopicJSON struct {
	Topic      string               `json:"topic"`
	Delay      string               `json:"delay"`
	Waiting    int64                `json:"waiting"`
	Partitions []retryPartitionJSON `json:"partitions"`
}

// retryPartitionJSON is one partition of a retry topic: the copies past
// the group's committed offset (or the log's start, without one) wait.
type retryPartitionJSON struct {
	Partition int        `json:"partition"`
	Committed int64      `json:"committed"` // -1: the group has committed none
	End       int64      `json:"end"`
	Waiting   int64      `json:"waiting"`
	OldestDue *time.Time `json:"oldest_due,omitempty"` // the first waiting copy's idem-retry-due
}

func runRetries(ctx context.Context, e *env, fs *flag.FlagSet, args []string) int {
	var jsonOut bool
	var brokers, topic, group string
	var timeout time.Duration
	fs.BoolVar(&jsonOut, "json", false, "one JSON document on stdout")
	fs.StringVar(&brokers, "brokers", e.getenv("IDEM_KAFKA_BROKERS"), "Kafka brokers, host:port[,host:port] (env IDEM_KAFKA_BROKERS)")
	fs.StringVar(&topic, "topic", "", "the consumer's topic, whose retry topics (<topic>.retry.<delay>) to list; required")
	fs.StringVar(&group, "group", "", "the consumer's group (kafka.Config.Group), whose committed offsets say what was read; required")
	fs.DurationVar(&timeout, "timeout", 10*time.Second, "bound of one broker request")
	if _, code, ok := parse(fs, args); !ok {
		return code
	}
	switch {
	case topic == "" || group == "":
		return usageErr(e, fs, "--topic and --group are required")
	case brokers == "":
		return usageErr(e, fs, "no brokers: set --brokers or IDEM_KAFKA_BROKERS")
	case strings.Contains(brokers, "@"):
		return usageErr(e, fs, errBrokerCredentials)
	}
	tr := &kafkago.Transport{DialTimeout: timeout}
	defer tr.CloseIdleConnections()
	client := &kafkago.Client{Addr: kafkago.TCP(addrs(brokers)...), Timeout: timeout, Transport: tr}
	res, err := kafkaRetries(ctx, client, topic, group)
	if err != nil {
		return fail(e, err)
	}
	if jsonOut {
		var total int64
		for _, r := range res {
			total += r.Waiting
		}
		printJSON(e, map[string]any{"topic": topic, "group": group, "waiting": total, "retry_topics": res})
		return exitOK
	}
	writeRetries(e.stdout, topic, res)
	return exitOK
}

// kafkaRetries lists the retry topics of topic (kafka.RetryTopic), and per
// partition what group has still to read of them.
func kafkaRetries(ctx context.Context, client *kafkago.Client, topic, group string) ([]retryTopicJSON, error) {
	md, err := client.Metadata(ctx, &kafkago.MetadataRequest{})
	if err != nil {
		return nil, fmt.Errorf("kafka: metadata: %w", err)
	}
	var out []retryTopicJSON
	delays := map[string]time.Duration{}
	parts := map[string][]int{}
	offsets := map[string][]kafkago.OffsetRequest{}
	for _, t := range md.Topics {
		name, ok := strings.CutPrefix(t.Name, topic+".retry.")
		if !ok || t.Error != nil {
			continue
		}
		d, err := time.ParseDuration(name)
		if err != nil || d <= 0 || kafka.RetryTopic(topic, d) != t.Name {
			continue
		}
		delays[t.Name] = d
		out = append(out, retryTopicJSON{Topic: t.Name, Delay: wire.RetryDelayName(d)})
		for _, p := range t.Partitions {
			parts[t.Name] = append(parts[t.Name], p.ID)
			offsets[t.Name] = append(offsets[t.Name], kafkago.FirstOffsetOf(p.ID), kafkago.LastOffsetOf(p.ID))
		}
		sort.Ints(parts[t.Name])
	}
	if len(out) == 0 {
		return nil, nil
	}
	sort.Slice(out, func(i, j int) bool { return delays[out[i].Topic] < delays[out[j].Topic] })
	lo, err := client.ListOffsets(ctx, &kafkago.ListOffsetsRequest{Topics: offsets})
	if err != nil {
		return nil, fmt.Errorf("kafka: list offsets: %w", err)
	}
	of, err := client.OffsetFetch(ctx, &kafkago.OffsetFetchRequest{GroupID: group, Topics: parts})
	if err == nil {
		err = of.Error
	}
	if err != nil {
		return nil, fmt.Errorf("kafka: offsets of group %s: %w", group, err)
	}
	for i := range out {
		rt := &out[i]
		first, end := map[int]int64{}, map[int]int64{}
		for _, p := range lo.Topics[rt.Topic] {
			if p.Error != nil {
				return nil, fmt.Errorf("kafka: list offsets of %s/%d: %w", rt.Topic, p.Partition, p.Error)
			}
			first[p.Partition], end[p.Partition] = p.FirstOffset, p.LastOffset
		}
		committed := map[int]int64{}
		for _, p := range of.Topics[rt.Topic] {
			if p.Error != nil {
				return nil, fmt.Errorf("kafka: offset of group %s, %s/%d: %w", group, rt.Topic, p.Partition, p.Error)
			}
			committed[p.Partition] = p.CommittedOffset
		}
		for _, p := range parts[rt.Topic] {
			c, ok := committed[p]
			if !ok {
				c = -1
			}
			from := max(c, first[p]) // no commit: the source starts at the oldest (kafka.FirstOffset)
			rp := retryPartitionJSON{Partition: p, Committed: c, End: end[p], Waiting: max(end[p]-from, 0)}
			if rp.Waiting > 0 {
				due, err := dueAt(ctx, client, rt.Topic, p, from)
				if err != nil {
					return nil, err
				}
				rp.OldestDue = due
			}
			rt.Waiting += rp.Waiting
			rt.Partitions = append(rt.Partitions, rp)
		}
	}
	return out, nil
}

// dueAt reads the idem-retry-due of the record at offset (or the first
// after it); nil when it has none.
func dueAt(ctx context.Context, client *kafkago.Client, topic string, partition int, offset int64) (*time.Time, error) {
	res, err := client.Fetch(ctx, &kafkago.FetchRequest{Topic: topic, Partition: partition, Offset: offset,
		MinBytes: 1, MaxBytes: 1 << 20, MaxWait: 500 * time.Millisecond})
	if err == nil {
		err = res.Error
	}
	if err != nil {
		return nil, fmt.Errorf("kafka: read %s/%d at %d: %w", topic, partition, offset, err)
	}
	if c, ok := res.Records.(io.Closer); ok {
		defer c.Close()
	}
	for {
		r, err := res.Records.ReadRecord()
		if errors.Is(err, io.EOF) {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("kafka: read %s/%d at %d: %w", topic, partition, offset, err)
		}
		if r.Offset < offset {
			continue // the batch began before it
		}
		for _, h := range r.Headers {
			if h.Key == wire.MetaRetryDue {
				if t, err := time.Parse(time.RFC3339Nano, string(h.Value)); err == nil {
					return &t, nil
				}
			}
		}
		return nil, nil
	}
}

// writeRetries prints idem retries' table: per retry topic and partition
// the copies waiting and when the oldest is due.
func writeRetries(w io.Writer, topic string, res []retryTopicJSON) {
	if len(res) == 0 {
		fmt.Fprintf(w, "%s: no retry topics (%s)\n", inert(topic), inert(kafka.RetryTopic(topic, 10*time.Second)))
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "RETRY TOPIC\tDELAY\tPARTITION\tWAITING\tOLDEST DUE")
	var total int64
	for _, rt := range res {
		for _, p := range rt.Partitions {
			due := "-"
			if p.OldestDue != nil {
				due = p.OldestDue.UTC().Format(time.RFC3339)
				if d := time.Until(*p.OldestDue); d > 0 {
					due += " (in " + duration(d) + ")"
				} else {
					due += " (" + duration(-d) + " ago)"
				}
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\n", inert(rt.Topic), rt.Delay, p.Partition, p.Waiting, due)
		}
		total += rt.Waiting
	}
	_ = tw.Flush()
	fmt.Fprintf(w, "%s: %d in retry\n", inert(topic), total)
}
