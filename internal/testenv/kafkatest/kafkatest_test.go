package kafkatest_test

import (
	"context"
	"sync/atomic"
	"testing"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/idemkit/idem/internal/testenv/kafkatest"
)

// A broker just restarted may answer CreateTopics with BROKER_NOT_AVAILABLE
// for a while: CreateTopic waits that out instead of failing the test.
func TestCreateTopicWaitsOutBrokerNotAvailable(t *testing.T) {
	c, err := kfake.NewCluster()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)

	const refusals = 3
	var refused atomic.Int32
	for range refusals { // each control function answers one request
		c.ControlKey(int16(kmsg.CreateTopics), func(kr kmsg.Request) (kmsg.Response, error, bool) {
			req := kr.(*kmsg.CreateTopicsRequest)
			resp := req.ResponseKind().(*kmsg.CreateTopicsResponse)
			for _, rt := range req.Topics {
				st := kmsg.NewCreateTopicsResponseTopic()
				st.Topic = rt.Topic
				st.ErrorCode = kerr.BrokerNotAvailable.Code
				resp.Topics = append(resp.Topics, st)
			}
			refused.Add(1)
			return resp, nil, true
		})
	}

	a := kafkatest.NewAdmin(t, c.ListenAddrs())
	a.CreateTopic(t, "orders", 3)

	if got := refused.Load(); got != refusals {
		t.Errorf("the broker refused %d CreateTopics, want %d", got, refusals)
	}
	if hwm, err := a.HighWatermarks(context.Background(), "orders"); err != nil || len(hwm) != 3 {
		t.Fatalf("high watermarks of orders: %v, %v", hwm, err)
	}
}

// On one node under load the controller can fence its own broker for a few
// seconds (its heartbeats fell behind the broker's session), and every
// partition answers NOT_LEADER_OR_FOLLOWER until it is back: ReadAll waits
// that out, whether it comes while it reads the high watermarks or while
// its reader starts (which used to give up after three tries: a fresh-clone
// make test failed so, with "read <topic>/0 at 0: [6] Not Leader For
// Partition").
func TestReadAllWaitsOutALeaderlessPartition(t *testing.T) {
	for _, tc := range []struct {
		name        string
		first, last int32 // the ListOffsets requests refused, counted from 1
	}{
		{"high watermarks", 1, 2},
		{"reader start", 2, 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := kfake.NewCluster(kfake.SeedTopics(1, "letters"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(c.Close)
			a := kafkatest.NewAdmin(t, c.ListenAddrs())
			a.Produce(t, "letters", kafkago.Message{Value: []byte("a")}, kafkago.Message{Value: []byte("b")})

			var n, refused atomic.Int32
			c.ControlKey(int16(kmsg.ListOffsets), func(kr kmsg.Request) (kmsg.Response, error, bool) {
				c.KeepControl()
				if i := n.Add(1); i < tc.first || i > tc.last {
					return nil, nil, false
				}
				refused.Add(1)
				req := kr.(*kmsg.ListOffsetsRequest)
				resp := req.ResponseKind().(*kmsg.ListOffsetsResponse)
				for _, rt := range req.Topics {
					st := kmsg.NewListOffsetsResponseTopic()
					st.Topic = rt.Topic
					for _, rp := range rt.Partitions {
						sp := kmsg.NewListOffsetsResponseTopicPartition()
						sp.Partition = rp.Partition
						sp.ErrorCode = kerr.NotLeaderForPartition.Code
						st.Partitions = append(st.Partitions, sp)
					}
					resp.Topics = append(resp.Topics, st)
				}
				return resp, nil, true
			})

			if got := a.ReadAll(t, "letters"); len(got) != 2 {
				t.Fatalf("read %d messages, want 2", len(got))
			}
			if got, want := refused.Load(), tc.last-tc.first+1; got != want {
				t.Errorf("%d ListOffsets refused, want %d: the test did not make the partition leaderless", got, want)
			}
		})
	}
}
