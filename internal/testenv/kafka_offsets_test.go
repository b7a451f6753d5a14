package testenv_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/idemkit/idem/internal/testenv"
)

// TestKafkaOffsetsTopicStaysSmall pins the test broker's __consumer_offsets
// settings (testdata/brokers/kafka/server.properties): segments of at most
// 1 MB, so that the log cleaner compacts the topic. With the default 100 MB
// the thousands of groups the tests make were never compacted, and after a
// day the group coordinator's load at a broker restart (117k records)
// outlasted the clients' join retries: every group's join failed with "Not
// Coordinator For Group" for minutes. A broker started with an older
// server.properties is started afresh by scripts/testenv.sh up, once no
// test is using it.
func TestKafkaOffsetsTopicStaysSmall(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// A committed offset makes sure the topic exists.
	topic := testenv.Name(t, "offsets")
	w := &kafkago.Writer{Addr: kafkago.TCP(brokers...), Topic: topic, AllowAutoTopicCreation: true}
	defer w.Close()
	testenv.WaitUntil(t, time.Minute, "a message written (the topic created)", func() bool {
		return w.WriteMessages(ctx, kafkago.Message{Value: []byte("x")}) == nil
	})
	r := kafkago.NewReader(kafkago.ReaderConfig{Brokers: brokers, Topic: topic, GroupID: topic, MaxWait: 100 * time.Millisecond})
	defer r.Close()
	m, err := r.FetchMessage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.CommitMessages(ctx, m); err != nil {
		t.Fatal(err)
	}

	c := &kafkago.Client{Addr: kafkago.TCP(brokers...), Timeout: 10 * time.Second}
	res, err := c.DescribeConfigs(ctx, &kafkago.DescribeConfigsRequest{Resources: []kafkago.DescribeConfigRequestResource{{
		ResourceType: kafkago.ResourceTypeTopic, ResourceName: "__consumer_offsets", ConfigNames: []string{"segment.bytes"},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, rr := range res.Resources {
		if rr.Error != nil {
			t.Fatal(rr.Error)
		}
		for _, e := range rr.ConfigEntries {
			n, err := strconv.Atoi(e.ConfigValue)
			if err != nil || n > 1<<20 {
				t.Fatalf("__consumer_offsets segment.bytes = %q, want at most 1 MiB: the broker runs with an old server.properties", e.ConfigValue)
			}
			return
		}
	}
	t.Fatal("no segment.bytes in the description of __consumer_offsets")
}
