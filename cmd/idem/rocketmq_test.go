package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/adapters/rocketmq"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/wire"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/internal/testenv/rmqtest"
)

// TestRedriveRocketMQ: a consumer of payment callbacks on RocketMQ,
// subscribed by tag, dead-letters the payment of a blocked account to
// idem's dead-letter topic. `idem redrive --broker rocketmq` refuses the
// letter while its key is failed and sends nothing; once the account is
// fixed and the key released it sends the letter back. The redrive is then
// cut off between its send and its commit (the group's offset is set back
// to the letter, and the redrive runs again over the same position), so
// that two copies reach the consumer, which is down meanwhile. Started
// again, it consumes the whole topic: the payment is applied once, by the
// copy's lineage (keyed by the original's message ID, or by the business
// key). A redrive that resumes from the committed position finds nothing;
// one set back to the letter again passes it by as a duplicate (the key's
// done row).
func TestRedriveRocketMQ(t *testing.T) {
	for _, mode := range []struct {
		name string
		key  consumer.KeyFunc
	}{
		{"ByMessageID", consumer.ByMessageID()},
		{"BusinessKey", consumer.ByJSONField("txn_id")},
	} {
		t.Run(mode.name, func(t *testing.T) {
			p := newRocketPayments(t, mode.key)
			ctx := context.Background()
			if _, err := p.pool.Exec(ctx, `INSERT INTO blocked VALUES ('T03')`); err != nil {
				t.Fatal(err)
			}
			p.produce("T00", "T01", "T02", "T03", "T04")
			p.start()
			p.waitFor("5 settled", func(s consumer.Stats) bool { return s.Applied+s.DeadLettered == 5 })
			if s := p.consumer.Stats(); s.Applied != 4 || s.DeadLettered != 1 {
				t.Fatalf("stats %+v", s)
			}
			p.stop()
			if _, err := p.pool.Exec(ctx, `DELETE FROM blocked`); err != nil {
				t.Fatal(err)
			}
			topicCount := p.count(p.topic)

			redrive := func(wantCode int, args ...string) redriveJSON {
				t.Helper()
				code, out, _ := idem(t, "", p.envs, append([]string{"redrive", "--broker", "rocketmq", "--topic", p.dlq, "--json"}, args...)...)
				rd := decode[redriveJSON](t, out)
				if code != wantCode {
					t.Fatalf("redrive %v: exit %d, want %d: %+v", args, code, wantCode, rd)
				}
				return rd
			}

			// Not released: refused, nothing sent, nothing committed.
			rd := redrive(exitPartial)
			if len(rd.Letters) != 1 || rd.Letters[0].Action != "refused" || !strings.Contains(rd.Letters[0].Reason, "release it first") {
				t.Fatalf("redrive of a failed key: %+v", rd)
			}
			letter := rd.Letters[0]
			if n := p.count(p.topic); n != topicCount {
				t.Fatalf("a refused redrive sent %d messages", n-topicCount)
			}
			if code, _, _ := idem(t, "", p.envs, "release", "--scope", "pay", "--yes", letter.Key); code != exitOK {
				t.Fatalf("release %s: exit %d", letter.Key, code)
			}

			// Sent; then the same position again: a redrive cut off
			// between its send and its commit, run again.
			for i := range 2 {
				rd = redrive(exitOK)
				if len(rd.Letters) != 1 || rd.Letters[0].Action != "sent" || rd.Letters[0].Letter != letter.Letter ||
					rd.Letters[0].Count != 1 || !strings.HasPrefix(rd.Letters[0].To, p.topic+"/") {
					t.Fatalf("redrive %d of the released letter: %+v", i+1, rd)
				}
				if i == 0 {
					p.setBack(letter.Letter)
				}
			}
			p.waitCount(p.topic, topicCount+2)
			// Resumed from the committed position: nothing left.
			if rd := redrive(exitOK); len(rd.Letters) != 0 {
				t.Errorf("a redrive resumed past the sent letter: %+v", rd)
			}
			p.checkCopies(letter)

			p.start()
			p.waitConsumed()
			if got := p.ledger(); got["T03"] != 1 || len(got) != 5 {
				t.Errorf("ledger %v: T03 applied %d times, want once", got, got["T03"])
			}
			// One applied, the other a duplicate; the broker may deliver
			// again what the first consumer settled after its last offset
			// persist (every 5 s), which adds duplicates, never effects.
			if s := p.consumer.Stats(); s.Applied != 1 || s.Duplicates < 1 {
				t.Errorf("the two copies: %+v, want one applied and at least one duplicate", s)
			}
			p.stop()

			// Set back to the letter once more: passed by as a duplicate
			// (its key is done), nothing sent.
			p.setBack(letter.Letter)
			rd = redrive(exitOK)
			if len(rd.Letters) != 1 || rd.Letters[0].Action != "duplicate" || !strings.Contains(rd.Letters[0].Reason, "applied") {
				t.Errorf("redrive of an applied letter: %+v", rd)
			}
			if n := p.count(p.topic); n != topicCount+2 {
				t.Errorf("the refused letter was sent (%d messages)", n-topicCount-2)
			}
		})
	}
}

// TestRedriveWrongBroker: an address of the other broker, or a topic
// redrive cannot read, is named as such (exit 2) and nothing is printed as
// if the topic were empty.
func TestRedriveWrongBroker(t *testing.T) {
	ns := rmqtest.Shared(t).NameServers[0]
	kafkaBroker := testenv.KafkaBrokers(t)[0]
	path := filepath.Join(t.TempDir(), "idem.db")
	if code, _, _ := idem(t, "", nil, "migrate", "--sqlite", path); code != exitOK {
		t.Fatalf("migrate: exit %d", code)
	}
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"a name server as Kafka's", []string{"--brokers", ns}, "answers like a RocketMQ name server, not a Kafka broker"},
		{"a RocketMQ broker as Kafka's", []string{"--brokers", rmqtest.Shared(t).Addr}, "answers like a RocketMQ broker, not a Kafka broker"},
		{"a Kafka broker as a name server", []string{"--namesrv", kafkaBroker}, "answers like a Kafka broker, not a RocketMQ name server"},
		{"a broker as a name server", []string{"--broker", "rocketmq", "--namesrv", rmqtest.Shared(t).Addr}, "answers like a RocketMQ broker, not a RocketMQ name server"},
		{"the broker's own DLQ", []string{"--namesrv", ns, "--topic", "%DLQ%pay"}, "the broker's dead-letter queue"},
		{"a RocketMQ topic on Kafka", []string{"--brokers", kafkaBroker, "--topic", "%DLQ%pay"}, "is a RocketMQ topic: use --broker rocketmq"},
		{"no name servers", []string{"--broker", "rocketmq", "--brokers", kafkaBroker}, "no RocketMQ name servers: set --namesrv"},
		{"an unknown broker", []string{"--broker", "pulsar", "--brokers", kafkaBroker}, `--broker "pulsar": kafka or rocketmq`},
	} {
		t.Run(c.name, func(t *testing.T) {
			args := append([]string{"redrive", "--sqlite", path, "--topic", "pay_DLQ"}, c.args...)
			code, out, errOut := idem(t, "", nil, args...)
			if code != exitUsage || !strings.Contains(errOut, c.want) || strings.Contains(out, "nothing to redrive") {
				t.Errorf("exit %d, stdout %q, stderr %q; want exit %d and %q", code, out, errOut, exitUsage, c.want)
			}
		})
	}
}

// rocketPayments is payments on RocketMQ: a consumer subscribed to the tag
// "pay", dead-lettering to idem's topic <topic>_DLQ.
type rocketPayments struct {
	t          *testing.T
	b          *rmqtest.Broker
	pool       *pgxpool.Pool
	schema     string
	topic, dlq string
	group      string
	key        consumer.KeyFunc
	consumer   *consumer.Consumer[pgx.Tx]
	stop       func()
	envs       map[string]string
}

func newRocketPayments(t *testing.T, key consumer.KeyFunc) *rocketPayments {
	b := rmqtest.Shared(t)
	pool, schema := testenv.SchemaPool(t)
	p := &rocketPayments{t: t, b: b, pool: pool, schema: schema, topic: testenv.Name(t, "pay"), group: testenv.Name(t, "g"), key: key}
	p.dlq = p.topic + "_DLQ"
	b.CreateTopic(t, p.topic, 2)
	b.CreateTopic(t, p.dlq, 2)
	p.envs = map[string]string{"IDEM_PG_URL": testenv.PostgresURL(t), "IDEM_PG_SCHEMA": schema, "IDEM_ROCKETMQ_NAMESRV": strings.Join(b.NameServers, ";")}
	// No primary key: a payment applied twice is two rows.
	if _, err := pool.Exec(context.Background(), `CREATE TABLE ledger (txn_id text NOT NULL, amount int8 NOT NULL);
CREATE TABLE blocked (txn_id text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	return p
}

// produce sends a tagged payment callback for each of ids, KEYS the ID.
func (p *rocketPayments) produce(ids ...string) {
	p.t.Helper()
	var msgs []*primitive.Message
	for i, id := range ids {
		m := primitive.NewMessage(p.topic, fmt.Appendf(nil, `{"txn_id":%q,"amount":%d}`, id, 100+i))
		m.WithKeys([]string{id})
		m.WithTag("pay")
		m.WithProperty("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
		msgs = append(msgs, m)
	}
	prod := p.b.NewProducer(p.t)
	for _, m := range msgs { // one by one: each gets a UNIQ_KEY, the message ID
		rmqtest.Send(p.t, prod, m)
	}
}

func (p *rocketPayments) start() {
	src, err := rocketmq.New(rocketmq.Config{NameServers: p.b.NameServers, Group: p.group, Topics: []string{p.topic},
		Tags: "pay", Logger: testenv.Logger(p.t)})
	if err != nil {
		p.t.Fatal(err)
	}
	p.consumer, p.stop = startPay(p.t, p.pool, p.schema, consumer.Config[pgx.Tx]{Source: src, DeadLetter: src, Key: p.key}, false, time.Minute)
}

func (p *rocketPayments) waitFor(what string, ok func(consumer.Stats) bool) {
	p.t.Helper()
	testenv.WaitUntilProgress(p.t, 2*time.Minute, what, func() (bool, string) {
		s := p.consumer.Stats()
		return ok(s), fmt.Sprintf("%+v", s)
	})
}

// waitConsumed waits until the consumer's group committed the end of every
// queue of the topic: it consumed the whole topic.
func (p *rocketPayments) waitConsumed() {
	p.t.Helper()
	testenv.WaitUntilProgress(p.t, 2*time.Minute, "the topic consumed", func() (bool, string) {
		var progress []string
		done := true
		for q := range p.b.Queues(p.topic) {
			end, err := p.b.MaxOffset(p.topic, q)
			if err != nil {
				return false, err.Error()
			}
			off, _, err := p.b.ConsumerOffset(p.group, p.topic, q)
			if err != nil {
				return false, err.Error()
			}
			done = done && off >= end
			progress = append(progress, fmt.Sprintf("queue %d at %d of %d", q, off, end))
		}
		return done, strings.Join(progress, ", ")
	})
}

func (p *rocketPayments) ledger() map[string]int { p.t.Helper(); return ledgerRows(p.t, p.pool) }

// count returns how many messages topic holds.
func (p *rocketPayments) count(topic string) int64 {
	p.t.Helper()
	n, err := p.b.Count(topic)
	if err != nil {
		p.t.Fatal(err)
	}
	return n
}

// waitCount waits until topic holds n messages: a message the broker
// acknowledged is in its queue's offsets a moment later.
func (p *rocketPayments) waitCount(topic string, n int64) {
	p.t.Helper()
	testenv.WaitUntilProgress(p.t, time.Minute, fmt.Sprintf("%s holds %d messages", topic, n), func() (bool, string) {
		got := p.count(topic)
		return got == n, fmt.Sprintf("%d", got)
	})
}

// setBack commits the redrive group's offset of the letter's queue back to
// the letter (dlq/broker/queue/offset): as if the redrive had stopped
// between its send and its commit.
func (p *rocketPayments) setBack(pos string) {
	p.t.Helper()
	parts := strings.Split(strings.TrimPrefix(pos, p.dlq+"/"), "/")
	if len(parts) != 3 || parts[0] != p.b.Name {
		p.t.Fatalf("letter %q: want %s/%s/queue/offset", pos, p.dlq, p.b.Name)
	}
	q, err1 := strconv.Atoi(parts[1])
	off, err2 := strconv.ParseInt(parts[2], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		p.t.Fatalf("letter %q: %v", pos, err)
	}
	if err := p.b.CommitOffset("idem-redrive", p.dlq, q, off); err != nil {
		p.t.Fatal(err)
	}
}

// checkCopies reads the topic and checks the two copies of the letter:
// the original's body, KEYS, TAGS and properties, its identity, and the
// lineage of the redrive.
func (p *rocketPayments) checkCopies(l letterResult) {
	p.t.Helper()
	var originalID string
	var copies []*consumer.Message
	for _, m := range rmqtest.ReadTopic(p.t, p.b, p.topic, 7) {
		if string(m.Key) != "T03" {
			continue
		}
		if _, ok := m.Header(wire.MetaRedriveCount); ok {
			copies = append(copies, m)
		} else {
			originalID = m.ID
		}
	}
	if len(copies) != 2 || originalID == "" {
		p.t.Fatalf("%d copies of T03 in the topic, original ID %q", len(copies), originalID)
	}
	for _, m := range copies {
		h := func(k string) string { v, _ := m.Header(k); return string(v) }
		mx := m.Raw.(*primitive.MessageExt)
		for k, want := range map[string]string{
			wire.MetaRedriveCount: "1", wire.MetaRedrivenFrom: l.Letter, wire.MetaTopic: p.topic,
			wire.MetaMessageID: originalID, wire.MetaKeyScope: "pay", wire.MetaKey: l.Key,
			wire.MetaReason: "", wire.MetaLane: "", wire.MetaAttempts: "",
			"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		} {
			if got := h(k); got != want {
				p.t.Errorf("copy %s: %s = %q, want %q", m.ID, k, got, want)
			}
		}
		if mx.GetTags() != "pay" || !strings.Contains(string(m.Value), `"T03"`) || m.ID == originalID {
			p.t.Errorf("copy %s: tags %q, body %s", m.ID, mx.GetTags(), m.Value)
		}
	}
}

// toQueue is a queue selector that picks one queue ID.
type toQueue int

func (q toQueue) Select(_ *primitive.Message, mqs []*primitive.MessageQueue, _ string) *primitive.MessageQueue {
	for _, mq := range mqs {
		if mq.QueueId == int(q) {
			return mq
		}
	}
	return mqs[0]
}

// produceTo sends a tagged payment callback for id to queue q.
func (p *rocketPayments) produceTo(q int, id string) {
	p.t.Helper()
	m := primitive.NewMessage(p.topic, fmt.Appendf(nil, `{"txn_id":%q,"amount":100}`, id))
	m.WithKeys([]string{id})
	m.WithTag("pay")
	rmqtest.Send(p.t, p.b.NewProducer(p.t, producer.WithQueueSelector(toQueue(q))), m)
}

// TestRedriveRocketMQTwinsInTwoQueues: one payment, sent twice to two
// queues of a blocked account, is dead-lettered twice (a permanent letter
// and a failed_before one, in two queues of the dead-letter topic); then
// another payment in the second queue. `idem failed` counts one incident.
// Both fixed and released, a redrive of one letter applies the payment;
// the next redrive passes its twin in the other queue by as a duplicate
// and sends the letter after it (the twin used to be refused, "the key
// was applied", and stop its queue for good).
func TestRedriveRocketMQTwinsInTwoQueues(t *testing.T) {
	p := newRocketPayments(t, consumer.ByJSONField("txn_id"))
	ctx := context.Background()
	if _, err := p.pool.Exec(ctx, `INSERT INTO blocked VALUES ('T03'), ('T05')`); err != nil {
		t.Fatal(err)
	}
	p.produceTo(0, "T03")
	p.produceTo(1, "T03")
	p.start()
	p.waitFor("T03's two dead-lettered", func(s consumer.Stats) bool { return s.DeadLettered == 2 })
	p.produceTo(1, "T05")
	p.waitFor("T05 dead-lettered", func(s consumer.Stats) bool { return s.DeadLettered == 3 })

	code, out, _ := idem(t, "", p.envs, "failed", "--json", "--scope", "pay")
	rows := decode[[]rowJSON](t, out)
	if code != exitOK || len(rows) != 2 || rows[0].Key != "T03" || rows[0].Cause != "permanent" {
		t.Errorf("idem failed: %d %+v, want T03 once and T05", code, rows)
	}
	if code, out, _ := idem(t, "", p.envs, "failed", "--scope", "pay"); code != exitOK || !strings.Contains(out, "2 failed keys, one incident each") {
		t.Errorf("idem failed: %d %q", code, out)
	}

	if _, err := p.pool.Exec(ctx, `DELETE FROM blocked`); err != nil {
		t.Fatal(err)
	}
	if code, _, _ := idem(t, "", p.envs, "release", "--scope", "pay", "--yes", "T03", "T05"); code != exitOK {
		t.Fatalf("release: exit %d", code)
	}
	redrive := func(wantCode int, args ...string) []string {
		t.Helper()
		code, out, errOut := idem(t, "", p.envs, append([]string{"redrive", "--broker", "rocketmq", "--topic", p.dlq, "--json"}, args...)...)
		if code != wantCode {
			t.Fatalf("redrive %v: exit %d, want %d\n%s%s", args, code, wantCode, out, errOut)
		}
		var got []string
		for _, l := range decode[redriveJSON](t, out).Letters {
			got = append(got, l.Key+" "+l.Action)
		}
		return got
	}
	if got := redrive(exitOK, "--max", "1"); fmt.Sprint(got) != "[T03 sent]" {
		t.Fatalf("the first redrive: %v", got)
	}
	p.waitFor("T03 applied", func(s consumer.Stats) bool { return s.Applied == 1 })
	// The letters of each original queue lie in one queue of the
	// dead-letter topic (which one, the lane's hash says): T05's after a
	// T03 letter, so that the first redrive sends a T03 letter.
	if got := redrive(exitOK); fmt.Sprint(slices.Sorted(slices.Values(got))) != "[T03 duplicate T05 sent]" {
		t.Errorf("the second redrive: %v, want T03's twin a duplicate and T05 sent", got)
	}
	p.waitFor("T05 applied", func(s consumer.Stats) bool { return s.Applied == 2 })
	if got := p.ledger(); got["T03"] != 1 || got["T05"] != 1 {
		t.Errorf("ledger %v", got)
	}
}
