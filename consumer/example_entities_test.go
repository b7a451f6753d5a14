package consumer_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/memstore"
)

// A payment channel notifies a trade's status changes, each notification
// with an ID of its own, and sends TRADE_SUCCESS again after the
// TRADE_CLOSED that followed it. Dedup alone applies it (a new ID) and the
// closed trade is paid again; Config.Entity orders a trade's notifications
// by their sequence, and the late one is stale: the handler never sees it.
func ExampleConfig_entity() {
	type notify struct {
		NotifyID string `json:"notify_id"`
		TradeNo  string `json:"out_trade_no"`
		Status   string `json:"trade_status"`
		Seq      int64  `json:"seq"`
	}
	status := map[string]string{}
	res, err := consumertest.Drive(context.Background(), consumer.Config[*memstore.Tx]{
		Name:  "alipay",
		Store: memstore.New(memstore.Config{}), // pgstore too: a Store that keeps watermarks
		Key:   consumer.ByJSONField("notify_id"),
		Entity: func(m *consumer.Message) (consumer.Entity, error) {
			var n notify
			err := json.Unmarshal(m.Value, &n)
			return consumer.Entity{Name: n.TradeNo, Version: dedup.Version{Major: n.Seq}}, err
		},
		Handler: consumer.HandlerFunc[*memstore.Tx](func(ctx context.Context, tx *memstore.Tx, m *consumer.Message) error {
			var n notify
			if err := json.Unmarshal(m.Value, &n); err != nil {
				return consumer.Permanent(err)
			}
			tx.OnCommit(func() { status[n.TradeNo] = n.Status })
			return nil
		}),
		Logger: slog.New(slog.DiscardHandler),
	}, consumertest.Script{},
		consumertest.Message("trades", 0, 0, "", `{"notify_id":"n1","out_trade_no":"T1","trade_status":"WAIT_BUYER_PAY","seq":1}`),
		consumertest.Message("trades", 0, 1, "", `{"notify_id":"n3","out_trade_no":"T1","trade_status":"TRADE_CLOSED","seq":3}`),
		consumertest.Message("trades", 0, 2, "", `{"notify_id":"n2","out_trade_no":"T1","trade_status":"TRADE_SUCCESS","seq":2}`))
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("T1:", status["T1"])
	fmt.Println("applied:", res.Stats.Applied, "stale:", res.Stats.Stale)
	// Output:
	// T1: TRADE_CLOSED
	// applied: 2 stale: 1
}
