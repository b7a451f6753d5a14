package rocketmq

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	rmq "github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/source"
)

// These tests drive the push consumer's callback directly, with the client's
// consume contexts, and check the result the client would act on.

var quietLog = slog.New(slog.NewTextHandler(io.Discard, nil))

func testConfig(orderly bool, mode DeadLetterMode) *Config {
	cfg := Config{NameServers: []string{"127.0.0.1:9876"}, Group: "g", Topics: []string{"t"},
		Orderly: orderly, DeadLetter: mode, RetryDelayLevel: 2, Logger: quietLog}
	if err := cfg.validate(); err != nil {
		panic(err)
	}
	cfg.setDefaults()
	return &cfg
}

func batch(n int, queue int) []*primitive.MessageExt {
	mq := &primitive.MessageQueue{Topic: "t", BrokerName: "b", QueueId: queue}
	msgs := make([]*primitive.MessageExt, n)
	for i := range msgs {
		// As the client decodes a message without UNIQ_KEY: MsgId is the
		// OffsetMsgId.
		id := "id" + string(rune('a'+i))
		mx := &primitive.MessageExt{MsgId: id, OffsetMsgId: id, QueueOffset: int64(i)}
		mx.Topic = "t"
		mx.Body = []byte("body")
		mx.Queue = mq
		msgs[i] = mx
	}
	return msgs
}

// clientCtx builds the context the client passes to a callback.
func clientCtx(orderly bool) (context.Context, *primitive.ConsumeConcurrentlyContext, *primitive.ConsumeOrderlyContext) {
	ctx := context.Background()
	if orderly {
		oc := primitive.NewConsumeOrderlyContext()
		return primitive.WithOrderlyCtx(ctx, oc), nil, oc
	}
	cc := primitive.NewConsumeConcurrentlyContext()
	return primitive.WithConcurrentlyCtx(ctx, cc), cc, nil
}

// settleWith is a DeliverFunc that settles each message as decide says,
// from another goroutine, as the consumer's lanes do.
func settleWith(r **run, decide func(m *consumer.Message) (release bool, laneStopped bool)) source.DeliverFunc {
	return func(ctx context.Context, m *consumer.Message) error {
		go func() {
			release, stopped := decide(m)
			(*r).settle([]*consumer.Message{m}, release, stopped)
		}()
		return nil
	}
}

func TestConsumeResults(t *testing.T) {
	for _, orderly := range []bool{false, true} {
		name := "concurrent"
		giveBack := rmq.ConsumeRetryLater
		if orderly {
			name, giveBack = "orderly", rmq.SuspendCurrentQueueAMoment
		}
		t.Run(name, func(t *testing.T) {
			t.Run("all acked is success", func(t *testing.T) {
				var r *run
				r = newRun(testConfig(orderly, DeadLetterTopic), quietLog, settleWith(&r, func(*consumer.Message) (bool, bool) { return false, false }))
				cctx, _, _ := clientCtx(orderly)
				if got := r.consume(context.Background(), cctx, batch(5, 0)); got != rmq.ConsumeSuccess {
					t.Fatalf("result %v, want ConsumeSuccess", got)
				}
			})
			t.Run("one released gives the call back", func(t *testing.T) {
				var r *run
				r = newRun(testConfig(orderly, DeadLetterTopic), quietLog, settleWith(&r, func(m *consumer.Message) (bool, bool) {
					return m.Offset == 3, false
				}))
				cctx, cc, oc := clientCtx(orderly)
				if got := r.consume(context.Background(), cctx, batch(5, 0)); got != giveBack {
					t.Fatalf("result %v, want %v", got, giveBack)
				}
				if cc != nil && cc.DelayLevelWhenNextConsume != 2 {
					t.Fatalf("delay level %d, want the configured 2", cc.DelayLevelWhenNextConsume)
				}
				if oc != nil && oc.SuspendCurrentQueueTimeMillis != 1000 {
					t.Fatalf("suspend %dms, want the configured 1000", oc.SuspendCurrentQueueTimeMillis)
				}
			})
			t.Run("a delivery error gives the call back after the delivered ones settle", func(t *testing.T) {
				var r *run
				var mu sync.Mutex
				var acked []int64
				r = newRun(testConfig(orderly, DeadLetterTopic), quietLog, func(ctx context.Context, m *consumer.Message) error {
					if m.Offset == 2 {
						return consumer.ErrStopped
					}
					go func() {
						time.Sleep(10 * time.Millisecond) // settle after the failed delivery
						mu.Lock()
						acked = append(acked, m.Offset)
						mu.Unlock()
						r.settle([]*consumer.Message{m}, false, false)
					}()
					return nil
				})
				cctx, _, _ := clientCtx(orderly)
				if got := r.consume(context.Background(), cctx, batch(5, 0)); got != giveBack {
					t.Fatalf("result %v, want %v", got, giveBack)
				}
				mu.Lock()
				defer mu.Unlock()
				if len(acked) != 2 {
					t.Fatalf("returned before the delivered messages settled: acked %v", acked)
				}
				if len(r.inflight) != 0 {
					t.Fatalf("%d messages left in flight", len(r.inflight))
				}
			})
			t.Run("a panic gives the call back", func(t *testing.T) {
				r := newRun(testConfig(orderly, DeadLetterTopic), quietLog, func(context.Context, *consumer.Message) error {
					panic("boom")
				})
				cctx, _, _ := clientCtx(orderly)
				if got := r.consume(context.Background(), cctx, batch(3, 0)); got != giveBack {
					t.Fatalf("result %v, want %v", got, giveBack)
				}
				done := make(chan struct{})
				go func() { r.stop(); close(done) }()
				<-done // the panicking call left no busy count behind
			})
			t.Run("broker dead letter", func(t *testing.T) {
				var r *run
				r = newRun(testConfig(orderly, DeadLetterBroker), quietLog, func(ctx context.Context, m *consumer.Message) error {
					go func() {
						if err := r.markDead(m); err != nil {
							t.Error(err)
						}
						r.settle([]*consumer.Message{m}, false, false) // the consumer acks after DeadLetter
					}()
					return nil
				})
				cctx, cc, _ := clientCtx(orderly)
				msgs := batch(1, 0)
				got := r.consume(context.Background(), cctx, msgs)
				if got != giveBack {
					t.Fatalf("result %v, want %v", got, giveBack)
				}
				if cc != nil && cc.DelayLevelWhenNextConsume != -1 {
					t.Fatalf("delay level %d, want -1 (straight to %%DLQ%%)", cc.DelayLevelWhenNextConsume)
				}
				if orderly && msgs[0].ReconsumeTimes <= int32(r.cfg.MaxReconsumeTimes) {
					t.Fatalf("reconsume times %d, want past the maximum %d", msgs[0].ReconsumeTimes, r.cfg.MaxReconsumeTimes)
				}
			})
		})
	}
}

func TestConsumeWhileStopping(t *testing.T) {
	var r *run
	delivered := make(chan *consumer.Message, 10)
	r = newRun(testConfig(false, DeadLetterTopic), quietLog, func(ctx context.Context, m *consumer.Message) error {
		delivered <- m
		return nil
	})
	runCtx, cancel := context.WithCancel(context.Background())
	results := make(chan rmq.ConsumeResult, 2)
	cctx, _, _ := clientCtx(false)
	go func() { results <- r.consume(runCtx, cctx, batch(2, 0)) }()
	first, second := <-delivered, <-delivered

	// Run's context ends; the consumer releases what it holds (hard stop).
	cancel()
	stopped := make(chan struct{})
	go func() { r.stop(); close(stopped) }()
	cctx2, _, _ := clientCtx(false)
	go func() { results <- r.consume(runCtx, cctx2, batch(1, 1)) }() // a call after the stop
	r.settle([]*consumer.Message{first}, false, false)
	r.settle([]*consumer.Message{second}, true, false)
	<-stopped // every delivered message settled
	select {
	case res := <-results:
		t.Fatalf("a call returned %v before the push consumer was shut down", res)
	case <-time.After(50 * time.Millisecond):
	}
	r.shutDown()
	for range 2 {
		if res := <-results; res != rmq.ConsumeRetryLater {
			t.Fatalf("result %v, want ConsumeRetryLater (dropped by the shut-down client)", res)
		}
	}
	cctx3, _, _ := clientCtx(false)
	if res := r.consume(runCtx, cctx3, batch(1, 2)); res != rmq.ConsumeRetryLater { // a straggler after the shutdown
		t.Fatalf("result %v after the shutdown, want ConsumeRetryLater", res)
	}
	if len(delivered) != 0 {
		t.Fatal("a call delivered after the stop")
	}
}

func TestOrderlyStoppedLaneHoldsTheQueue(t *testing.T) {
	r := newRun(testConfig(true, DeadLetterTopic), quietLog, func(ctx context.Context, m *consumer.Message) error {
		return consumer.ErrLaneStopped
	})
	res := make(chan rmq.ConsumeResult, 1)
	cctx, _, _ := clientCtx(true)
	go func() { res <- r.consume(context.Background(), cctx, batch(2, 0)) }()
	select {
	case got := <-res:
		t.Fatalf("a stopped orderly lane returned %v; it must hold its queue", got)
	case <-time.After(50 * time.Millisecond):
	}
	r.stop() // the held call is not in flight
	r.shutDown()
	if got := <-res; got != rmq.SuspendCurrentQueueAMoment {
		t.Fatalf("result %v, want SuspendCurrentQueueAMoment", got)
	}
}

func TestConcurrentStoppedLaneGivesBack(t *testing.T) {
	r := newRun(testConfig(false, DeadLetterTopic), quietLog, func(ctx context.Context, m *consumer.Message) error {
		return consumer.ErrLaneStopped
	})
	cctx, _, _ := clientCtx(false)
	if got := r.consume(context.Background(), cctx, batch(2, 0)); got != rmq.ConsumeRetryLater {
		t.Fatalf("result %v, want ConsumeRetryLater", got)
	}
}

// Calls of one queue may run at once in concurrent mode; their deliveries
// must not interleave.
func TestDeliveriesOfOneLaneDoNotInterleave(t *testing.T) {
	var r *run
	var mu sync.Mutex
	active := map[string]int{}
	var seq []string
	r = newRun(testConfig(false, DeadLetterTopic), quietLog, func(ctx context.Context, m *consumer.Message) error {
		mu.Lock()
		active[m.Lane]++
		if active[m.Lane] > 1 {
			t.Errorf("two deliveries of lane %s at once", m.Lane)
		}
		seq = append(seq, m.ID)
		mu.Unlock()
		time.Sleep(time.Millisecond)
		mu.Lock()
		active[m.Lane]--
		mu.Unlock()
		go r.settle([]*consumer.Message{m}, false, false)
		return nil
	})
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			cctx, _, _ := clientCtx(false)
			if got := r.consume(context.Background(), cctx, batch(5, 0)); got != rmq.ConsumeSuccess {
				t.Errorf("result %v", got)
			}
		})
	}
	wg.Wait()
	if len(seq) != 20 {
		t.Fatalf("%d deliveries, want 20", len(seq))
	}
	for i := 0; i < len(seq); i += 5 {
		for j := 1; j < 5; j++ {
			if seq[i+j] <= seq[i+j-1] {
				t.Fatalf("a call's messages were interleaved or reordered: %v", seq)
			}
		}
	}
}

func TestMarkDeadUnknownMessage(t *testing.T) {
	r := newRun(testConfig(false, DeadLetterBroker), quietLog, nil)
	err := r.markDead(&consumer.Message{Topic: "t"})
	if err == nil {
		t.Fatal("marking a message that is not in flight succeeded")
	}
	if errors.Is(err, consumer.ErrStopped) {
		t.Fatal("unexpected error class")
	}
}
