package consumer_test

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"time"

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

// Alipay's notifications carry the time of their event (gmt_payment,
// gmt_refund, gmt_close; never notify_time, new on every re-send) and the
// trade's status. The version is the time, its ties broken by the status's
// rank (dedup.StatusRank): T1 finishes in the second it is paid, and its
// TRADE_SUCCESS, delivered last, is stale; T2's payment, re-sent after the
// refund that closed it, is stale; a status the machine does not know is
// dead-lettered as bad input, its reason naming it and the known ones.
func ExampleConfig_statusRank() {
	trade := dedup.StatusRank("WAIT_BUYER_PAY", "TRADE_SUCCESS", "TRADE_FINISHED", "TRADE_CLOSED")
	eventTime := func(v url.Values) (int64, error) {
		at := cmp.Or(v.Get("gmt_close"), v.Get("gmt_refund"), v.Get("gmt_payment"), v.Get("gmt_create"))
		t, err := time.ParseInLocation(time.DateTime, at, time.FixedZone("CST", 8*3600))
		return t.Unix(), err
	}
	status := map[string]string{}
	res, err := consumertest.Drive(context.Background(), consumer.Config[*memstore.Tx]{
		Name:  "alipay",
		Store: memstore.New(memstore.Config{}),
		Key:   consumer.ByFormField("notify_id"),
		Entity: func(m *consumer.Message) (consumer.Entity, error) {
			v, err := url.ParseQuery(string(m.Value))
			if err != nil {
				return consumer.Entity{}, err
			}
			at, err := eventTime(v)
			if err != nil {
				return consumer.Entity{}, err
			}
			ver, err := trade.At(at, v.Get("trade_status"))
			return consumer.Entity{Name: v.Get("trade_no"), Version: ver}, err
		},
		Handler: consumer.HandlerFunc[*memstore.Tx](func(ctx context.Context, tx *memstore.Tx, m *consumer.Message) error {
			v, _ := url.ParseQuery(string(m.Value))
			tx.OnCommit(func() { status[v.Get("trade_no")] = v.Get("trade_status") })
			return nil
		}),
		Logger: slog.New(slog.DiscardHandler),
	}, consumertest.Script{},
		consumertest.Message("alipay", 0, 0, "", "notify_id=n1&trade_no=T1&trade_status=TRADE_FINISHED&gmt_payment=2026-11-30+10:04:05&gmt_close=2026-11-30+10:04:05"),
		consumertest.Message("alipay", 0, 1, "", "notify_id=n2&trade_no=T1&trade_status=TRADE_SUCCESS&gmt_payment=2026-11-30+10:04:05"),
		consumertest.Message("alipay", 0, 2, "", "notify_id=n3&trade_no=T2&trade_status=TRADE_SUCCESS&gmt_payment=2026-11-30+10:00:00"),
		consumertest.Message("alipay", 0, 3, "", "notify_id=n4&trade_no=T2&trade_status=TRADE_CLOSED&gmt_payment=2026-11-30+10:00:00&gmt_refund=2026-11-30+11:00:00&gmt_close=2026-11-30+11:00:00"),
		consumertest.Message("alipay", 0, 4, "", "notify_id=n5&trade_no=T2&trade_status=TRADE_SUCCESS&gmt_payment=2026-11-30+10:00:00"),
		consumertest.Message("alipay", 0, 5, "", "notify_id=n6&trade_no=T3&trade_status=TRADE_PENDING&gmt_create=2026-11-30+10:00:00"))
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("T1:", status["T1"], "T2:", status["T2"])
	fmt.Println("applied:", res.Stats.Applied, "stale:", res.Stats.Stale)
	for _, l := range res.DeadLetters {
		fmt.Println(l.Cause, errors.Is(l.Reason, dedup.ErrUnknownStatus), l.Reason)
	}
	// Output:
	// T1: TRADE_FINISHED T2: TRADE_CLOSED
	// applied: 3 stale: 2
	// bad_input true entity of message alipay/0/5: dedup: unknown status "TRADE_PENDING": the known statuses are "WAIT_BUYER_PAY" < "TRADE_SUCCESS" < "TRADE_FINISHED" < "TRADE_CLOSED"
}
