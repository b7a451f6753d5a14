package rmqtest

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/admin"
	"github.com/apache/rocketmq-client-go/v2/primitive"

	"github.com/idemkit/idem/adapters/rocketmq"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/internal/relaytest"
)

// RocketMQ is a name server and its (single) broker, for topic setup and
// reading topics back.
type RocketMQ struct {
	NameServers []string
	Broker      string // the broker's address
	BrokerName  string
	admin       admin.Admin
}

// NewRocketMQ connects to the broker behind namesrv; closed when the test
// ends.
func NewRocketMQ(t testing.TB, namesrv []string) *RocketMQ {
	t.Helper()
	var addr, name string
	relaytest.WaitFor(t, 2*time.Minute, "a broker registered with "+namesrv[0], func() (bool, string) {
		var err error
		addr, name, err = clusterBroker(namesrv[0])
		return err == nil, fmt.Sprint(err)
	})
	adm, err := admin.NewAdmin(admin.WithResolver(primitive.NewPassthroughResolver(namesrv)))
	if err != nil {
		t.Fatalf("rocketmq admin: %v", err)
	}
	t.Cleanup(func() { _ = adm.Close() })
	return &RocketMQ{NameServers: namesrv, Broker: addr, BrokerName: name, admin: adm}
}

// CreateTopic creates topic with queues read and write queues, waits until
// the name server routes it, and deletes it when the test ends.
func (r *RocketMQ) CreateTopic(t testing.TB, topic string, queues int) {
	t.Helper()
	ctx := relaytest.Ctx(t, time.Minute)
	err := r.admin.CreateTopic(ctx, admin.WithTopicCreate(topic), admin.WithBrokerAddrCreate(r.Broker),
		admin.WithReadQueueNums(queues), admin.WithWriteQueueNums(queues))
	if err != nil {
		t.Fatalf("create topic %s: %v", topic, err)
	}
	relaytest.WaitFor(t, time.Minute, "route of topic "+topic, func() (bool, string) {
		mqs, err := r.admin.FetchPublishMessageQueues(ctx, topic)
		return err == nil && len(mqs) == queues, fmt.Sprint(err)
	})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = r.admin.DeleteTopic(ctx, admin.WithTopicDelete(topic), admin.WithBrokerAddrDelete(r.Broker),
			admin.WithNameSrvAddr(r.NameServers))
	})
}

// Count returns how many messages topic's queues hold.
func (r *RocketMQ) Count(topic string, queues int) (int64, error) {
	var n int64
	for q := range queues {
		hi, err := r.offset(reqGetMaxOffset, topic, q)
		if err != nil {
			return 0, err
		}
		lo, err := r.offset(reqGetMinOffset, topic, q)
		if err != nil {
			return 0, err
		}
		n += hi - lo
	}
	return n, nil
}

// Read consumes topic from the start with a fresh group (adapters/rocketmq,
// concurrent mode) until it has every message Count counts, and returns
// them.
func (r *RocketMQ) Read(t testing.TB, topic string, queues int) []*consumer.Message {
	t.Helper()
	n, err := r.Count(topic, queues)
	if err != nil {
		t.Fatalf("count %s: %v", topic, err)
	}
	src, err := rocketmq.New(rocketmq.Config{NameServers: r.NameServers, Group: relaytest.Name(t, "reader"), Topics: []string{topic},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var got []*consumer.Message
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- src.Run(ctx, func(ctx context.Context, m *consumer.Message) error {
			mu.Lock()
			got = append(got, m)
			mu.Unlock()
			go func() { _ = src.Ack(ctx, []*consumer.Message{m}) }()
			return nil
		})
	}()
	defer func() {
		cancel()
		<-done
	}()
	relaytest.WaitFor(t, 2*time.Minute, fmt.Sprintf("%d messages read from %s", n, topic), func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		return int64(len(got)) >= n, fmt.Sprintf("%d read", len(got))
	})
	mu.Lock()
	defer mu.Unlock()
	return append([]*consumer.Message(nil), got...)
}

// The broker's remoting protocol, for the broker's address and offsets
// (mqadmin answers in seconds, a JVM per call): a frame of length, header
// length, a JSON header and a body.
const (
	reqGetMaxOffset         = 30
	reqGetMinOffset         = 31
	reqGetBrokerClusterInfo = 106
	respQueryNotFound       = 22
)

var opaque struct {
	sync.Mutex
	n int32
}

func remoting(addr string, code int, ext map[string]string) (int, map[string]string, []byte, error) {
	opaque.Lock()
	opaque.n++
	op := opaque.n
	opaque.Unlock()
	header, err := json.Marshal(map[string]any{"code": code, "language": "GO", "version": 317, "opaque": op, "flag": 0, "extFields": ext})
	if err != nil {
		return 0, nil, nil, err
	}
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return 0, nil, nil, err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	frame := make([]byte, 8, 8+len(header))
	binary.BigEndian.PutUint32(frame[0:], uint32(4+len(header)))
	binary.BigEndian.PutUint32(frame[4:], uint32(len(header))) // serialize type 0: JSON
	if _, err := conn.Write(append(frame, header...)); err != nil {
		return 0, nil, nil, err
	}
	var head [8]byte
	if _, err := io.ReadFull(conn, head[:]); err != nil {
		return 0, nil, nil, err
	}
	length := binary.BigEndian.Uint32(head[0:])
	hlen := binary.BigEndian.Uint32(head[4:]) & 0xFFFFFF
	if length < 4+hlen || length > 64<<20 {
		return 0, nil, nil, fmt.Errorf("remoting: bad frame (%d, %d)", length, hlen)
	}
	rest := make([]byte, length-4)
	if _, err := io.ReadFull(conn, rest); err != nil {
		return 0, nil, nil, err
	}
	var resp struct {
		Code      int               `json:"code"`
		Remark    string            `json:"remark"`
		ExtFields map[string]string `json:"extFields"`
	}
	if err := json.Unmarshal(rest[:hlen], &resp); err != nil {
		return 0, nil, nil, fmt.Errorf("remoting: header: %w", err)
	}
	if resp.Code != 0 && resp.Code != respQueryNotFound {
		return resp.Code, nil, nil, fmt.Errorf("remoting: request %d: code %d: %s", code, resp.Code, resp.Remark)
	}
	return resp.Code, resp.ExtFields, rest[hlen:], nil
}

func (r *RocketMQ) offset(code int, topic string, q int) (int64, error) {
	rc, fields, _, err := remoting(r.Broker, code, map[string]string{"topic": topic, "queueId": strconv.Itoa(q), "bname": r.BrokerName})
	if err != nil || rc == respQueryNotFound {
		return 0, err
	}
	return strconv.ParseInt(fields["offset"], 10, 64)
}

var (
	brokerAddrRE  = regexp.MustCompile(`"brokerName":"([^"]+)"[^}]*"brokerAddrs":\{"?0"?:"([^"]+)"`)
	brokerAddrRE2 = regexp.MustCompile(`"brokerAddrs":\{"?0"?:"([^"]+)"\}[^}]*"brokerName":"([^"]+)"`)
)

// clusterBroker asks the name server for its master broker's address and
// name. The body is fastjson, whose map keys may be unquoted numbers.
func clusterBroker(namesrv string) (addr, name string, err error) {
	_, _, body, err := remoting(namesrv, reqGetBrokerClusterInfo, nil)
	if err != nil {
		return "", "", fmt.Errorf("broker cluster info from %s: %w", namesrv, err)
	}
	if m := brokerAddrRE.FindSubmatch(body); m != nil {
		return string(m[2]), string(m[1]), nil
	}
	if m := brokerAddrRE2.FindSubmatch(body); m != nil {
		return string(m[1]), string(m[2]), nil
	}
	return "", "", errors.New("the name server knows no master broker: " + string(body))
}
