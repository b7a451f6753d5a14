package faults_test

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
	"github.com/apache/rocketmq-client-go/v2/producer"

	"github.com/idemkit/idem/adapters/rocketmq"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/internal/testenv"
)

// rocketBroker is a RocketMQ name server and its (single) broker: the test
// environment's, or a private one (privateRocket).
type rocketBroker struct {
	namesrv []string
	broker  string // the broker's address
	bname   string // its broker name
	admin   admin.Admin
	prod    interface {
		SendSync(ctx context.Context, msgs ...*primitive.Message) (*primitive.SendResult, error)
		Shutdown() error
	}

	mu     sync.Mutex
	queues map[string]int            // queues per topic
	pos    map[string]map[string]pos // per topic: message ID -> queue and offset
}

var (
	sharedMu     sync.Mutex
	sharedRocket *rocketBroker
)

// newRocket returns the test environment's RocketMQ, or skips (fails under
// CI) when IDEM_TEST_ROCKETMQ_NAMESRV is unset.
func newRocket(t *testing.T) *rocketBroker {
	t.Helper()
	ns := testenv.RocketMQNamesrv(t)
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if sharedRocket == nil {
		b, err := connectRocket(ns)
		if err != nil {
			t.Fatal(err)
		}
		sharedRocket = b
	}
	return sharedRocket
}

// closeShared closes the shared RocketMQ clients.
func closeShared() {
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if sharedRocket != nil {
		sharedRocket.close()
		sharedRocket = nil
	}
}

// connectRocket finds the broker through the name server and starts an
// admin client and a producer.
func connectRocket(namesrv []string) (*rocketBroker, error) {
	addr, bname, err := clusterBroker(namesrv[0])
	if err != nil {
		return nil, err
	}
	adm, err := admin.NewAdmin(admin.WithResolver(primitive.NewPassthroughResolver(namesrv)))
	if err != nil {
		return nil, fmt.Errorf("rocketmq admin: %w", err)
	}
	p, err := producer.NewDefaultProducer(
		producer.WithNsResolver(primitive.NewPassthroughResolver(namesrv)),
		producer.WithGroupName(fmt.Sprintf("idem_faults_producer_%d_%d", pid(), uniq.Add(1))),
		producer.WithInstanceName(fmt.Sprintf("idem_faults_%d_%d", pid(), uniq.Add(1))),
		producer.WithQueueSelector(producer.NewManualQueueSelector()),
		producer.WithRetry(2),
		producer.WithSendMsgTimeout(10*time.Second),
	)
	if err == nil {
		err = p.Start()
	}
	if err != nil {
		adm.Close()
		return nil, fmt.Errorf("rocketmq producer: %w", err)
	}
	return &rocketBroker{namesrv: namesrv, broker: addr, bname: bname, admin: adm, prod: p,
		queues: map[string]int{}, pos: map[string]map[string]pos{}}, nil
}

func (b *rocketBroker) close() {
	_ = b.prod.Shutdown()
	_ = b.admin.Close()
}

func (b *rocketBroker) name() string    { return "rocketmq" }
func (b *rocketBroker) addrs() []string { return b.namesrv }

func (b *rocketBroker) newTopic(t *testing.T, n int) (string, string) {
	t.Helper()
	topic, group := topicName(t, "t"), topicName(t, "g")
	b.createTopic(t, topic, n)
	b.createTopic(t, topic+"_DLQ", n)
	// The broker creates the retry topic when the group shows up, and a
	// client that started before finds its route only at its next route
	// refresh: create it first.
	b.createTopic(t, "%RETRY%"+group, 1)
	return topic, group
}

func (b *rocketBroker) createTopic(t *testing.T, topic string, n int) {
	t.Helper()
	ctx := ctxTimeout(t, time.Minute)
	err := b.admin.CreateTopic(ctx, admin.WithTopicCreate(topic), admin.WithBrokerAddrCreate(b.broker),
		admin.WithReadQueueNums(n), admin.WithWriteQueueNums(n))
	if err != nil {
		t.Fatalf("create topic %s: %v", topic, err)
	}
	b.mu.Lock()
	b.queues[topic] = n
	b.mu.Unlock()
	waitUntil(t, time.Minute, "route of topic "+topic, func() (bool, string) {
		mqs, err := b.admin.FetchPublishMessageQueues(ctx, topic)
		return err == nil && len(mqs) == n, fmt.Sprint(err)
	})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = b.admin.DeleteTopic(ctx, admin.WithTopicDelete(topic), admin.WithBrokerAddrDelete(b.broker),
			admin.WithNameSrvAddr(b.namesrv))
	})
}

func (b *rocketBroker) produce(t *testing.T, topic string, msgs []outMsg) {
	t.Helper()
	ctx := ctxTimeout(t, 2*time.Minute)
	// Batches of consecutive messages for one queue; a batch's messages get
	// consecutive offsets from the first.
	for len(msgs) > 0 {
		n := 1
		for n < len(msgs) && n < 32 && msgs[n].Part == msgs[0].Part && len(msgs[n].Value) < 1<<10 && len(msgs[0].Value) < 1<<10 {
			n++
		}
		batch := make([]*primitive.Message, n)
		for i, m := range msgs[:n] {
			pm := primitive.NewMessage(topic, m.Value)
			pm.WithKeys([]string{m.ID})
			if m.Tenant != "" {
				pm.WithProperty(tenantHeader, m.Tenant)
			}
			pm.Queue = &primitive.MessageQueue{Topic: topic, BrokerName: b.bname, QueueId: m.Part}
			batch[i] = pm
		}
		res, err := b.prod.SendSync(ctx, batch...)
		if err != nil || res.Status != primitive.SendOK {
			t.Fatalf("send to %s: %v (%v)", topic, err, res)
		}
		b.mu.Lock()
		if b.pos[topic] == nil {
			b.pos[topic] = map[string]pos{}
		}
		for i, m := range msgs[:n] {
			b.pos[topic][m.ID] = pos{Part: res.MessageQueue.QueueId, Off: res.QueueOffset + int64(i)}
		}
		b.mu.Unlock()
		msgs = msgs[n:]
	}
}

func (b *rocketBroker) positions(t *testing.T, topic string) map[string]pos {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make(map[string]pos, len(b.pos[topic]))
	for id, p := range b.pos[topic] {
		out[id] = p
	}
	return out
}

func (b *rocketBroker) queueCount(topic string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.queues[topic]
}

func (b *rocketBroker) offsets(_ context.Context, topic, group string) (map[int]int64, error) {
	out := map[int]int64{}
	for q := range b.queueCount(topic) {
		off, ok, err := b.consumerOffset(group, topic, q)
		if err != nil {
			return nil, fmt.Errorf("queue %d: %w", q, err)
		}
		if ok {
			out[q] = off
		}
	}
	return out, nil
}

// lag sums, over topic's queues and the group's retry topic, how far the
// group's committed offsets are behind the queues' ends.
func (b *rocketBroker) lag(topic, group string) (int64, string, error) {
	var total int64
	var detail []string
	for _, tq := range []struct {
		topic  string
		queues int
	}{{topic, b.queueCount(topic)}, {"%RETRY%" + group, 1}} {
		for q := range tq.queues {
			max, err := b.maxOffset(tq.topic, q)
			if err != nil {
				return 0, "", err
			}
			off, ok, err := b.consumerOffset(group, tq.topic, q)
			if err != nil {
				return 0, "", err
			}
			if !ok {
				off = 0
			}
			total += max - off
			detail = append(detail, fmt.Sprintf("%s/%d %d/%d", tq.topic, q, off, max))
		}
	}
	return total, fmt.Sprint(detail), nil
}

func (b *rocketBroker) waitNoLag(t *testing.T, topic, group string) {
	t.Helper()
	waitUntil(t, 2*time.Minute, "the group has no lag (offsets are persisted every 5s)", func() (bool, string) {
		n, detail, err := b.lag(topic, group)
		if err != nil {
			return false, err.Error()
		}
		return n == 0, fmt.Sprintf("lag %d: %s", n, detail)
	})
}

// count returns how many messages topic holds.
func (b *rocketBroker) count(topic string) (int64, error) {
	var n int64
	for q := range b.queueCount(topic) {
		max, err := b.maxOffset(topic, q)
		if err != nil {
			return 0, err
		}
		min, err := b.minOffset(topic, q)
		if err != nil {
			return 0, err
		}
		n += max - min
	}
	return n, nil
}

func (b *rocketBroker) deadLetters(t *testing.T, topic string, want int) []letter {
	t.Helper()
	dlq := topic + "_DLQ"
	var letters []letter
	// A message can be dead-lettered twice (redelivered after its failure
	// was recorded): wait for want distinct messages, reading the topic
	// again as more letters arrive.
	waitUntil(t, 2*time.Minute, fmt.Sprintf("%d distinct dead letters in %s", want, dlq), func() (bool, string) {
		n, err := b.count(dlq)
		if err != nil {
			return false, err.Error()
		}
		if n < int64(want) || n == 0 {
			return n >= int64(want), fmt.Sprintf("%d letters", n)
		}
		letters = letters[:0]
		seen := map[string]bool{}
		for _, m := range b.read(t, dlq, int(n)) {
			prop := func(k string) string { v, _ := m.Header(k); return string(v) }
			letters = append(letters, letter{ID: string(m.Key), Reason: prop(consumer.MetaReason), Attempts: prop(consumer.MetaAttempts),
				Key: prop(consumer.MetaKey), Scope: prop(consumer.MetaKeyScope)})
			seen[string(m.Key)] = true
		}
		return len(seen) >= want, fmt.Sprintf("%d letters, %d distinct", n, len(seen))
	})
	return letters
}

// givenBack returns the IDs (KEYS) of the messages whose copies are in
// %RETRY%<group>: the group gave them back for a later redelivery (a consume
// call that returned "retry later"), and the client committed past them.
func (b *rocketBroker) givenBack(t *testing.T, group string) map[string]bool {
	t.Helper()
	retry := "%RETRY%" + group
	n, err := b.count(retry)
	if err != nil {
		t.Fatalf("messages in %s: %v", retry, err)
	}
	ids := map[string]bool{}
	if n > 0 {
		for _, m := range b.read(t, retry, int(n)) {
			ids[string(m.Key)] = true
		}
	}
	return ids
}

var _ givingBackBroker = (*rocketBroker)(nil)

// read consumes topic from the start with a fresh group until it has n
// messages.
func (b *rocketBroker) read(t *testing.T, topic string, n int) []*consumer.Message {
	t.Helper()
	src, err := rocketmq.New(rocketmq.Config{NameServers: b.namesrv, Group: topicName(t, "reader"), Topics: []string{topic},
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
			go src.Ack(ctx, []*consumer.Message{m})
			return nil
		})
	}()
	defer func() {
		cancel()
		<-done
	}()
	waitUntil(t, 2*time.Minute, fmt.Sprintf("%d messages read from %s", n, topic), func() (bool, string) {
		select {
		case err := <-done:
			done <- err
			return false, fmt.Sprintf("reader stopped: %v", err)
		default:
		}
		mu.Lock()
		defer mu.Unlock()
		return len(got) >= n, fmt.Sprintf("%d read", len(got))
	})
	mu.Lock()
	defer mu.Unlock()
	return append([]*consumer.Message(nil), got...)
}

// --- the broker's remoting protocol, for offsets ------------------------------
//
// mqadmin answers in seconds (a JVM per call); offsets are two small
// requests of RocketMQ's remoting protocol: a frame of length, header
// length, a JSON header and a body.

const (
	reqQueryConsumerOffset  = 14
	reqUpdateConsumerOffset = 15
	reqUpdateSubGroup       = 200
	reqGetMaxOffset         = 30
	reqGetMinOffset         = 31
	reqGetBrokerClusterInfo = 106
	respQueryNotFound       = 22
)

var opaque struct {
	sync.Mutex
	n int32
}

// remoting sends one request to addr and returns the response's code,
// extFields and body.
func remoting(addr string, code int, ext map[string]string) (int, map[string]string, []byte, error) {
	return remotingBody(addr, code, ext, nil)
}

// remotingBody is remoting with a request body.
func remotingBody(addr string, code int, ext map[string]string, body []byte) (int, map[string]string, []byte, error) {
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
	frame := make([]byte, 8, 8+len(header)+len(body))
	binary.BigEndian.PutUint32(frame[0:], uint32(4+len(header)+len(body)))
	binary.BigEndian.PutUint32(frame[4:], uint32(len(header))) // serialize type 0: JSON
	if _, err := conn.Write(append(append(frame, header...), body...)); err != nil {
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

func (b *rocketBroker) offsetRequest(code int, ext map[string]string) (int64, bool, error) {
	rc, fields, _, err := remoting(b.broker, code, ext)
	if err != nil {
		return 0, false, err
	}
	if rc == respQueryNotFound {
		return 0, false, nil
	}
	off, err := strconv.ParseInt(fields["offset"], 10, 64)
	return off, err == nil, err
}

func (b *rocketBroker) maxOffset(topic string, q int) (int64, error) {
	off, _, err := b.offsetRequest(reqGetMaxOffset, map[string]string{"topic": topic, "queueId": strconv.Itoa(q), "bname": b.bname})
	return off, err
}

func (b *rocketBroker) minOffset(topic string, q int) (int64, error) {
	off, _, err := b.offsetRequest(reqGetMinOffset, map[string]string{"topic": topic, "queueId": strconv.Itoa(q), "bname": b.bname})
	return off, err
}

func (b *rocketBroker) consumerOffset(group, topic string, q int) (int64, bool, error) {
	return b.offsetRequest(reqQueryConsumerOffset, map[string]string{"consumerGroup": group, "topic": topic,
		"queueId": strconv.Itoa(q), "bname": b.bname})
}

var brokerAddrRE = regexp.MustCompile(`"brokerName":"([^"]+)"[^}]*"brokerAddrs":\{"?0"?:"([^"]+)"`)
var brokerAddrRE2 = regexp.MustCompile(`"brokerAddrs":\{"?0"?:"([^"]+)"\}[^}]*"brokerName":"([^"]+)"`)

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
