package consumer_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"sync"
	"time"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/dedup/memstore"
)

// notify is an Alipay-style asynchronous notification, form-encoded; the
// channel re-sends it with a new notify_time, notify_id and sign each time.
func notify(status string, resend int) string {
	return url.Values{
		"notify_time":  {fmt.Sprintf("2026-11-30 10:%02d:00", 4*resend)},
		"notify_id":    {fmt.Sprintf("n%d", resend)},
		"trade_no":     {"2026113022001"},
		"out_trade_no": {"order-7"},
		"trade_status": {status},
		"total_amount": {"88.00"},
		"sign":         {fmt.Sprintf("sig%d", resend)},
	}.Encode()
}

// A payment channel's re-sends are duplicates when the fingerprint covers
// the fields that define the request, not the ones stamped per delivery;
// the trade's statuses are events of their own under a composite key.
func ExampleFormFields() {
	drive := func(fp consumer.FingerprintFunc) {
		res, err := consumertest.Drive(context.Background(), consumer.Config[*memstore.Tx]{
			Name:        "alipay",
			Store:       memstore.New(memstore.Config{}),
			Handler:     consumer.HandlerFunc[*memstore.Tx](func(context.Context, *memstore.Tx, *consumer.Message) error { return nil }),
			Key:         consumer.Composite(consumer.ByFormField("trade_no"), consumer.ByFormField("trade_status")),
			Fingerprint: fp,
			Logger:      slog.New(slog.DiscardHandler),
		}, consumertest.Script{},
			consumertest.Message("alipay", 0, 0, "", notify("TRADE_SUCCESS", 0)),
			consumertest.Message("alipay", 0, 1, "", notify("TRADE_SUCCESS", 1)), // re-sent 4 minutes later
			consumertest.Message("alipay", 0, 2, "", notify("TRADE_FINISHED", 0)))
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println("applied:", res.Stats.Applied, "duplicates:", res.Stats.Duplicates, "dead-lettered:", len(res.DeadLetters))
	}
	fmt.Print("chosen fields: ")
	drive(consumer.FormFields("out_trade_no", "trade_status", "total_amount"))
	fmt.Print("whole payload: ")
	drive(consumer.WholePayload())
	// Output:
	// chosen fields: applied: 2 duplicates: 1 dead-lettered: 0
	// whole payload: applied: 2 duplicates: 0 dead-lettered: 1
}

// Composite joins key parts with ':', escaping a ':' inside a part.
func ExampleComposite() {
	key := consumer.Composite(consumer.ByJSONField("type"), consumer.ByJSONField("id"))
	id, err := key(&consumer.Message{Value: []byte(`{"id":"evt:1","type":"charge.refunded"}`)})
	fmt.Println(id, err)
	// Output:
	// charge.refunded:evt\:1 <nil>
}

// OnDuplicate sees every skipped message with when its key was first
// claimed; Stats.DuplicateAge keeps the ages, to choose retention from.
func ExampleConfig_onDuplicate() {
	firstClaims := time.Now().Add(-26 * time.Hour) // the store's clock, a day ago
	var mu sync.Mutex
	var oldest time.Duration
	res, err := consumertest.Drive(context.Background(), consumer.Config[*memstore.Tx]{
		Name:    "payments",
		Store:   memstore.New(memstore.Config{Now: func() time.Time { return firstClaims }}),
		Handler: consumer.HandlerFunc[*memstore.Tx](func(context.Context, *memstore.Tx, *consumer.Message) error { return nil }),
		Key:     consumer.ByJSONField("txn_id"),
		OnDuplicate: func(_ context.Context, d consumer.Duplicate) {
			mu.Lock()
			defer mu.Unlock()
			oldest = max(oldest, d.Age)
		},
		Logger: slog.New(slog.DiscardHandler),
	}, consumertest.Script{MinDeliveries: 2, MaxDeliveries: 2},
		consumertest.Message("pay", 0, 0, "", `{"txn_id":"T1","amount":100}`))
	if err != nil {
		fmt.Println(err)
		return
	}
	mu.Lock()
	defer mu.Unlock()
	fmt.Println("duplicates:", res.Stats.Duplicates, "older than a day:", oldest > 24*time.Hour)
	fmt.Println("retention must exceed:", res.Stats.DuplicateAge.Quantile(0.999))
	// Output:
	// duplicates: 1 older than a day: true
	// retention must exceed: 168h0m0s
}
