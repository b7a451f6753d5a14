package rocketmq_test

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/adapters/rocketmq"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/consumer/wire"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/internal/testenv/rmqtest"
)

// TestRedrivenCopiesAppliedOnce: keyed by message ID, T00001 is rejected
// and dead-lettered to idem's topic. The cause is fixed, its failed row
// released, and the letter sent back to the topic twice (redriven twice),
// as a redrive tool does: its body, KEYS and properties, and
// idem-redrive-count. Each copy is a new message with a UNIQ_KEY of its
// own; the idem-* lineage survives the broker as user properties, and both
// copies are keyed by the original's ID: T00001 is applied once.
func TestRedrivenCopiesAppliedOnce(t *testing.T) {
	t.Parallel()
	topic := oneQueue(t, 1, 2, 3)
	d := newDB(t)
	var blocked atomic.Bool
	blocked.Store(true)
	effect := insertEffect(d, 1)
	src := source(t, rocketmq.Config{Group: name(t, "g"), Topics: []string{topic}})
	r := start(t, consumer.Config[pgx.Tx]{
		Name: "ledger", Source: src, DeadLetter: src, Store: d.store, Key: consumer.ByMessageID(),
		Handler: consumer.HandlerFunc[pgx.Tx](func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			if string(m.Key) == "T00001" && blocked.Load() {
				return consumer.Permanent(errors.New("account blocked"))
			}
			return effect(ctx, tx, m)
		}),
		Clock: consumertest.NewClock(), Logger: testLogger(t),
	})
	settled := func(n int64) func() bool {
		return func() bool {
			s := r.Stats()
			return s.Applied+s.Duplicates+s.DeadLettered >= n
		}
	}
	testenv.WaitUntil(t, time.Minute, "3 settled", settled(3))
	if s := r.Stats(); s.Applied != 2 || s.DeadLettered != 1 {
		t.Fatalf("stats %+v", s)
	}

	letter := rmqtest.ReadTopic(t, rmqtest.Shared(t), topic+"_DLQ", 1)[0]
	key, _ := letter.Header(wire.MetaKey)
	id, _ := letter.Header(wire.MetaMessageID)
	if len(id) == 0 || string(key) != string(id) {
		t.Fatalf("the letter's key %q, original ID %q", key, id)
	}
	blocked.Store(false)
	if _, err := d.store.Admin().Release(context.Background(), []dedup.Key{{Scope: "ledger", ID: string(key)}}, false); err != nil {
		t.Fatal(err)
	}
	var copies []*primitive.Message
	for count := 1; count <= 2; count++ {
		m := primitive.NewMessage(topic, letter.Value)
		for _, h := range letter.Headers {
			switch h.Key {
			case wire.MetaReason, wire.MetaAttempts, wire.MetaAttempt, wire.MetaLane:
			default:
				m.WithProperty(h.Key, string(h.Value))
			}
		}
		m.WithProperty(wire.MetaRedriveCount, strconv.Itoa(count))
		m.WithKeys([]string{string(letter.Key)})
		copies = append(copies, m)
	}
	rmqtest.Send(t, rmqtest.Shared(t).NewProducer(t), copies[0])
	rmqtest.Send(t, rmqtest.Shared(t).NewProducer(t), copies[1])
	testenv.WaitUntil(t, time.Minute, "the two copies settled", settled(5))
	r.Stop(t)
	if n := effectsOf(t, d, "T00001"); n != 1 {
		t.Errorf("T00001: %d effects, want 1", n)
	}
	if s := r.Stats(); s.Applied != 3 || s.Duplicates != 1 {
		t.Errorf("stats %+v: want the copies once applied, once a duplicate", s)
	}
	rows, err := d.store.Admin().Find(context.Background(), "ledger", string(id))
	if err != nil || len(rows) != 1 || rows[0].Outcome != "done" {
		t.Errorf("the original's key: rows %+v, %v; want its done row", rows, err)
	}
}
