package channels_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/text/encoding"
	"golang.org/x/text/encoding/simplifiedchinese"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/wire"
	"github.com/idemkit/idem/examples/channels"
	"github.com/idemkit/idem/examples/payments"
)

// certFetch stands for a verifier's fetch of the channel's rotating
// platform certificate (Alipay's certificate mode, WeChat Pay's platform
// certificates): it fails until more than minFails fetches failed and
// minOutage passed since the first.
type certFetch struct {
	minFails  int
	minOutage time.Duration

	mu    sync.Mutex
	fails int
	since time.Time
}

var errCertAway = errors.New("fetch platform certificate: connection refused")

func (c *certFetch) fetch() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.since.IsZero() {
		c.since = time.Now()
	}
	if c.fails > c.minFails && time.Since(c.since) > c.minOutage {
		return nil
	}
	c.fails++
	return errCertAway
}

// TestCertificateOutageDelaysNoNotice: while the verifier cannot fetch the
// channel's certificate, Validate says so with consumer.Retryable, and the
// lanes wait — through more than a hundred failed fetches and far beyond
// the retry budget (MaxElapsed 100ms, 3 attempts) — then every notice is
// judged as usual: each genuine event applied once, nothing dead-lettered
// but the forgeries, the tables reconciled.
func TestCertificateOutageDelaysNoNotice(t *testing.T) {
	for _, ch := range channelsUnderTest() {
		t.Run(ch.Name(), func(t *testing.T) {
			t.Parallel()
			f := load(t, ch.Name())
			cert := &certFetch{minFails: 100, minOutage: time.Second}
			r := consume(t, ch, f, func(c *consumer.Config[pgx.Tx]) {
				verify := c.Validate
				c.Validate = func(ctx context.Context, m *consumer.Message) error {
					if err := cert.fetch(); err != nil {
						return consumer.Retryable(err)
					}
					return verify(ctx, m)
				}
				c.Retry = consumer.RetryPolicy{Initial: time.Millisecond, Max: 10 * time.Millisecond, MaxAttempts: 3, MaxElapsed: 100 * time.Millisecond}
			})
			t.Logf("%d failed certificate fetches; %v", cert.fails, r.report)
			if cert.fails <= cert.minFails {
				t.Errorf("%d failed fetches, want more than %d", cert.fails, cert.minFails)
			}
			if !r.report.OK() {
				t.Error(r.report)
			}
			r.check(t, f, false)
			for line, l := range r.seen.letters {
				if errors.Is(l.Reason, errCertAway) {
					t.Errorf("line %d dead-lettered over the outage: %v", line, l.Reason)
				}
			}
		})
	}
}

// ahead returns the deliveries refused ahead of a genuine event of the
// same key (a forgery, a notice with a wrong amount), and the first
// genuine delivery of each such key.
func ahead(t *testing.T, f channels.Fixture) (refused []channels.Delivery, genuine map[string]channels.Delivery) {
	t.Helper()
	genuine = map[string]channels.Delivery{}
	for _, d := range f.Stream {
		switch {
		case strings.Contains(d.Forged+d.Wrong, "ahead"):
			refused = append(refused, d)
		case d.Forged == "" && d.Wrong == "" && genuine[d.Event].Line == 0:
			genuine[d.Event] = d
		}
	}
	if len(refused) < 2 {
		t.Fatalf("%d refusals ahead of a genuine event in the stream, want a forgery and a wrong amount", len(refused))
	}
	return refused, genuine
}

// causes reads the idem-cause header of each line on the dead-letter topic.
func (r *result) causes() map[int]string {
	out := map[int]string{}
	for _, m := range r.dlq {
		line, cause := letterHeader(m, wire.MetaCause)
		out[line] = cause
	}
	return out
}

// rejectIsPermanent is the handler of before consumer.Reject: every
// refusal recorded as failed under its key.
func rejectIsPermanent(next consumer.Handler[pgx.Tx]) consumer.Handler[pgx.Tx] {
	return consumer.HandlerFunc[pgx.Tx](func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		err := next.Handle(ctx, tx, m)
		if consumer.IsRejected(err) {
			return consumer.Permanent(err)
		}
		return err
	})
}

// TestRefusalsAheadLeaveTheKeyToTheGenuineEvent: a forged notice (refused
// by Validate) and a validly signed notice with a wrong amount (refused by
// the handler, which needs the order to know, with consumer.Reject) reach
// the consumer ahead of the genuine notice of their trade and status. Each
// is dead-lettered — cause validate, cause rejected — and leaves the key
// free: the genuine notice is applied, its re-sends skipped, the tables
// reconcile. Then the same stream with every refusal Permanent, as before
// Reject: the wrong amount takes the key, and the genuine payment behind it
// is dead-lettered as a mismatch — the order stays unpaid.
func TestRefusalsAheadLeaveTheKeyToTheGenuineEvent(t *testing.T) {
	for _, ch := range channelsUnderTest() {
		t.Run(ch.Name(), func(t *testing.T) {
			t.Parallel()
			f := load(t, ch.Name())
			refused, genuine := ahead(t, f)

			r := consume(t, ch, f, nil)
			if !r.report.OK() {
				t.Error(r.report)
			}
			r.check(t, f, false)
			causes := r.causes()
			for _, d := range refused {
				want := consumer.CauseRejected
				if d.Forged != "" {
					want = consumer.CauseValidate
				}
				if l := r.seen.letters[d.Line]; l.Cause != want || causes[d.Line] != want.String() || l.Key.ID != d.Event {
					t.Errorf("line %d (%s%s): cause %v, header %q, key %q; want %v under %q", d.Line, d.Forged, d.Wrong, l.Cause, causes[d.Line], l.Key.ID, want, d.Event)
				}
				g := genuine[d.Event]
				if g.Line <= d.Line || r.outcome[g.Line] != channels.Applied {
					t.Errorf("the genuine notice of %s (line %d, after line %d): %s, want applied", d.Event, g.Line, d.Line, r.outcome[g.Line])
				}
			}

			t.Run("Permanent", func(t *testing.T) {
				r := consume(t, ch, f, func(c *consumer.Config[pgx.Tx]) {
					c.Middleware = append(c.Middleware, rejectIsPermanent)
				})
				lost := 0
				for _, d := range refused {
					if d.Wrong == "" {
						continue
					}
					if l := r.seen.letters[d.Line]; l.Cause != consumer.CausePermanent {
						t.Errorf("line %d: cause %v, want permanent", d.Line, l.Cause)
					}
					g := genuine[d.Event]
					if l := r.seen.letters[g.Line]; l.Cause != consumer.CauseMismatch {
						t.Errorf("the genuine notice of %s (line %d): %s, letter %v; want dead-lettered as a mismatch", d.Event, g.Line, r.outcome[g.Line], l.Cause)
					}
					lost++
				}
				if lost == 0 || r.report.OK() {
					t.Errorf("%d genuine payments lost; %v", lost, r.report)
				}
				t.Logf("with Permanent: %v", r.report)
			})
		})
	}
}

// partialRefundRows counts the ledger rows of partial refunds.
func partialRefundRows(t *testing.T, r *result) int {
	t.Helper()
	var n int
	if err := r.pool.QueryRow(timeout(t, time.Minute), `SELECT count(*) FROM ledger WHERE txn_id LIKE '%/refund/%'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// partialRefunds returns the stream's partial refund events (Alipay
// TRADE_SUCCESS notices with an out_biz_no) and how many deliveries each has.
func partialRefunds(t *testing.T, f channels.Fixture) map[string][]channels.Delivery {
	t.Helper()
	out := map[string][]channels.Delivery{}
	for _, d := range f.Stream {
		v, err := url.ParseQuery(d.Value)
		if err != nil {
			t.Fatal(err)
		}
		if v.Get("trade_status") == "TRADE_SUCCESS" && v.Get("out_biz_no") != "" {
			out[v.Get("out_biz_no")] = append(out[v.Get("out_biz_no")], d)
		}
	}
	return out
}

// TestPartialRefundsAppliedOnce: Alipay reports each partial refund as
// another TRADE_SUCCESS notice of the trade, told apart by out_biz_no. Keyed
// with it as an optional part (consumer.KeyFunc.Optional), every partial
// refund is applied once — one ledger row each, the order's refunded total
// and balance right — its re-sends skipped, and the payment's key is
// unchanged. Then keyed by trade and status alone, with the README's
// fingerprint: every partial refund is skipped as a duplicate of the
// payment, silently, and no money goes back.
func TestPartialRefundsAppliedOnce(t *testing.T) {
	ch := channels.Alipay{Secret: channels.TestKeys().Alipay}
	f := load(t, ch.Name())
	refunds := partialRefunds(t, f)
	resent := 0
	for _, ds := range refunds {
		resent += len(ds) - 1
	}
	if len(refunds) < 4 || resent == 0 {
		t.Fatalf("%d partial refunds, %d re-sends in the stream; want two trades refunded twice, re-sent", len(refunds), resent)
	}

	t.Run("Optional", func(t *testing.T) {
		t.Parallel()
		r := consume(t, ch, f, nil)
		if !r.report.OK() {
			t.Error(r.report)
		}
		r.check(t, f, false)
		if n := partialRefundRows(t, r); n != len(refunds) {
			t.Errorf("%d partial refund rows in the ledger, want %d", n, len(refunds))
		}
		for biz, ds := range refunds {
			if !strings.HasSuffix(ds[0].Event, ":TRADE_SUCCESS:"+biz) || r.outcome[ds[0].Line] != channels.Applied {
				t.Errorf("refund %s: key %q, first delivery %s; want applied under its own key", biz, ds[0].Event, r.outcome[ds[0].Line])
			}
			for _, d := range ds[1:] {
				if r.outcome[d.Line] != channels.Duplicate {
					t.Errorf("refund %s, line %d (attempt %d): %s, want duplicate", biz, d.Line, d.Attempt, r.outcome[d.Line])
				}
			}
		}
	})

	t.Run("trade and status alone", func(t *testing.T) {
		t.Parallel()
		r := consume(t, ch, f, func(c *consumer.Config[pgx.Tx]) {
			c.Key = consumer.Composite(consumer.ByFormField("trade_no"), consumer.ByFormField("trade_status"))
			c.Fingerprint = consumer.FormFields("out_trade_no", "trade_status", "total_amount")
		})
		if n := partialRefundRows(t, r); n != 0 {
			t.Errorf("%d partial refund rows in the ledger, want none", n)
		}
		for biz, ds := range refunds {
			for _, d := range ds {
				if r.outcome[d.Line] != channels.Duplicate {
					t.Errorf("refund %s, line %d: %s, want skipped as a duplicate", biz, d.Line, r.outcome[d.Line])
				}
			}
		}
		if r.report.OK() {
			t.Error("the tables reconcile without the partial refunds")
		}
		t.Logf("keyed by trade and status: %v", r.report)
	})
}

// formIn percent-encodes v in enc, every byte outside unreserved as %XX:
// spaces as %20, where url.Values.Encode writes '+'.
func formIn(t *testing.T, enc encoding.Encoding, v url.Values) string {
	t.Helper()
	var b strings.Builder
	esc := func(s string) {
		s, err := enc.NewEncoder().String(s)
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < len(s); i++ {
			if c := s[i]; 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("-._~", c) >= 0 {
				b.WriteByte(c)
			} else {
				fmt.Fprintf(&b, "%%%02X", c)
			}
		}
	}
	for _, k := range slices.Sorted(maps.Keys(v)) {
		if b.Len() > 0 {
			b.WriteByte('&')
		}
		esc(k)
		b.WriteByte('=')
		esc(v.Get(k))
	}
	return b.String()
}

// TestGBKBodyKeysLikeItsUTF8Twin: Alipay sends a notification in the
// charset the merchant chose, and says which in its charset field. A
// payment notified in UTF-8, then re-sent in GBK and in GB18030 (spaces as
// %20, not '+'), keyed and fingerprinted on its Chinese subject too: through
// Kafka into Postgres, the first is applied and the two re-sends are
// duplicates — one event row, one ledger row.
func TestGBKBodyKeysLikeItsUTF8Twin(t *testing.T) {
	ch := channels.Alipay{Secret: channels.TestKeys().Alipay}
	o := channels.Order{ID: "ALI-GBK-0001", Account: "merchant-gbk", SKU: "sku-gbk", Amount: 8800, Currency: "CNY"}
	const trade = "2026030222001400000000000001"
	notice := func(charset, sent string) url.Values {
		return url.Values{
			"notify_type": {"trade_status_sync"}, "notify_id": {"ac05099524730693a8b330c5ecf72da9"}, "notify_time": {sent},
			"charset": {charset}, "trade_no": {trade}, "out_trade_no": {o.ID}, "trade_status": {"TRADE_SUCCESS"},
			"gmt_payment":  {"2026-03-02 09:59:58"},
			"total_amount": {"88.00"}, "subject": {"订单 " + o.ID + "：测试商品 一件"}, "buyer_logon_id": {"张三 的账户"},
		}
	}
	values := []string{
		notice("utf-8", "2026-03-02 10:00:00").Encode(),
		formIn(t, simplifiedchinese.GBK, notice("GBK", "2026-03-02 10:02:00")),
		formIn(t, simplifiedchinese.GB18030, notice("GB18030", "2026-03-02 10:12:00")),
	}
	if !strings.Contains(values[0], "+") || strings.Contains(values[1], "+") || values[1] == values[0] {
		t.Fatal("the twins are not spelled apart")
	}
	key := consumer.Composite(consumer.ByFormField("trade_no"), consumer.ByFormField("trade_status"), consumer.ByFormField("subject"))
	event, err := key(&consumer.Message{Value: []byte(values[0])})
	if err != nil {
		t.Fatal(err)
	}
	f := channels.Fixture{Channel: "alipay", Orders: []channels.Order{o}, Expected: channels.Expected{
		Channel:  "alipay",
		Fields:   channels.Tally{Deliveries: 3, Events: 1, Applied: 1, Duplicates: 2, DeadLetters: map[channels.Reason]int{}},
		Orders:   []channels.OrderState{{ID: o.ID, Status: "PAID", PaidTxn: trade, Transitions: []string{"UNPAID>PAID"}}},
		Balances: map[string]int64{o.Account: o.Amount}, Sold: map[string]int64{o.SKU: 1},
	}}
	for i, v := range values {
		expect := channels.Duplicate
		if i == 0 {
			expect = channels.Applied
		}
		f.Stream = append(f.Stream, channels.Delivery{Line: i + 1, Order: o.ID, Event: event, Attempt: i + 1, Expect: expect, Value: v})
	}

	r := consume(t, ch, f, func(c *consumer.Config[pgx.Tx]) {
		// The twins are not signed; the subject, in Chinese, is in the key
		// and the fingerprint.
		c.Validate = nil
		c.Key = key
		c.Fingerprint = consumer.FormFields("out_trade_no", "trade_status", "total_amount", "subject", "buyer_logon_id")
		c.Handler = consumer.HandlerFunc[pgx.Tx](func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			ev, err := ch.Decode(m.Value)
			if err != nil {
				return consumer.Permanent(err)
			}
			k, err := key(m)
			if err != nil {
				return consumer.Permanent(err)
			}
			return channels.Apply(ctx, payments.Pgx(tx), ev, k, m.ID)
		})
	})
	if !r.report.OK() {
		t.Error(r.report)
	}
	r.check(t, f, false)
	var events, ledger int
	if err := r.pool.QueryRow(timeout(t, time.Minute), `SELECT (SELECT count(*) FROM channel_events), (SELECT count(*) FROM ledger)`).Scan(&events, &ledger); err != nil {
		t.Fatal(err)
	}
	if events != 1 || ledger != 1 || r.stats.Duplicates != 2 {
		t.Errorf("%d event rows, %d ledger rows, %d duplicates; want 1, 1, 2", events, ledger, r.stats.Duplicates)
	}
}
