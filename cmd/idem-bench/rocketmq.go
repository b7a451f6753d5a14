package main

// The RocketMQ rows: a topic prefilled with the Kafka rows' payloads, drained
// by a plain push consumer (rmq-raw) and by idem over adapters/rocketmq
// (rmq-idem-b100).

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/apache/rocketmq-client-go/v2/admin"
	rmq "github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"

	"github.com/idemkit/idem/adapters/rocketmq"
)

// rmqStall fails a RocketMQ row when no message was consumed for this long:
// the push consumer retries quietly forever otherwise.
const rmqStall = time.Minute

// rmqEnv is the RocketMQ side of a run: the prefilled topic.
type rmqEnv struct {
	namesrv []string
	broker  string // where the topic was created
	topic   string
	queues  int
	admin   admin.Admin
	created bool
	// instances numbers the client instance names of this process: every
	// client (producer, push consumer) gets its own, so that shutting one
	// down does not shut down a client another shares.
	instances atomic.Int64
}

// setClientLog routes the RocketMQ client library's logs (a process-wide
// logger, logrus at INFO to stdout by default) through the adapter's bridge:
// nowhere, or to stderr at level and above.
func setClientLog(level string) error {
	var lv slog.Level
	switch strings.ToLower(level) {
	case "off", "":
		rocketmq.SetClientLogger(slog.New(slog.DiscardHandler), slog.LevelError)
		return nil
	case "debug":
		lv = slog.LevelDebug
	case "info":
		lv = slog.LevelInfo
	case "warn":
		lv = slog.LevelWarn
	case "error":
		lv = slog.LevelError
	default:
		return fmt.Errorf("-rmq-client-log %q: want off, debug, info, warn or error", level)
	}
	rocketmq.SetClientLogger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lv})), lv)
	return nil
}

func nameServers(v string) []string {
	var out []string
	for _, a := range strings.FieldsFunc(v, func(r rune) bool { return r == ',' || r == ';' }) {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, a)
		}
	}
	return out
}

// setupRocketMQ creates topic with s.Partitions queues and prefills it with
// payloads; the duration is the prefill's alone. The caller closes the
// returned env (it deletes the topic) also when err is set.
func setupRocketMQ(ctx context.Context, s settings, topic string, payloads [][]byte, log io.Writer) (*rmqEnv, time.Duration, error) {
	ns := nameServers(s.NameServers)
	if len(ns) == 0 {
		return nil, 0, fmt.Errorf("-namesrv %q names no name server", s.NameServers)
	}
	broker := s.RMQBroker
	if broker == "" {
		var err error
		if broker, err = brokerAddr(ctx, ns[0]); err != nil {
			return nil, 0, err
		}
	}
	adm, err := admin.NewAdmin(admin.WithResolver(primitive.NewPassthroughResolver(ns)))
	if err != nil {
		return nil, 0, fmt.Errorf("admin: %w", err)
	}
	e := &rmqEnv{namesrv: ns, broker: broker, topic: topic, queues: s.Partitions, admin: adm}
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := adm.CreateTopic(cctx, admin.WithTopicCreate(topic), admin.WithBrokerAddrCreate(broker),
		admin.WithReadQueueNums(e.queues), admin.WithWriteQueueNums(e.queues)); err != nil {
		return e, 0, fmt.Errorf("create topic %s on %s: %w", topic, broker, err)
	}
	e.created = true
	var mqs []*primitive.MessageQueue
	for {
		mqs, err = adm.FetchPublishMessageQueues(cctx, topic)
		if err == nil && len(mqs) == e.queues {
			break
		}
		select {
		case <-cctx.Done():
			return e, 0, fmt.Errorf("topic %s: no route with %d queues after a minute (%d queues, %v)", topic, e.queues, len(mqs), err)
		case <-time.After(100 * time.Millisecond):
		}
	}
	slices.SortFunc(mqs, func(a, b *primitive.MessageQueue) int { return a.QueueId - b.QueueId })
	fmt.Fprintf(log, "  topic created on broker %s\n", broker)
	t0 := time.Now()
	err = e.prefill(ctx, mqs, payloads)
	return e, time.Since(t0), err
}

// instance returns a client instance name unique in this process.
func (e *rmqEnv) instance(what string) string {
	return fmt.Sprintf("idem-bench-%d-%s-%d", os.Getpid(), what, e.instances.Add(1))
}

// prefill sends payloads with Keys = txn_id, each to the queue its txn_id
// hashes to (so a duplicate lands where its first did, as in the Kafka
// topic), in batch sends of one queue, one sender per queue.
func (e *rmqEnv) prefill(ctx context.Context, mqs []*primitive.MessageQueue, payloads [][]byte) error {
	p, err := producer.NewDefaultProducer(
		producer.WithNsResolver(primitive.NewPassthroughResolver(e.namesrv)),
		producer.WithGroupName("idem-bench-prefill"),
		producer.WithInstanceName(e.instance("prefill")),
		producer.WithQueueSelector(producer.NewManualQueueSelector()),
		producer.WithSendMsgTimeout(30*time.Second),
		producer.WithRetry(2),
	)
	if err != nil {
		return fmt.Errorf("producer: %w", err)
	}
	if err := p.Start(); err != nil {
		return fmt.Errorf("producer: %w", err)
	}
	defer p.Shutdown()
	perQueue := make([][]*primitive.Message, len(mqs))
	for _, pl := range payloads {
		key := string(pl[11:24]) // the txn_id
		h := fnv.New32a()
		h.Write([]byte(key))
		q := int(h.Sum32() % uint32(len(mqs)))
		m := primitive.NewMessage(e.topic, pl)
		m.WithKeys([]string{key})
		// The client sets a message ID (UNIQ_KEY) only on single sends;
		// batches get one per message here, as the Java client does.
		m.WithProperty(primitive.PropertyUniqueClientMessageIdKeyIndex, primitive.CreateUniqID())
		m.Queue = mqs[q]
		perQueue[q] = append(perQueue[q], m)
	}
	// sendSome sends the first batch of *msgs (at most 256 messages, well
	// under the broker's 4 MiB per send) and drops it from *msgs.
	sendSome := func(msgs *[]*primitive.Message) error {
		n, size := 0, 0
		for n < len(*msgs) && n < 256 && size < 1<<20 {
			size += len((*msgs)[n].Body)
			n++
		}
		for attempt := 1; ; attempt++ {
			sctx, cancel := context.WithTimeout(ctx, time.Minute)
			res, err := p.SendSync(sctx, (*msgs)[:n]...)
			cancel()
			if err == nil && res.Status != primitive.SendOK {
				err = fmt.Errorf("send status %d", res.Status)
			}
			// A fresh producer whose senders race for the topic's route
			// can find no broker address for a moment; nothing was sent
			// then, so sending again duplicates nothing.
			if err != nil && strings.Contains(err.Error(), "route info not found") && attempt < 10 {
				time.Sleep(200 * time.Millisecond)
				continue
			}
			if err != nil {
				return err
			}
			*msgs = (*msgs)[n:]
			return nil
		}
	}
	// One batch first, alone, so that the route is known before the
	// senders run in parallel.
	for q := range perQueue {
		if len(perQueue[q]) > 0 {
			if err := sendSome(&perQueue[q]); err != nil {
				return fmt.Errorf("prefill queue %d: %w", q, err)
			}
			break
		}
	}
	errs := make([]error, len(mqs))
	var wg sync.WaitGroup
	for q := range perQueue {
		wg.Go(func() {
			for len(perQueue[q]) > 0 {
				if err := sendSome(&perQueue[q]); err != nil {
					errs[q] = fmt.Errorf("prefill queue %d: %w", q, err)
					return
				}
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

func (e *rmqEnv) close() {
	if e.created {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = e.admin.DeleteTopic(ctx, admin.WithTopicDelete(e.topic), admin.WithBrokerAddrDelete(e.broker),
			admin.WithNameSrvAddr(e.namesrv))
	}
	e.admin.Close()
}

// brokerAddr asks the name server, through mqadmin clusterList
// (scripts/testenv/rocketmq.sh admin), for the address of a master broker.
// mqadmin exits 0 even when it failed: the output decides.
func brokerAddr(ctx context.Context, namesrv string) (string, error) {
	script := filepath.Join("scripts", "testenv", "rocketmq.sh")
	if _, err := os.Stat(script); err != nil {
		_, file, _, _ := runtime.Caller(0)
		script = filepath.Join(filepath.Dir(file), "..", "..", "scripts", "testenv", "rocketmq.sh")
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, script, "admin", "clusterList", "-n", namesrv).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("mqadmin clusterList (give -rmq-broker to skip it): %v\n%s", err, out)
	}
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		// #Cluster Name  #Broker Name  #BID  #Addr ...
		if len(f) >= 4 && f[2] == "0" && strings.Contains(f[3], ":") {
			return f[3], nil
		}
	}
	return "", fmt.Errorf("mqadmin clusterList named no master broker (give -rmq-broker):\n%s", out)
}

// runRMQRaw drains the topic with a plain push consumer in concurrent mode
// whose callback returns ConsumeSuccess at once: no database, the broker's
// and client's ceiling. Latency is the time spent in the callback.
func runRMQRaw(ctx context.Context, e *env, group string, n int, lat *latencies) error {
	s, r := e.s, e.rmq
	pc, err := rmq.NewPushConsumer(
		rmq.WithNsResolver(primitive.NewPassthroughResolver(r.namesrv)),
		rmq.WithGroupName(group),
		rmq.WithInstance(r.instance("raw")),
		rmq.WithConsumerModel(rmq.Clustering),
		rmq.WithConsumerOrder(false),
		rmq.WithConsumeFromWhere(rmq.ConsumeFromFirstOffset),
		rmq.WithConsumeMessageBatchMaxSize(s.RMQCallBatch),
		rmq.WithPullBatchSize(int32(s.RMQPullBatch)),
		rmq.WithConsumeGoroutineNums(s.RMQGoroutines),
		rmq.WithAutoCommit(true),
	)
	if err != nil {
		return fmt.Errorf("push consumer: %w", err)
	}
	var consumed, calls, biggest atomic.Int64
	err = pc.Subscribe(r.topic, rmq.MessageSelector{Type: rmq.TAG, Expression: "*"},
		func(_ context.Context, msgs ...*primitive.MessageExt) (rmq.ConsumeResult, error) {
			t := time.Now()
			k := int64(len(msgs))
			calls.Add(1)
			for b := biggest.Load(); k > b && !biggest.CompareAndSwap(b, k); b = biggest.Load() {
			}
			d := time.Since(t)
			for range msgs {
				lat.add(d)
			}
			consumed.Add(k)
			return rmq.ConsumeSuccess, nil
		})
	if err != nil {
		return fmt.Errorf("subscribe: %w", err)
	}
	if err := pc.Start(); err != nil {
		return fmt.Errorf("start: %w", err)
	}
	last, progress := int64(0), time.Now()
	for {
		c := consumed.Load()
		if c >= int64(n) {
			break
		}
		if c != last {
			last, progress = c, time.Now()
		} else if time.Since(progress) > rmqStall {
			err = fmt.Errorf("stalled: %d of %d messages consumed, none for %v", c, n, rmqStall)
			break
		}
		select {
		case <-ctx.Done():
			err = ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
		if err != nil {
			break
		}
	}
	if c := calls.Load(); c > 0 {
		fmt.Fprintf(e.log, "  client: %d consume calls, %.1f messages each on average, at most %d\n", c, float64(consumed.Load())/float64(c), biggest.Load())
	}
	return errors.Join(err, shutdown(pc))
}

// shutdown shuts pc down (offsets persisted, client unregistered), waiting
// at most 30 s; some client goroutines linger after it (see the adapter's
// package doc).
func shutdown(pc interface{ Shutdown() error }) error {
	done := make(chan error, 1)
	go func() { done <- pc.Shutdown() }()
	select {
	case err := <-done:
		return err
	case <-time.After(30 * time.Second):
		return errors.New("push consumer shutdown took more than 30 s")
	}
}

// runRMQIdem drains the topic with idem over adapters/rocketmq, the same
// client settings as rmq-raw and the Kafka rows' business insert.
func runRMQIdem(ctx context.Context, e *env, group string, n int, sc string, batch int, lat *latencies) error {
	s, r := e.s, e.rmq
	src, err := rocketmq.New(rocketmq.Config{
		NameServers: r.namesrv, Group: group, Topics: []string{r.topic},
		BatchMaxSize: s.RMQCallBatch, PullBatchSize: s.RMQPullBatch, ConsumeGoroutines: s.RMQGoroutines,
		InstanceName: r.instance("idem"), Logger: quiet,
	})
	if err != nil {
		return err
	}
	return runEngine(ctx, e, src, n, sc, batch, 0, lat, rmqStall)
}
