package faults_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"

	"github.com/idemkit/idem/consumer/wire"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/internal/testenv/rmqtest"
)

// rocketBroker is a RocketMQ name server and its (single) broker: the test
// environment's, or a private one (privateRocket), with a producer that
// sends to the queue a message names.
type rocketBroker struct {
	*rmqtest.Broker
	prod rigProducer

	mu  sync.Mutex
	pos map[string]map[string]pos // per topic: message ID -> queue and offset
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
	b, err := rmqtest.Connect(namesrv)
	if err != nil {
		return nil, err
	}
	p, err := startRigProducer(namesrv, fmt.Sprintf("idem_faults_producer_%d_%d", pid(), uniq.Add(1)),
		fmt.Sprintf("idem_faults_%d_%d", pid(), uniq.Add(1)))
	if err != nil {
		_ = b.Close()
		return nil, err
	}
	return &rocketBroker{Broker: b, prod: p, pos: map[string]map[string]pos{}}, nil
}

// rigProducer is the rig's RocketMQ producer: it sends each message to the
// queue the message names.
type rigProducer interface {
	rmqtest.Sender
	Shutdown() error
}

// startRigProducer starts a producer on the name servers namesrv.
func startRigProducer(namesrv []string, group, instance string) (rigProducer, error) {
	p, err := producer.NewDefaultProducer(
		producer.WithNsResolver(primitive.NewPassthroughResolver(namesrv)),
		producer.WithGroupName(group),
		producer.WithInstanceName(instance),
		producer.WithQueueSelector(producer.NewManualQueueSelector()),
		producer.WithRetry(2),
		producer.WithSendMsgTimeout(10*time.Second),
	)
	if err == nil {
		err = p.Start()
	}
	if err != nil {
		return nil, fmt.Errorf("rocketmq producer: %w", err)
	}
	return p, nil
}

func (b *rocketBroker) close() {
	_ = b.prod.Shutdown()
	_ = b.Close()
}

func (b *rocketBroker) name() string    { return "rocketmq" }
func (b *rocketBroker) addrs() []string { return b.NameServers }

func (b *rocketBroker) newTopic(t *testing.T, n int) (string, string) {
	t.Helper()
	topic, group := testenv.Name(t, "t"), testenv.Name(t, "g")
	b.CreateTopic(t, topic, n)
	b.CreateTopic(t, topic+"_DLQ", n)
	// The broker creates the retry topic when the group shows up, and a
	// client that started before finds its route only at its next route
	// refresh: create it first.
	b.CreateTopic(t, "%RETRY%"+group, 1)
	return topic, group
}

// rocketMessage is m as a message of topic for queue q of broker: keyed
// by its ID (its Key when set: its ID is then not in the message), with
// its tenant as a property.
func rocketMessage(topic string, m outMsg, broker string, q int) *primitive.Message {
	pm := primitive.NewMessage(topic, m.Value)
	key := m.ID
	if m.Key != "" {
		key = m.Key
	}
	pm.WithKeys([]string{key})
	if m.Tenant != "" {
		pm.WithProperty(tenantHeader, m.Tenant)
	}
	pm.Queue = &primitive.MessageQueue{Topic: topic, BrokerName: broker, QueueId: q}
	return pm
}

func (b *rocketBroker) produce(t *testing.T, topic string, msgs []outMsg) {
	t.Helper()
	out := make([]*primitive.Message, len(msgs))
	for i, m := range msgs {
		out[i] = rocketMessage(topic, m, b.Name, m.Part)
	}
	stored := rmqtest.Send(t, b.prod, out...)
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.pos[topic] == nil {
		b.pos[topic] = map[string]pos{}
	}
	for i, m := range msgs {
		b.pos[topic][m.ID] = pos{Part: stored[i].Queue, Off: stored[i].Offset}
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

func (b *rocketBroker) offsets(_ context.Context, topic, group string) (map[int]int64, error) {
	out := map[int]int64{}
	for q := range b.Queues(topic) {
		off, ok, err := b.ConsumerOffset(group, topic, q)
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
	for _, tq := range []string{topic, "%RETRY%" + group} {
		for q := range b.Queues(tq) {
			hi, err := b.MaxOffset(tq, q)
			if err != nil {
				return 0, "", err
			}
			off, ok, err := b.ConsumerOffset(group, tq, q)
			if err != nil {
				return 0, "", err
			}
			if !ok {
				off = 0
			}
			total += hi - off
			detail = append(detail, fmt.Sprintf("%s/%d %d/%d", tq, q, off, hi))
		}
	}
	return total, fmt.Sprint(detail), nil
}

func (b *rocketBroker) waitNoLag(t *testing.T, topic, group string) {
	t.Helper()
	waitRocketNoLag(t, func() (int64, string, error) { return b.lag(topic, group) })
}

// waitRocketNoLag waits until lag, a group's, is 0.
func waitRocketNoLag(t *testing.T, lag func() (int64, string, error)) {
	t.Helper()
	testenv.WaitUntilProgress(t, 2*time.Minute, "the group has no lag (offsets are persisted every 5s)", func() (bool, string) {
		n, detail, err := lag()
		if err != nil {
			return false, err.Error()
		}
		return n == 0, fmt.Sprintf("lag %d: %s", n, detail)
	})
}

func (b *rocketBroker) deadLetters(t *testing.T, topic string, want int) []letter {
	t.Helper()
	return rocketDeadLetters(t, b.Broker, b.Count, topic, want)
}

// rocketDeadLetters reads topic's dead-letter topic through the name
// servers of rb until it holds want distinct messages; count says how many
// messages a topic holds.
func rocketDeadLetters(t *testing.T, rb *rmqtest.Broker, count func(topic string) (int64, error), topic string, want int) []letter {
	t.Helper()
	dlq := topic + "_DLQ"
	var letters []letter
	// A message can be dead-lettered twice (redelivered after its failure
	// was recorded): wait for want distinct messages, reading the topic
	// again as more letters arrive.
	testenv.WaitUntilProgress(t, 2*time.Minute, fmt.Sprintf("%d distinct dead letters in %s", want, dlq), func() (bool, string) {
		n, err := count(dlq)
		if err != nil {
			return false, err.Error()
		}
		if n < int64(want) || n == 0 {
			return n >= int64(want), fmt.Sprintf("%d letters", n)
		}
		letters = letters[:0]
		seen := map[string]bool{}
		for _, m := range rmqtest.ReadTopic(t, rb, dlq, int(n)) {
			prop := func(k string) string { v, _ := m.Header(k); return string(v) }
			letters = append(letters, letter{ID: string(m.Key), Reason: prop(wire.MetaReason), Attempts: prop(wire.MetaAttempts),
				Key: prop(wire.MetaKey), Scope: prop(wire.MetaKeyScope)})
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
	return rocketGivenBack(t, b.Broker, b.Count, group)
}

// rocketGivenBack is givenBack through the name servers of rb; count says
// how many messages a topic holds.
func rocketGivenBack(t *testing.T, rb *rmqtest.Broker, count func(topic string) (int64, error), group string) map[string]bool {
	t.Helper()
	retry := "%RETRY%" + group
	n, err := count(retry)
	if err != nil {
		t.Fatalf("messages in %s: %v", retry, err)
	}
	ids := map[string]bool{}
	if n > 0 {
		for _, m := range rmqtest.ReadTopic(t, rb, retry, int(n)) {
			ids[string(m.Key)] = true
		}
	}
	return ids
}

var _ givingBackBroker = (*rocketBroker)(nil)
