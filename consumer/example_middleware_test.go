package consumer_test

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/dedup/memstore"
)

// Timeout bounds each handler call. A call that overruns sees its context
// end; the error is retryable, so the message is tried again (against its
// retry budget) and its effects commit once the call finishes in time.
func ExampleTimeout() {
	calls := 0
	handler := consumer.HandlerFunc[*memstore.Tx](func(ctx context.Context, tx *memstore.Tx, m *consumer.Message) error {
		calls++
		if calls == 1 { // a downstream call that hangs the first time
			<-ctx.Done()
			fmt.Println("call 1:", ctx.Err())
			return ctx.Err()
		}
		fmt.Println("call", calls, "in time")
		return nil
	})
	res, err := consumertest.Drive(context.Background(), consumer.Config[*memstore.Tx]{
		Name:       "payments",
		Store:      memstore.New(memstore.Config{}),
		Handler:    handler,
		Middleware: []consumer.Middleware[*memstore.Tx]{consumer.Timeout[*memstore.Tx](50 * time.Millisecond)},
		Key:        consumer.ByJSONField("txn_id"),
		Logger:     slog.New(slog.DiscardHandler),
	}, consumertest.Script{},
		consumertest.Message("payments", 0, 0, "", `{"txn_id":"T1"}`))
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("applied:", res.Stats.Applied, "dead-lettered:", res.Stats.DeadLettered)
	// Output:
	// call 1: context deadline exceeded
	// call 2 in time
	// applied: 1 dead-lettered: 0
}
