package consumer_test

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/dedup/memstore"
)

// TestParkedHeadThroughAnOutage (seam 40.67): Delays 1s and 10s, the
// default MaxParkedWait (twice their sum plus RetryMargin: 15m22s; it was
// twice their sum and a minute, 1m22s). a1 fails once into retry and
// parks its key; the consumer is down for 2 minutes (a deploy, a broker
// outage) — well within RetryMargin's 15 minutes, which consumer.New
// sizes the store's retention by "for a copy that waits behind others or
// through a deploy". When a1's copy comes back on its first trip it must
// be tried, and applies: the outage must not use up the wait.
func TestParkedHeadThroughAnOutage(t *testing.T) {
	store := memstore.New(memstore.Config{})
	clk := consumertest.NewClock()
	var got order
	var failed atomic.Bool
	h := func(ctx context.Context, tx *memstore.Tx, m *consumer.Message) error {
		if failed.CompareAndSwap(false, true) {
			return consumer.Retryable(errors.New("the account service is down"))
		}
		return got.apply(ctx, tx, m)
	}
	config := func(src *retrySource, sink consumer.RetrySink, dl consumer.DeadLetter) consumer.Config[*memstore.Tx] {
		cfg := keyOrderedConfig(store, h, src, sink, dl)
		cfg.Clock = clk
		nb := cfg.Retries.(consumer.NonBlocking)
		nb.Delays = []time.Duration{time.Second, 10 * time.Second}
		cfg.Retries = nb
		return cfg
	}
	src1 := &retrySource{Source: consumertest.NewSource(consumertest.Script{}), lineage: true}
	held := &heldSink{}
	c1, err := consumer.New(config(src1, held, &consumertest.DeadLetters{}))
	if err != nil {
		t.Fatal(err)
	}
	src1.Push(consumertest.Message("pay", 0, 1, "acct-a", payment(1)))
	drive(t, c1, src1.Source)
	if n := len(held.taken()); n != 1 {
		t.Fatalf("%d copies in retry, want a1's", n)
	}

	_ = clk.Sleep(context.Background(), 2*time.Minute) // the outage
	src2 := &retrySource{Source: consumertest.NewSource(consumertest.Script{}), lineage: true}
	dl := &consumertest.DeadLetters{}
	c2, err := consumer.New(config(src2, &keyedRetrySink{retrySink{src: src2}}, dl))
	if err != nil {
		t.Fatal(err)
	}
	src2.Push(held.taken()...)
	drive(t, c2, src2.Source)
	for _, l := range dl.Letters() {
		t.Errorf("a1 dead-lettered after a 2-minute outage: cause %v: %v; want it tried on its trip", l.Cause, l.Reason)
	}
	if want := []string{"T00001"}; !slices.Equal(got.of("acct-a"), want) {
		t.Errorf("acct-a applied %v, want %v", got.of("acct-a"), want)
	}
}

// TestKeyOrderedBatchHandler (seam 40.68): KeyOrdered with a
// BatchHandler, which row 40.26 left untested. Batches of 4:
// a1 a2 b1 a3 (record keys acct-a, acct-b). The batch fails while it
// holds a1 (the account service refuses a1 until its copy comes back
// from retry), once naming it (MessageError) and once not (the settler
// halves down to it). a1 goes to retry; a2 and a3, in the same batch,
// must follow it there, and b1 is applied at once.
func TestKeyOrderedBatchHandler(t *testing.T) {
	for _, named := range []bool{true, false} {
		t.Run(map[bool]string{true: "named", false: "unnamed"}[named], func(t *testing.T) {
			store := memstore.New(memstore.Config{})
			var got order
			bh := consumer.BatchHandlerFunc[*memstore.Tx](func(ctx context.Context, tx *memstore.Tx, msgs []*consumer.Message) error {
				for i, m := range msgs {
					if id, _ := consumer.ByJSONField("txn_id")(m); id == "T00001" && m.Topic == "pay" {
						err := consumer.Retryable(errors.New("the account service refuses a1"))
						if named {
							return &consumer.MessageError{Index: i, Err: err}
						}
						return err
					}
				}
				for _, m := range msgs {
					if err := got.apply(ctx, tx, m); err != nil {
						return err
					}
				}
				return nil
			})
			src := &retrySource{Source: consumertest.NewSource(consumertest.Script{}), lineage: true}
			dl := &consumertest.DeadLetters{}
			cfg := keyOrderedConfig(store, nil, src, &keyedRetrySink{retrySink{src: src}}, dl)
			cfg.Handler, cfg.BatchHandler = nil, bh
			cfg.BatchSize = 4
			c, err := consumer.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			src.Push(
				consumertest.Message("pay", 0, 1, "acct-a", payment(1)),
				consumertest.Message("pay", 0, 2, "acct-a", payment(2)),
				consumertest.Message("pay", 0, 3, "acct-b", payment(3)),
				consumertest.Message("pay", 0, 4, "acct-a", payment(4)))
			drive(t, c, src.Source)
			if want := []string{"T00001", "T00002", "T00004"}; !slices.Equal(got.of("acct-a"), want) {
				t.Errorf("acct-a applied %v, want %v", got.of("acct-a"), want)
			}
			if want := []string{"T00003"}; !slices.Equal(got.of("acct-b"), want) {
				t.Errorf("acct-b applied %v, want %v", got.of("acct-b"), want)
			}
			if n := len(dl.Letters()); n != 0 {
				t.Errorf("%d dead letters, want none", n)
			}
		})
	}
}
