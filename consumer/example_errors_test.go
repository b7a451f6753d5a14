package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/dedup/memstore"
)

var errUnknownAccount = errors.New("unknown account")

// A handler marks an error that no retry can fix with Permanent: the message
// is dead-lettered after one attempt, the reason kept for errors.Is, and the
// key recorded as failed, so a redelivery is dead-lettered again without
// running the handler. Any other error is retried with backoff.
func ExamplePermanent() {
	calls := map[string]int{} // handler calls per account
	handler := consumer.HandlerFunc[*memstore.Tx](func(ctx context.Context, tx *memstore.Tx, m *consumer.Message) error {
		acct, err := consumer.ByJSONField("account")(m)
		if err != nil {
			return consumer.Permanent(err)
		}
		calls[acct]++
		if acct != "alice" {
			return consumer.Permanent(fmt.Errorf("%w %q", errUnknownAccount, acct))
		}
		return nil
	})
	res, err := consumertest.Drive(context.Background(), consumer.Config[*memstore.Tx]{
		Name:    "payments",
		Store:   memstore.New(memstore.Config{}),
		Handler: handler,
		Key:     consumer.ByJSONField("txn_id"),
		Logger:  slog.New(slog.DiscardHandler),
	}, consumertest.Script{MinDeliveries: 2, MaxDeliveries: 2}, // the broker redelivers each message
		consumertest.Message("payments", 0, 0, "", `{"txn_id":"T1","account":"alice"}`),
		consumertest.Message("payments", 0, 1, "", `{"txn_id":"T2","account":"mallory"}`))
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("applied:", res.Stats.Applied, "dead-lettered:", res.Stats.DeadLettered, "handler calls for mallory:", calls["mallory"])
	for _, l := range res.DeadLetters {
		fmt.Printf("%s: attempts %d, unknown account: %t\n", l.Key.ID, l.Attempts, errors.Is(l.Reason, errUnknownAccount))
	}
	// The second letter is T2's redelivery: its key was recorded as failed,
	// so it was dead-lettered without running the handler (0 attempts).

	// Output:
	// applied: 1 dead-lettered: 2 handler calls for mallory: 1
	// T2: attempts 1, unknown account: true
	// T2: attempts 0, unknown account: false
}
