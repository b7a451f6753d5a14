package consumer_test

import (
	"cmp"
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/internal/testenv/pgtest"
)

// TestStatusRankAlipayResend (seam 40.66): the consumer of docs/order.md
// ("A status machine: dedup.StatusRank"), as the page configures it — the
// key and fingerprint of examples/channels: trade_no, trade_status and a
// refund's out_biz_no; consumer.FormFields leaving out notify_time,
// notify_id and sign — on real Postgres. Alipay re-sends a notification it
// got no "success" for with a new notify_time (and so a new sign). The
// payment is applied; its re-send, a minute later, is a duplicate, never a
// fingerprint_mismatch letter.
func TestStatusRankAlipayResend(t *testing.T) {
	pool := testenv.Pool(t)
	store := pgtest.Store(t, pool, testenv.Schema(t, pool))
	trade := dedup.StatusRank("WAIT_BUYER_PAY", "TRADE_SUCCESS", "TRADE_FINISHED", "TRADE_CLOSED")
	cst := time.FixedZone("CST", 8*3600)
	cfg := consumer.Config[pgx.Tx]{
		Name:  "alipay",
		Store: store,
		// A partial refund is TRADE_SUCCESS again, with an out_biz_no of its own.
		Key: consumer.Composite(consumer.ByFormField("trade_no"), consumer.ByFormField("trade_status"),
			consumer.ByFormField("out_biz_no").Optional()),
		// Not notify_time, notify_id or sign: a re-send has new ones.
		Fingerprint: consumer.FormFields("out_trade_no", "trade_no", "trade_status", "total_amount", "refund_fee"),
		Entity: func(m *consumer.Message) (consumer.Entity, error) {
			v, err := url.ParseQuery(string(m.Value))
			if err != nil {
				return consumer.Entity{}, err
			}
			at := cmp.Or(v.Get("gmt_close"), v.Get("gmt_refund"), v.Get("gmt_payment"), v.Get("gmt_create"))
			t, err := time.ParseInLocation(time.DateTime, at, cst)
			if err != nil {
				return consumer.Entity{}, err
			}
			ver, err := trade.At(t.Unix(), v.Get("trade_status"))
			return consumer.Entity{Name: v.Get("trade_no"), Version: ver}, err
		},
		Handler: consumer.HandlerFunc[pgx.Tx](func(context.Context, pgx.Tx, *consumer.Message) error { return nil }),
		Logger:  testenv.Logger(t),
	}
	notice := func(sent string) string {
		return url.Values{
			"notify_time": {sent}, "notify_type": {"trade_status_sync"}, "notify_id": {"ac05099524730693a8b330c5ecf72da9"},
			"sign_type": {"RSA2"}, "sign": {"sig-of-" + sent}, "trade_no": {"T1"}, "out_trade_no": {"O1"},
			"trade_status": {"TRADE_SUCCESS"}, "total_amount": {"88.00"}, "gmt_payment": {"2026-12-07 10:04:05"},
		}.Encode()
	}
	res, err := consumertest.Drive(testenv.Context(t, time.Minute), cfg, consumertest.Script{},
		consumertest.Message("alipay", 0, 0, "", notice("2026-12-07 10:04:06")),
		consumertest.Message("alipay", 0, 1, "", notice("2026-12-07 10:05:06"))) // Alipay's re-send
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range res.DeadLetters {
		t.Errorf("Alipay's re-send dead-lettered: cause %v: %v; want it a duplicate", l.Cause, l.Reason)
	}
	if res.Stats.Applied != 1 || res.Stats.Duplicates != 1 {
		t.Errorf("applied %d, %d duplicates; want the payment applied once and its re-send a duplicate",
			res.Stats.Applied, res.Stats.Duplicates)
	}
}
