package main

import (
	"strings"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/idemkit/idem/adapters/kafka"
	"github.com/idemkit/idem/consumer/wire"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/internal/testenv/kafkatest"
)

type retriesJSON struct {
	Waiting     int64            `json:"waiting"`
	RetryTopics []retryTopicJSON `json:"retry_topics"`
}

// TestRetriesListsWaitingCopies: a topic's retry topics of 10s and 1h,
// two partitions each, hold copies; the group read one of them. idem
// retries lists per retry topic and partition the copies past the group's
// committed offset (past the log's start where it committed none), with
// the first waiting copy's due time, and passes a topic whose name only
// looks like a retry topic's by.
func TestRetriesListsWaitingCopies(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	admin := kafkatest.NewAdmin(t, brokers)
	topic := testenv.Name(t, "retries")
	group := topic + "-group"
	short, long := kafka.RetryTopic(topic, 10*time.Second), kafka.RetryTopic(topic, time.Hour)
	for _, name := range []string{topic, short, long} {
		admin.CreateTopic(t, name, 2)
	}
	admin.CreateTopic(t, topic+".retry.soon", 1)
	base := time.Date(2026, 12, 6, 7, 0, 0, 0, time.UTC)
	copyAt := func(partition int, due time.Time) kafkago.Message {
		return kafkago.Message{Partition: partition, Value: []byte(`{}`), Headers: []kafkago.Header{
			{Key: wire.MetaRetryAttempt, Value: []byte("1")}, {Key: wire.MetaRetryDue, Value: []byte(due.Format(time.RFC3339Nano))}}}
	}
	admin.Produce(t, short, copyAt(0, base), copyAt(0, base.Add(time.Second)), copyAt(0, base.Add(2*time.Second)), copyAt(1, base.Add(3*time.Second)))
	admin.Produce(t, long, copyAt(1, base.Add(time.Hour)), copyAt(1, base.Add(2*time.Hour)))
	admin.Produce(t, topic+".retry.soon", kafkago.Message{Value: []byte(`{}`)})

	// The group read the first copy of short's partition 0.
	ctx := testenv.Context(t, time.Minute)
	tr := &kafkago.Transport{}
	defer tr.CloseIdleConnections()
	client := &kafkago.Client{Addr: kafkago.TCP(brokers...), Timeout: 10 * time.Second, Transport: tr}
	res, err := client.OffsetCommit(ctx, &kafkago.OffsetCommitRequest{GroupID: group, GenerationID: -1,
		Topics: map[string][]kafkago.OffsetCommit{short: {{Partition: 0, Offset: 1}}}})
	if err != nil || res.Topics[short][0].Error != nil {
		t.Fatalf("commit: %v %+v", err, res)
	}

	envs := map[string]string{"IDEM_KAFKA_BROKERS": strings.Join(brokers, ",")}
	code, out, _ := idem(t, "", envs, "retries", "--topic", topic, "--group", group, "--json")
	got := decode[retriesJSON](t, out)
	if code != exitOK || got.Waiting != 5 || len(got.RetryTopics) != 2 {
		t.Fatalf("exit %d, %+v; want 5 waiting in 2 retry topics", code, got)
	}
	type row struct {
		waiting, committed int64
		due                time.Time
	}
	want := map[string][2]row{
		short: {{2, 1, base.Add(time.Second)}, {1, -1, base.Add(3 * time.Second)}},
		long:  {{0, -1, time.Time{}}, {2, -1, base.Add(time.Hour)}},
	}
	for i, rt := range got.RetryTopics {
		if wantTopic := []string{short, long}[i]; rt.Topic != wantTopic || rt.Delay != []string{"10s", "1h"}[i] || len(rt.Partitions) != 2 {
			t.Errorf("retry topic %d: %+v, want %s", i, rt, wantTopic)
			continue
		}
		for p, w := range want[rt.Topic] {
			g := rt.Partitions[p]
			var due time.Time
			if g.OldestDue != nil {
				due = *g.OldestDue
			}
			if g.Partition != p || g.Waiting != w.waiting || g.Committed != w.committed || !due.Equal(w.due) {
				t.Errorf("%s/%d: %+v (due %v), want %+v", rt.Topic, p, g, due, w)
			}
		}
	}

	code, out, _ = idem(t, "", envs, "retries", "--topic", topic, "--group", group)
	if code != exitOK || !strings.Contains(out, topic+": 5 in retry") || !strings.Contains(out, "2026-12-06T07:00:01Z") {
		t.Errorf("table: exit %d\n%s", code, out)
	}
	if code, _, _ := idem(t, "", envs, "retries", "--topic", topic); code != exitUsage {
		t.Errorf("without --group: exit %d", code)
	}
	if code, out, _ := idem(t, "", envs, "retries", "--topic", topic+"-none", "--group", group); code != exitOK || !strings.Contains(out, "no retry topics") {
		t.Errorf("a topic without retry topics: exit %d\n%s", code, out)
	}
}
