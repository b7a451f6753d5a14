package consumer_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/dedup/memstore"
)

// A BatchHandler writes all new messages of a batch at once (with pgstore: one
// multi-row INSERT or COPY). When one message is bad it returns a
// *MessageError naming it: the messages before it commit, it is dead-lettered
// alone (Permanent) or retried alone, and the rest go on.
func ExampleBatchHandlerFunc() {
	var ledger []string // the committed rows
	handler := consumer.BatchHandlerFunc[*memstore.Tx](func(ctx context.Context, tx *memstore.Tx, msgs []*consumer.Message) error {
		rows := make([]string, 0, len(msgs))
		for i, m := range msgs {
			var p struct {
				TxnID  string `json:"txn_id"`
				Amount int64  `json:"amount"`
			}
			if err := json.Unmarshal(m.Value, &p); err != nil {
				return &consumer.MessageError{Index: i, Err: consumer.Permanent(err)}
			}
			if p.Amount <= 0 {
				return &consumer.MessageError{Index: i, Err: consumer.Permanent(fmt.Errorf("amount %d", p.Amount))}
			}
			rows = append(rows, fmt.Sprintf("%s:%d", p.TxnID, p.Amount))
		}
		tx.OnCommit(func() { ledger = append(ledger, rows...) }) // with pgstore: one INSERT … SELECT FROM unnest(…)
		return nil
	})
	res, err := consumertest.Drive(context.Background(), consumer.Config[*memstore.Tx]{
		Name:         "ledger",
		Store:        memstore.New(memstore.Config{}),
		BatchHandler: handler,
		Key:          consumer.ByJSONField("txn_id"),
		Logger:       slog.New(slog.DiscardHandler),
	}, consumertest.Script{},
		consumertest.Message("payments", 0, 0, "", `{"txn_id":"T1","amount":100}`),
		consumertest.Message("payments", 0, 1, "", `{"txn_id":"T2","amount":250}`),
		consumertest.Message("payments", 0, 2, "", `{"txn_id":"T3","amount":-5}`),
		consumertest.Message("payments", 0, 3, "", `{"txn_id":"T4","amount":70}`))
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("ledger:", ledger)
	for _, l := range res.DeadLetters {
		fmt.Printf("dead-lettered %s after %d attempt, permanent: %t\n", l.Key.ID, l.Attempts, consumer.IsPermanent(l.Reason))
	}
	// Output:
	// ledger: [T1:100 T2:250 T4:70]
	// dead-lettered T3 after 1 attempt, permanent: true
}
