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

// TestBreakStatusRankAlipayResend (seam 40.66): the consumer of
// docs/order.md ("A status machine: dedup.StatusRank"), as it stands —
// Key: ByFormField("notify_id"), the default fingerprint (WholePayload) —
// on real Postgres. Alipay re-sends a notification it got no "success"
// for with the same notify_id and a new notify_time (and so a new sign),
// as the page itself says and examples/channels generates. The payment is
// applied; its re-send, a minute later, has another payload under the
// same key: it is dead-lettered as a fingerprint mismatch, where the page
// promises a re-send is a duplicate (or stale), never a letter.
func TestBreakStatusRankAlipayResend(t *testing.T) {
	pool := testenv.Pool(t)
	store := pgtest.Store(t, pool, testenv.Schema(t, pool))
	trade := dedup.StatusRank("WAIT_BUYER_PAY", "TRADE_SUCCESS", "TRADE_FINISHED", "TRADE_CLOSED")
	cst := time.FixedZone("CST", 8*3600)
	cfg := consumer.Config[pgx.Tx]{
		Name:  "alipay",
		Store: store,
		Key:   consumer.ByFormField("notify_id"),
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
	if res.Stats.Applied != 1 {
		t.Errorf("applied %d, want 1", res.Stats.Applied)
	}
}
