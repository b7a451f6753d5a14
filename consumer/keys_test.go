package consumer_test

import (
	"errors"
	"testing"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
)

func TestBuiltInKeys(t *testing.T) {
	m := &consumer.Message{ID: "pay/0/7", Key: []byte("order-1"), Value: []byte(`{"payment":{"txn_id":"W123","seq":42}}`),
		Headers: []consumer.Header{{Key: "Idempotency-Key", Value: []byte("idem-9")}}}
	cases := []struct {
		f    consumer.KeyFunc
		want string
	}{
		{consumer.ByMessageID(), "pay/0/7"},
		{consumer.ByRecordKey(), "order-1"},
		{consumer.ByHeader("Idempotency-Key"), "idem-9"},
		{consumer.ByJSONField("payment.txn_id"), "W123"},
		{consumer.ByJSONField("payment.seq"), "42"},
	}
	for _, c := range cases {
		got, err := c.f(m)
		if err != nil || got != c.want {
			t.Errorf("got %q, %v; want %q", got, err, c.want)
		}
	}
	empty := &consumer.Message{Value: []byte(`{"payment":"flat"}`)}
	for _, f := range []consumer.KeyFunc{consumer.ByMessageID(), consumer.ByRecordKey(), consumer.ByHeader("Idempotency-Key"), consumer.ByJSONField("payment.txn_id")} {
		if _, err := f(empty); !errors.Is(err, consumer.ErrNoKey) {
			t.Errorf("missing key: %v, want ErrNoKey", err)
		}
	}
}

func FuzzByJSONField(f *testing.F) {
	f.Add([]byte(`{"txn_id":"T1"}`), "txn_id")
	f.Add([]byte(`{"a":{"b":[1,2,{"c":3}]}}`), "a.b")
	f.Add([]byte(`{"a":`), "a")
	f.Fuzz(func(t *testing.T, payload []byte, path string) {
		id, err := consumer.ByJSONField(path)(&consumer.Message{Value: payload})
		if err != nil {
			if !errors.Is(err, consumer.ErrNoKey) && !errors.Is(err, consumer.ErrBadPayload) {
				t.Fatalf("error is neither ErrNoKey nor ErrBadPayload: %v", err)
			}
			return
		}
		if id == "" {
			t.Fatal("empty key without error")
		}
	})
}

// TestJSONNumberKeysAreValues: one payment spelled three ways has one
// fingerprint; it must have one key too, or it is applied three times.
func TestJSONNumberKeysAreValues(t *testing.T) {
	key := consumer.ByJSONField("txn_id")
	for in, want := range map[string]string{
		`{"txn_id":1000}`: "1000", `{"txn_id":1e3}`: "1000", `{"txn_id":1000.0}`: "1000",
		`{"txn_id":"1000"}`: "1000", `{"txn_id":1.50}`: "1.5", `{"txn_id":-0}`: "0",
	} {
		if got, err := key(&consumer.Message{Value: []byte(in)}); err != nil || got != want {
			t.Errorf("%s: key %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := key(&consumer.Message{Value: []byte(`{"txn_id":1e400}`)}); !errors.Is(err, consumer.ErrBadPayload) {
		t.Errorf("1e400: %v, want ErrBadPayload", err)
	}

	eff := newEffects()
	cfg := baseConfig(eff.apply)
	res := consumertest.Run(t, cfg, consumertest.Script{},
		consumertest.Message("pay", 0, 0, "", `{"txn_id":1000,"amount":5}`),
		consumertest.Message("pay", 1, 0, "", `{"txn_id":1e3,"amount":5}`),
		consumertest.Message("pay", 2, 0, "", `{"amount":5.0,"txn_id":1000.0}`))
	eff.check(t, []string{"1000"})
	if res.Stats.Applied != 1 || res.Stats.Duplicates != 2 || len(res.DeadLetters) != 0 {
		t.Errorf("applied %d, duplicates %d, dead letters %v; want 1, 2, none", res.Stats.Applied, res.Stats.Duplicates, res.DeadLetters)
	}
}
