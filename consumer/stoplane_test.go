package consumer_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/dedup/memstore"
)

func TestStopLaneOnExhausted(t *testing.T) {
	eff := newEffects()
	cfg := baseConfig(eff.failOn("T00001", errors.New("always down")))
	cfg.OnExhausted = consumer.StopLaneOnExhausted
	cfg.BatchSize = 1
	cfg.Clock = consumertest.NewClock()
	src := consumertest.NewSource(consumertest.Script{})
	cfg.Source = src
	cfg.DeadLetter = &consumertest.DeadLetters{}
	c, err := consumer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	src.Push(
		consumertest.Message("pay", 0, 0, "", payment(0)),
		consumertest.Message("pay", 0, 1, "", payment(1)),
		consumertest.Message("pay", 0, 2, "", payment(2)),
		consumertest.Message("pay", 1, 0, "", payment(3)),
		consumertest.Message("pay", 1, 1, "", payment(4)),
	)
	runUntil(t, c, func() bool { return eff.count("T00004") > 0 })
	// Lane pay/0 stopped at T00001: T00002 was never applied nor acked.
	if eff.count("T00000") != 1 || eff.count("T00001") != 0 || eff.count("T00002") != 0 {
		t.Errorf("lane 0 effects: %v", eff.n)
	}
	if eff.count("T00003") != 1 || eff.count("T00004") != 1 {
		t.Errorf("lane 1 effects: %v", eff.n)
	}
	if src.Acked("pay/0/1") != 0 || src.Acked("pay/0/2") != 0 {
		t.Error("a message of the stopped lane was acked")
	}
	if src.Acked("pay/0/0") != 1 {
		t.Error("the message before the failure was not acked")
	}
}

// TestStoppedLaneDoesNotPassBadInput: bad input behind the message that
// stopped its lane, in the same batch, is neither dead-lettered nor acked;
// bad input before it is.
func TestStoppedLaneDoesNotPassBadInput(t *testing.T) {
	eff := newEffects()
	src := consumertest.NewSource(consumertest.Script{})
	cfg := baseConfig(func(ctx context.Context, tx *memstore.Tx, m *consumer.Message) error {
		id, _ := consumer.ByJSONField("txn_id")(m)
		switch id {
		case "T00000":
			// Hold the lane until the rest is delivered: the next batch
			// holds the bad input on both sides of T00001.
			for end := time.Now().Add(5 * time.Second); src.Stats().Deliveries < 5 && time.Now().Before(end); {
				time.Sleep(time.Millisecond)
			}
		case "T00001":
			return errors.New("always down")
		}
		eff.add(tx, id)
		return nil
	})
	cfg.OnExhausted = consumer.StopLaneOnExhausted
	cfg.BatchSize = 10
	cfg.Clock = consumertest.NewClock()
	dl := &consumertest.DeadLetters{}
	cfg.DeadLetter = dl
	cfg.Source = src
	c, err := consumer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	src.Push(
		consumertest.Message("pay", 0, 0, "", payment(0)),
		consumertest.Message("pay", 0, 1, "", `{"bad": `),
		consumertest.Message("pay", 0, 2, "", payment(1)),
		consumertest.Message("pay", 0, 3, "", `{"amount": 5}`),
		consumertest.Message("pay", 0, 4, "", payment(2)),
	)
	runUntil(t, c, func() bool { return c.Stats().Released > 0 })
	if st := c.Stats(); st.Delivered < 5 || st.Released == 0 {
		t.Fatalf("the batch was not delivered whole, or the lane did not stop: %+v", st)
	}
	if eff.count("T00000") != 1 || eff.count("T00001") != 0 || eff.count("T00002") != 0 {
		t.Errorf("effects: %v", eff.n)
	}
	letters := dl.Letters()
	if len(letters) != 1 || letters[0].Message.Offset != 1 {
		t.Fatalf("dead letters %+v; want only the bad input before the stop (offset 1)", letters)
	}
	for _, id := range []string{"pay/0/2", "pay/0/3", "pay/0/4"} {
		if src.Acked(id) != 0 {
			t.Errorf("%s, at or behind the stop, was acked", id)
		}
	}
}
