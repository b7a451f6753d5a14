package relaytest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/outbox"
)

// BenchValue is a 256-byte order.paid event, the publishers' benchmarks'
// message.
var BenchValue = []byte(fmt.Sprintf(`{"type":"order.paid","order_id":"O-000000","txn_id":"4200000000000000","sku":"sku-000","amount":12999,"pad":"%0159d"}`, 0))

// Fill enqueues n messages of BenchValue to topic (keys of 1,000 orders) in
// transactions of 500, outside the timer.
func Fill(b *testing.B, pool interface {
	Begin(context.Context) (pgx.Tx, error)
}, ob *outbox.Outbox, topic string, n int) {
	b.Helper()
	ctx := context.Background()
	for i := 0; i < n; i += 500 {
		var msgs []outbox.Message
		for j := i; j < min(i+500, n); j++ {
			msgs = append(msgs, outbox.Message{Topic: topic, Key: []byte(fmt.Sprintf("O-%06d", j%1000)), Value: BenchValue})
		}
		tx, err := pool.Begin(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if err := ob.EnqueueFor(ctx, tx, dedup.Key{Scope: "payments", ID: fmt.Sprint(i)}, msgs...); err != nil {
			b.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// RunRelays times relays, one per publisher, draining the outbox together
// (batches of 500), and reports msgs/s, msgs/round and the failed rounds.
func RunRelays(b *testing.B, ob *outbox.Outbox, pubs []outbox.Publisher) {
	b.Helper()
	var relays []*outbox.Relay
	for _, pub := range pubs {
		relay, err := outbox.NewRelay(outbox.RelayConfig{Outbox: ob, Publisher: pub, BatchSize: 500, PollInterval: time.Millisecond, Logger: testenv.Logger(b)})
		if err != nil {
			b.Fatal(err)
		}
		relays = append(relays, relay)
	}
	// A failed publish (a leader not elected yet on a new topic) is retried
	// by the relay, and counted.
	published := func() (n, rounds, failed int64) {
		for _, r := range relays {
			st := r.Stats()
			n, rounds, failed = n+st.Published, rounds+st.Rounds, failed+st.Failed
		}
		return n, rounds, failed
	}
	done := make(chan error, len(relays))
	stop := func() {
		for _, r := range relays {
			if err := r.Stop(context.Background()); err != nil {
				b.Error(err)
			}
			if err := <-done; err != nil {
				b.Error(err)
			}
		}
	}
	b.ResetTimer()
	for _, r := range relays {
		go func() { done <- r.Run(context.Background()) }()
	}
	for n, _, _ := published(); n < int64(b.N); n, _, _ = published() {
		if b.Elapsed() > 5*time.Minute {
			stop()
			b.Fatalf("%d of %d published after 5 minutes", n, b.N)
		}
		time.Sleep(time.Millisecond)
	}
	b.StopTimer()
	stop()
	n, rounds, failed := published()
	if n != int64(b.N) {
		b.Fatalf("published %d of %d", n, b.N)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
	b.ReportMetric(float64(n)/float64(rounds), "msgs/round")
	b.ReportMetric(float64(failed), "failed")
}
