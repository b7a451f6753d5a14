package consumer_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/consumer/wire"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/memstore"
)

// TestEveryLetterHasItsCause: each way a message is dead-lettered gives its
// letter a cause of its own, in Letter.Cause and in the letter's idem-cause
// header, and the key whenever one was derived — a message Validate refused
// too, whose key is not claimed.
func TestEveryLetterHasItsCause(t *testing.T) {
	cfg := baseConfig(func(ctx context.Context, tx *memstore.Tx, m *consumer.Message) error {
		switch id, _ := consumer.ByJSONField("txn_id")(m); id {
		case "P1":
			return consumer.Permanent(errors.New("account closed"))
		case "R1":
			return consumer.Retryable(errors.New("downstream away"))
		case "D1":
			if amount, _ := consumer.ByJSONField("amount")(m); amount == "1" {
				return fmt.Errorf("refund step: %w", consumer.InDoubt(errors.New("provider keeps keys no more")))
			}
		case "J1":
			if amount, _ := consumer.ByJSONField("amount")(m); amount != "2" {
				return consumer.Reject(errors.New("wrong amount"))
			}
		case "M1":
			if amount, _ := consumer.ByJSONField("amount")(m); amount == "1" {
				return fmt.Errorf("refund step: %w", consumer.Reject(fmt.Errorf("%w: begun for another payload", dedup.ErrFingerprintMismatch)))
			}
		}
		return nil
	})
	cfg.Validate = func(_ context.Context, m *consumer.Message) error {
		if bytes.Contains(m.Value, []byte("forged")) {
			return errors.New("bad signature")
		}
		return nil
	}
	res := consumertest.Run(t, cfg, consumertest.Script{},
		consumertest.Message("pay", 0, 0, "", `not json`),
		consumertest.Message("pay", 0, 1, "", `{"txn_id":"F1","sig":"forged"}`),
		consumertest.Message("pay", 0, 2, "", `{"txn_id":"A1","amount":1}`),
		consumertest.Message("pay", 0, 3, "", `{"txn_id":"A1","amount":2}`),
		consumertest.Message("pay", 0, 4, "", `{"txn_id":"P1"}`),
		consumertest.Message("pay", 0, 5, "", `{"txn_id":"P1"}`),
		consumertest.Message("pay", 0, 6, "", `{"txn_id":"R1"}`),
		consumertest.Message("pay", 0, 7, "", `{"txn_id":"F1","sig":"good"}`),
		consumertest.Message("pay", 0, 8, "", `{"txn_id":"J1","amount":1}`),
		consumertest.Message("pay", 0, 9, "", `{"txn_id":"J1","amount":2}`),
		consumertest.Message("pay", 0, 10, "", `{"txn_id":"D1","amount":1}`),
		consumertest.Message("pay", 0, 11, "", `{"txn_id":"D1","amount":1}`),
		consumertest.Message("pay", 0, 12, "", `{"txn_id":"M1","amount":1}`),
		consumertest.Message("pay", 0, 13, "", `{"txn_id":"M1","amount":2}`))
	want := []struct {
		offset int64
		cause  consumer.Cause
		key    string
	}{
		{0, consumer.CauseBadInput, ""},
		{1, consumer.CauseValidate, "F1"},
		{3, consumer.CauseMismatch, "A1"},
		{4, consumer.CausePermanent, "P1"},
		{5, consumer.CauseFailedBefore, "P1"},
		{6, consumer.CauseExhausted, "R1"},
		{8, consumer.CauseRejected, "J1"},
		{10, consumer.CauseInDoubt, "D1"},
		{11, consumer.CauseInDoubt, "D1"},
		{12, consumer.CauseMismatch, "M1"},
	}
	if len(res.DeadLetters) != len(want) {
		t.Fatalf("%d letters, want %d: %+v", len(res.DeadLetters), len(want), res.DeadLetters)
	}
	for i, w := range want {
		l := res.DeadLetters[i]
		headers := map[string]string{}
		hs, _ := wire.Letter(l).Record(1 << 20)
		for _, h := range hs {
			headers[h.Key] = string(h.Value)
		}
		if l.Message.Offset != w.offset || l.Cause != w.cause || headers[wire.MetaCause] != w.cause.String() ||
			l.Key.ID != w.key || headers[wire.MetaKey] != w.key {
			t.Errorf("letter %d: offset %d, cause %v (header %q), key %q (header %q); want offset %d, %v, key %q",
				i, l.Message.Offset, l.Cause, headers[wire.MetaCause], l.Key.ID, headers[wire.MetaKey], w.offset, w.cause, w.key)
		}
		if want := w.key != ""; (l.Fingerprint != dedup.Fingerprint{}) != want || (headers[wire.MetaFingerprint] != "") != want {
			t.Errorf("letter %d (%v): fingerprint %x, header %q", i, l.Cause, l.Fingerprint, headers[wire.MetaFingerprint])
		}
		if c, ok := wire.ParseCause(headers[wire.MetaCause]); !ok || c != w.cause || c.Repeat() != (w.cause == consumer.CauseFailedBefore) {
			t.Errorf("letter %d: ParseCause(%q) = %v, %v", i, headers[wire.MetaCause], c, ok)
		}
	}
	// The forgery did not take F1, nor the rejected message J1: the genuine
	// messages behind them were applied. D1 in doubt took no key either: its
	// re-send ran the handler again and was dead-lettered again (no
	// failed_before). M1 rejected as a mismatch by the handler (a call
	// made under its key for another payload) took no key either.
	if res.Stats.Applied != 4 {
		t.Errorf("applied %d, want A1, the genuine F1, J1 and M1", res.Stats.Applied)
	}
}

// TestOutermostMarkWins: Reject wrapped in Permanent is Permanent again
// (a middleware that makes every refusal permanent), and the other way
// round.
func TestOutermostMarkWins(t *testing.T) {
	err := errors.New("wrong amount")
	for _, c := range []struct {
		err                 error
		rejected, permanent bool
	}{
		{consumer.Reject(err), true, false},
		{consumer.Permanent(consumer.Reject(err)), false, true},
		{consumer.Reject(consumer.Permanent(err)), true, true},
		{fmt.Errorf("handler: %w", consumer.Reject(err)), true, false},
		{err, false, false},
	} {
		if consumer.IsRejected(c.err) != c.rejected || consumer.IsPermanent(c.err) != c.permanent {
			t.Errorf("%v: rejected %t, permanent %t", c.err, consumer.IsRejected(c.err), consumer.IsPermanent(c.err))
		}
	}
	if consumer.Reject(nil) != nil {
		t.Error("Reject(nil) is not nil")
	}
}

// recordingStore is a memstore that keeps the claims of the failures it
// records.
type recordingStore struct {
	*memstore.Store
	mu     sync.Mutex
	failed []dedup.Claim
}

func (s *recordingStore) RecordFailure(ctx context.Context, c dedup.Claim, reason string) error {
	s.mu.Lock()
	s.failed = append(s.failed, c)
	s.mu.Unlock()
	return s.Store.RecordFailure(ctx, c, reason)
}

// TestOneNameForAMessage: a log line, the dedup row's source (what `idem
// failed` shows) and the letter's headers name a message the same way —
// lane and offset, then the broker's ID where that is not the position —
// and a message without a key logs no key (not "|").
func TestOneNameForAMessage(t *testing.T) {
	var logs bytes.Buffer
	store := &recordingStore{Store: memstore.New(memstore.Config{})}
	cfg := baseConfig(func(context.Context, *memstore.Tx, *consumer.Message) error {
		return consumer.Permanent(errors.New("account closed"))
	})
	cfg.Store = store
	cfg.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
	// A RocketMQ message: its lane names the broker, its ID is the broker's.
	rmq := consumertest.Message("pay", 0, 120, "", `{"txn_id":"T1"}`)
	rmq.Lane, rmq.ID = "pay/broker-a/0", "AC110001000078308DB1B2D2D6F80000"
	kafka := consumertest.Message("pay", 1, 7, "", `not json`)
	res := consumertest.Run(t, cfg, consumertest.Script{}, rmq, kafka)

	const rmqRef = "pay/broker-a/0/120 (AC110001000078308DB1B2D2D6F80000)"
	if got := rmq.Ref(); got != rmqRef {
		t.Errorf("Ref %q, want %q", got, rmqRef)
	}
	if got := kafka.Ref(); got != "pay/1/7" {
		t.Errorf("Kafka Ref %q, want pay/1/7", got)
	}
	if len(store.failed) != 1 || store.failed[0].Source != rmqRef {
		t.Errorf("recorded failures %+v, want the source %q", store.failed, rmqRef)
	}
	lines := map[string]map[string]any{} // message -> the dead-letter log line
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if rec["msg"] == "idem: message dead-lettered" {
			lines[rec["message"].(string)] = rec
		}
	}
	if l := lines[rmqRef]; l == nil || l["scope"] != "payments" || l["key"] != "T1" || l["cause"] != "permanent" {
		t.Errorf("the RocketMQ message's line %v; lines %v", l, lines)
	}
	if l := lines["pay/1/7"]; l == nil || l["cause"] != "bad_input" {
		t.Errorf("the keyless message's line %v; lines %v", l, lines)
	} else if _, ok := l["key"]; ok {
		t.Errorf("a message without a key logs key=%q", l["key"])
	}
	for _, l := range res.DeadLetters {
		h := map[string]string{}
		hs, _ := wire.Letter(l).Record(1 << 20)
		for _, x := range hs {
			h[x.Key] = string(x.Value)
		}
		if got := h[wire.MetaLane] + "/" + h[wire.MetaOffset]; got != strings.SplitN(l.Message.Ref(), " ", 2)[0] {
			t.Errorf("letter names %s, the log %s", got, l.Message.Ref())
		}
	}
}
