package kafkatest_test

import (
	"context"
	"sync/atomic"
	"testing"

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
