package rocketmq_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/adapters/rocketmq"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/internal/testenv/rmqtest"
)

// delivery is what the handler saw of one delivery.
type delivery struct {
	attempt                   int
	id                        string // consumer.Message.ID
	msgID, offsetID, originID string // MsgId, OffsetMsgId, ORIGIN_MESSAGE_ID as the client decoded them
}

// TestRetriedMessageWithoutUniqKeyAppliedOnce: two payments without a
// UNIQ_KEY (the inner messages of a batch send of this client, which sets
// none on them) arrive in one consume call; the consumer, keyed by the
// broker message ID, applies T00001 and gives T00002 back (its lane
// stops), so the call returns "retry later" and the client sends both to
// %RETRY%<group>: T00001 after its effect committed. Its copy must be
// skipped as a duplicate, which needs an ID that survives the retry topic:
// the copy is stored anew, with a new OffsetMsgId.
//
// "broker": the usual send-back (CONSUMER_SEND_MSG_BACK): the broker copies
// the stored message with ORIGIN_MESSAGE_ID = the original's OffsetMsgId
// and no UNIQ_KEY. "fallback": the broker refuses the send-back (the
// handler points the messages' commit-log offsets at nothing), and the
// client sends a copy of the message it holds as an ordinary message, to
// which the 5.x broker adds a new UNIQ_KEY unless the copy has one.
func TestRetriedMessageWithoutUniqKeyAppliedOnce(t *testing.T) {
	t.Parallel()
	for _, path := range []string{"broker", "fallback"} {
		t.Run(path, func(t *testing.T) {
			t.Parallel()
			topic, group := name(t, "t"), name(t, "g")
			rmqtest.Shared(t).CreateTopic(t, topic, 1)
			rmqtest.Shared(t).CreateTopic(t, topic+"_DLQ", 1)
			rmqtest.Shared(t).CreateTopic(t, "%RETRY%"+group, 1) // see TestGivenBackMessagesComeBackThroughRetryTopic
			// One SendSync of two messages: a batch, whose inner messages
			// carry no UNIQ_KEY.
			rmqtest.Send(t, rmqtest.Shared(t).NewProducer(t), payment(topic, 1, 101), payment(topic, 2, 102))

			d := newDB(t)
			effect := insertEffect(d, 1)
			var mu sync.Mutex
			seen := map[string][]delivery{}
			src := source(t, rocketmq.Config{Group: group, Topics: []string{topic}, RetryDelayLevel: 1})
			r := start(t, consumer.Config[pgx.Tx]{
				Name: "ledger", Source: src, DeadLetter: src, Store: d.store, Key: consumer.ByMessageID(),
				Handler: consumer.HandlerFunc[pgx.Tx](func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
					txn, _ := consumer.ByJSONField("txn_id")(m)
					mx := m.Raw.(*primitive.MessageExt)
					mu.Lock()
					seen[txn] = append(seen[txn], delivery{attempt: m.Attempt, id: m.ID, msgID: mx.MsgId,
						offsetID: mx.OffsetMsgId, originID: mx.GetProperty(primitive.PropertyOriginMessageId)})
					mu.Unlock()
					if path == "fallback" && m.Attempt == 1 {
						// The broker finds no message there and answers the
						// send-back with an error. (The client reads the
						// field after the call returned, which waits for
						// this message to be settled.)
						mx.CommitLogOffset = 1 << 50
					}
					if txn == "T00002" && m.Attempt == 1 {
						return errors.New("downstream not ready")
					}
					return effect(ctx, tx, m)
				}),
				Retry: consumer.RetryPolicy{MaxAttempts: 1}, OnExhausted: consumer.StopLaneOnExhausted,
				Clock: consumertest.NewClock(), Logger: testLogger(t),
			})
			testenv.WaitUntil(t, 2*time.Minute, "T00002 applied from the retry topic and T00001's copy settled", func() bool {
				st := r.Stats()
				return d.count(t, "key = 'T00002'") >= 1 && st.Applied+st.Duplicates >= 3
			})
			r.Stop(t)

			st := r.Stats()
			if a, b := effectsOf(t, d, "T00001"), effectsOf(t, d, "T00002"); a != 1 || b != 1 {
				t.Errorf("effects: T00001 %d, T00002 %d; want 1 each (stats %+v)", a, b, st)
			}
			if st.Duplicates != 1 || st.Released < 1 {
				t.Errorf("stats %+v: want T00001's copy skipped as a duplicate, T00002 released once", st)
			}
			mu.Lock()
			defer mu.Unlock()
			// The handler may run more than once per delivery (a failed
			// batch is split and run again): one entry per attempt.
			a, b := byAttempt(seen["T00001"]), byAttempt(seen["T00002"])
			if len(a) != 1 || len(b) != 2 || b[0].attempt != 1 || b[1].attempt != 2 {
				t.Fatalf("deliveries to the handler: T00001 %+v, T00002 %+v; want T00001's first, T00002's first and second", a, b)
			}
			for _, first := range []delivery{a[0], b[0]} {
				// The client sets MsgId to the OffsetMsgId when there is
				// no UNIQ_KEY: the precondition of this test.
				if first.msgID != first.offsetID || first.id != first.offsetID {
					t.Fatalf("first delivery %+v: want no UNIQ_KEY (MsgId = OffsetMsgId) and the OffsetMsgId as ID", first)
				}
			}
			first, retried := b[0], b[1]
			if retried.offsetID == first.offsetID {
				t.Fatalf("the retried copy has the original's OffsetMsgId %s: it was not stored anew", first.offsetID)
			}
			if retried.id != first.id || retried.originID != first.offsetID {
				t.Errorf("retried copy %+v: want ID and ORIGIN_MESSAGE_ID %s (the original's OffsetMsgId)", retried, first.offsetID)
			}
			switch path {
			case "broker":
				if retried.msgID != retried.offsetID {
					t.Errorf("retried copy %+v: the broker's send-back gave it a UNIQ_KEY", retried)
				}
			case "fallback":
				if retried.msgID != first.offsetID {
					t.Errorf("retried copy %+v: want the UNIQ_KEY %s the adapter set on the message the client sent back", retried, first.offsetID)
				}
			}
		})
	}
}

// byAttempt keeps the first delivery of each attempt, in attempt order.
func byAttempt(ds []delivery) []delivery {
	var out []delivery
	for _, d := range ds {
		if len(out) == 0 || out[len(out)-1].attempt < d.attempt {
			out = append(out, d)
		}
	}
	return out
}
