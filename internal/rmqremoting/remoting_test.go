package rmqremoting_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"

	"github.com/idemkit/idem/internal/rmqremoting"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/internal/testenv/rmqtest"
)

func TestMain(m *testing.M) { rmqtest.Main(m, slog.New(slog.DiscardHandler), slog.LevelError) }

// TestFastJSON: fastjson's bare map keys are quoted; strings, arrays of
// numbers and quoted keys stay as they are.
func TestFastJSON(t *testing.T) {
	in := `{"brokerAddrTable":{"broker-a":{"brokerAddrs":{0:"127.0.0.1:10911", 1 :"h:2"},"brokerName":"broker-a"}},` +
		`"list":[1,2,{3:"x,4:{"}],"s":"a\"{5:6"}`
	var got map[string]any
	if err := json.Unmarshal(rmqremoting.FastJSON([]byte(in)), &got); err != nil {
		t.Fatalf("%v: %s", err, rmqremoting.FastJSON([]byte(in)))
	}
	addrs := got["brokerAddrTable"].(map[string]any)["broker-a"].(map[string]any)["brokerAddrs"].(map[string]any)
	if addrs["0"] != "127.0.0.1:10911" || addrs["1"] != "h:2" {
		t.Errorf("brokerAddrs %v", addrs)
	}
	list := got["list"].([]any)
	if list[0] != 1.0 || list[2].(map[string]any)["3"] != "x,4:{" || got["s"] != `a"{5:6` {
		t.Errorf("got %v", got)
	}
}

// TestBroker: the requests against the test environment's RocketMQ: the
// route and masters, offsets, pulls at, after and past the end, and a
// commit for a group the broker does not know yet.
func TestBroker(t *testing.T) {
	b := rmqtest.Shared(t)
	ctx := testenv.Context(t, time.Minute)
	ns := b.NameServers[0]
	masters, err := rmqremoting.Masters(ctx, ns)
	if err != nil || len(masters) == 0 || masters[0].Addr == "" {
		t.Fatalf("masters %v, %v", masters, err)
	}
	topic := testenv.Name(t, "t")
	b.CreateTopic(t, topic, 2)
	route, err := rmqremoting.TopicRoute(ctx, ns, topic)
	if err != nil || len(route) != 1 || route[0].Name != b.Name || route[0].Addr != b.Addr || route[0].ReadQueues != 2 || !route[0].Readable() {
		t.Fatalf("route %+v, %v", route, err)
	}
	if _, err := rmqremoting.TopicRoute(ctx, ns, topic+"-none"); !errors.Is(err, rmqremoting.ErrTopicNotExist) {
		t.Errorf("route of a missing topic: %v", err)
	}

	q := rmqremoting.Queue{Addr: b.Addr, Broker: b.Name, Topic: topic, ID: 1}
	p := b.NewProducer(t, producer.WithQueueSelector(producer.NewManualQueueSelector()))
	for i := range 3 {
		m := primitive.NewMessage(topic, fmt.Appendf(nil, "m%d", i))
		m.WithProperty("p", fmt.Sprint(i))
		m.WithTag("t")
		m.Queue = &primitive.MessageQueue{Topic: topic, BrokerName: b.Name, QueueId: 1}
		rmqtest.Send(t, p, m)
	}
	testenv.WaitUntil(t, time.Minute, "3 messages in queue 1", func() bool {
		n, err := rmqremoting.MaxOffset(ctx, q)
		return err == nil && n == 3
	})
	if lo, err := rmqremoting.MinOffset(ctx, q); err != nil || lo != 0 {
		t.Errorf("min offset %d, %v", lo, err)
	}

	group := testenv.Name(t, "g")
	r, err := rmqremoting.Pull(ctx, group, q, 1, 32)
	if err != nil || r.Status != rmqremoting.PullFound || len(r.Messages) != 2 || r.NextBegin != 3 || r.Max != 3 {
		t.Fatalf("pull at 1: %+v, %v", r, err)
	}
	for i, m := range r.Messages {
		if m.QueueOffset != int64(i+1) || string(m.Body) != fmt.Sprintf("m%d", i+1) || m.GetProperty("p") != fmt.Sprint(i+1) ||
			m.GetTags() != "t" || *m.Queue != (primitive.MessageQueue{Topic: topic, BrokerName: b.Name, QueueId: 1}) {
			t.Errorf("message %d: %v", i, m)
		}
	}
	if r, err := rmqremoting.Pull(ctx, group, q, 3, 32); err != nil || r.Status != rmqremoting.PullNoNew {
		t.Errorf("pull at the end: %+v, %v", r, err)
	}
	if r, err := rmqremoting.Pull(ctx, group, q, 9, 32); err != nil || r.Status != rmqremoting.PullOffsetMoved || r.NextBegin != 3 {
		t.Errorf("pull past the end: %+v, %v", r, err)
	}

	// A group the broker does not know: the commit creates it.
	if err := rmqremoting.CommitOffset(ctx, group+"-new", q, 2); err != nil {
		t.Fatal(err)
	}
	if off, ok, err := rmqremoting.ConsumerOffset(ctx, group+"-new", q); err != nil || !ok || off != 2 {
		t.Errorf("committed offset %d, %v, %v; want 2", off, ok, err)
	}
	if err := rmqremoting.CommitOffset(ctx, group+"-new", q, 3); err != nil {
		t.Fatal(err)
	}
	if off, ok, err := rmqremoting.ConsumerOffset(ctx, group+"-new", q); err != nil || !ok || off != 3 {
		t.Errorf("committed offset %d, %v, %v; want 3", off, ok, err)
	}

	// A broker asked for a route answers with a code: an *Error.
	if _, err := rmqremoting.TopicRoute(ctx, b.Addr, topic); !rmqremoting.IsCode(err, rmqremoting.CodeRequestNotSupported) {
		t.Errorf("route from a broker: %v", err)
	}
}

// TestNotRemoting: a server that closes the connection (as Kafka does on a
// remoting frame) is ErrNotRemoting; one that says nothing is cut off by
// the context.
func TestNotRemoting(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	silent := make(chan net.Conn, 1)
	go func() {
		first := true
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if first {
				_, _ = io.ReadFull(c, make([]byte, 8))
				c.Close()
				first = false
				continue
			}
			silent <- c
		}
	}()
	ctx := context.Background()
	if _, err := rmqremoting.Call(ctx, ln.Addr().String(), rmqremoting.ReqGetBrokerClusterInfo, nil, nil); !errors.Is(err, rmqremoting.ErrNotRemoting) {
		t.Errorf("a server that closes the connection: %v", err)
	}
	cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if _, err := rmqremoting.Call(cctx, ln.Addr().String(), rmqremoting.ReqGetBrokerClusterInfo, nil, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a silent server: %v", err)
	}
	(<-silent).Close()
}
