package channels

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/idem/consumer"
)

//go:generate go run ./gen -out ../../testdata/channels

// ChannelNames are the channels with a generated stream.
func ChannelNames() []string { return []string{"alipay", "wechatpay", "stripe"} }

// Re-send schedules: when each attempt is sent, from the first.
var (
	// Alipay: 8 notifications within about 25 hours: 2m, 10m, 10m, 1h, 2h, 6h, 15h.
	alipaySchedule = cumulative(2*time.Minute, 10*time.Minute, 10*time.Minute, time.Hour, 2*time.Hour, 6*time.Hour, 15*time.Hour)
	// WeChat Pay: 15s/15s/30s/3m/10m/20m/30m/30m/30m/60m/3h/3h/3h/6h/6h (24h4m).
	wechatSchedule = cumulative(15*time.Second, 15*time.Second, 30*time.Second, 3*time.Minute, 10*time.Minute, 20*time.Minute,
		30*time.Minute, 30*time.Minute, 30*time.Minute, 60*time.Minute, 3*time.Hour, 3*time.Hour, 3*time.Hour, 6*time.Hour, 6*time.Hour)
	// Stripe: exponential backoff for up to three days; the intervals are
	// not published: 5m doubling, the attempts within 72h.
	stripeSchedule = doubling(5*time.Minute, 72*time.Hour)
)

func cumulative(intervals ...time.Duration) []time.Duration {
	out := []time.Duration{0}
	for _, d := range intervals {
		out = append(out, out[len(out)-1]+d)
	}
	return out
}

func doubling(first, within time.Duration) []time.Duration {
	out := []time.Duration{0}
	for d := first; out[len(out)-1]+d <= within; d *= 2 {
		out = append(out, out[len(out)-1]+d)
	}
	return out
}

var cst = time.FixedZone("CST", 8*3600)

// notice is one notification of an event: sent once, then re-sent on the
// channel's schedule; attempts are the ones that reached the gateway.
type notice struct {
	at       time.Time
	attempts []int
	forged   string                    // "" when genuine
	wrong    string                    // what is wrong with a genuine notice: "" when nothing
	render   func(at time.Time) []byte // one delivery's record value, signed at at
}

// channelGen writes one channel's callbacks.
type channelGen interface {
	spec() spec
	random() *rand.Rand
	Decode(payload []byte) (Event, error)
	Entity(m *consumer.Message) (consumer.Entity, error)
	schedule() []time.Duration
	zone() *time.Location
	order(i int) Order
	trade() string
	// pay is the trade's payment notification. amount and currency are what
	// the channel says was paid; forged signs with a key that is not the
	// channel's.
	pay(o Order, trade string, amount int64, currency string, at time.Time, forged bool) *notice
	refund(o Order, trade string, at time.Time) *notice
}

// Generate builds the fixture of one channel, the same on every call.
func Generate(channel string, keys Keys) (Fixture, error) {
	return generate(channel, keys, 1, 0x1de4)
}

// GenerateMany builds a larger fixture of one channel: copies times the
// orders of Generate's scenarios, each with its own order and trade
// numbers, drawn from seed (the same seed, the same fixture). Its stream
// is in the order the gateway received the deliveries, re-sends included,
// and its Expected is for that order.
func GenerateMany(channel string, keys Keys, copies int, seed uint64) (Fixture, error) {
	if copies < 1 {
		return Fixture{}, fmt.Errorf("channels: GenerateMany: copies is %d, want at least 1", copies)
	}
	return generate(channel, keys, copies, seed)
}

func generate(channel string, keys Keys, copies int, stream uint64) (Fixture, error) {
	seed := func(n uint64) *rand.Rand { return rand.New(rand.NewPCG(n, stream)) }
	var g channelGen
	switch channel {
	case "alipay":
		g = &alipayGen{a: Alipay{Secret: keys.Alipay}, rng: seed(1)}
	case "wechatpay":
		g = &wechatGen{w: WeChatPay{Secret: keys.WeChatPay, Serial: keys.WeChatPaySerial}, rng: seed(2)}
	case "stripe":
		g = &stripeGen{s: Stripe{Secret: keys.Stripe}, rng: seed(3)}
	default:
		return Fixture{}, fmt.Errorf("channels: no channel %q", channel)
	}
	rng := g.random()
	var scenarios []scenario
	for range copies {
		scenarios = append(scenarios, scenariosOf(g)...)
	}
	rng.Shuffle(len(scenarios), func(i, j int) { scenarios[i], scenarios[j] = scenarios[j], scenarios[i] })

	f := Fixture{Channel: channel}
	base := time.Date(2026, 3, 2, 10, 0, 0, 0, g.zone())
	var notices []*notice
	for i, sc := range scenarios {
		o := g.order(i)
		f.Orders = append(f.Orders, o)
		t0 := base.Add(time.Duration(i)*17*time.Minute + time.Duration(rng.IntN(600))*time.Second)
		notices = append(notices, sc(g, o, t0, rng)...)
	}

	// Every attempt that reached the gateway is a delivery, in the order
	// the gateway received them.
	type pending struct {
		n       *notice
		at      time.Time
		attempt int
		seq     int
	}
	var ps []pending
	sched := g.schedule()
	for _, n := range notices {
		for _, a := range n.attempts {
			ps = append(ps, pending{n: n, at: n.at.Add(sched[a-1]), attempt: a, seq: len(ps)})
		}
	}
	sort.SliceStable(ps, func(i, j int) bool { return ps[i].at.Before(ps[j].at) })

	fields, whole := newOracle(f.Orders), newOracle(f.Orders)
	sp := g.spec()
	for i, p := range ps {
		value := p.n.render(p.at)
		ev, err := g.Decode(value)
		if err != nil {
			return f, fmt.Errorf("channels: generated an unreadable callback: %w", err)
		}
		key, err := sp.keyOf(value)
		if err != nil {
			return f, err
		}
		fp, err := sp.fingerprintOf(value)
		if err != nil {
			return f, err
		}
		ent, err := g.Entity(&consumer.Message{Value: value})
		if err != nil {
			return f, fmt.Errorf("channels: generated a callback of no entity: %w", err)
		}
		d := Delivery{Line: i + 1, At: p.at, Order: ev.Order, Event: key, Attempt: p.attempt, Forged: p.n.forged, Wrong: p.n.wrong, Value: string(value)}
		d.Expect, d.Reason = fields.deliver(key, fp, p.n.forged != "", ev, ent)
		d.ExpectWhole, d.ReasonWhole = whole.deliver(key, string(value), p.n.forged != "", ev, ent)
		f.Stream = append(f.Stream, d)
	}
	f.Expected = fields.expected(channel)
	f.Expected.WholePayload = whole.tally
	if w := whole.expected(channel); fmt.Sprint(w.Orders, w.Balances, w.Sold) != fmt.Sprint(f.Expected.Orders, f.Expected.Balances, f.Expected.Sold) {
		return f, fmt.Errorf("channels: %s: the whole-payload fingerprint would change the business outcome", channel)
	}
	return f, nil
}

// scenario writes the notices of one order.
type scenario func(g channelGen, o Order, t0 time.Time, rng *rand.Rand) []*notice

// scenariosOf lists a channel's orders by what happens to them.
func scenariosOf(g channelGen) []scenario {
	var s []scenario
	add := func(n int, sc scenario) {
		for range n {
			s = append(s, sc)
		}
	}
	add(10, payOnly)
	add(4, payThenRefund)
	add(2, refundFirst)
	add(2, forged)
	add(1, forgedFirst)
	add(1, wrongAmount)
	add(1, wrongAmountFirst)
	switch g.(type) {
	case *alipayGen:
		add(3, payThenFinish)
		add(2, finishFirst)
		add(2, waitThenPay)
		add(1, closedUnpaid)
		add(2, partialRefunds)
	case *stripeGen:
		add(1, wrongCurrency)
	}
	return s
}

// someAttempts picks how many attempts of a genuine notice reached the
// gateway before it answered in time: mostly one, sometimes the schedule.
func someAttempts(rng *rand.Rand, sched []time.Duration) []int {
	n := 1
	switch r := rng.IntN(100); {
	case r < 45:
	case r < 65:
		n = 2
	case r < 80:
		n = 3
	default:
		n = len(sched)
	}
	return span(1, n)
}

func span(from, to int) []int {
	var a []int
	for i := from; i <= to; i++ {
		a = append(a, i)
	}
	return a
}

// attemptsAfter are the attempts sent later than d after the first, up to
// two of them: the earlier ones failed at the gateway.
func attemptsAfter(sched []time.Duration, d time.Duration) []int {
	for i, off := range sched {
		if off > d {
			return span(i+1, min(i+2, len(sched)))
		}
	}
	panic("channels: no attempt after " + d.String())
}

func payOnly(g channelGen, o Order, t0 time.Time, rng *rand.Rand) []*notice {
	p := g.pay(o, g.trade(), o.Amount, o.Currency, t0, false)
	p.attempts = someAttempts(rng, g.schedule())
	return []*notice{p}
}

// payThenRefund: paid, refunded in full later; the payment's re-sends may
// come after the refund.
func payThenRefund(g channelGen, o Order, t0 time.Time, rng *rand.Rand) []*notice {
	trade := g.trade()
	p := g.pay(o, trade, o.Amount, o.Currency, t0, false)
	p.attempts = someAttempts(rng, g.schedule())
	r := g.refund(o, trade, t0.Add(time.Duration(20+rng.IntN(600))*time.Minute))
	r.attempts = someAttempts(rng, g.schedule())
	return []*notice{p, r}
}

// refundFirst: the payment's first attempts failed at the gateway, so the
// refund reaches the consumer first; the payment arrives after it and must
// not move the order back to PAID.
func refundFirst(g channelGen, o Order, t0 time.Time, rng *rand.Rand) []*notice {
	trade := g.trade()
	after := time.Duration(3+rng.IntN(10)) * time.Minute
	r := g.refund(o, trade, t0.Add(after))
	r.attempts = []int{1}
	p := g.pay(o, trade, o.Amount, o.Currency, t0, false)
	p.attempts = attemptsAfter(g.schedule(), after+time.Minute)
	return []*notice{p, r}
}

// forged: a payment with a bad signature; the order stays unpaid.
func forged(g channelGen, o Order, t0 time.Time, rng *rand.Rand) []*notice {
	p := g.pay(o, g.trade(), o.Amount, o.Currency, t0, true)
	p.attempts, p.forged = []int{1}, "signature"
	return []*notice{p}
}

// forgedFirst: a forged payment of the real trade number and status,
// ahead of the genuine one (a buyer sees the trade number before paying).
// It must not stop the genuine payment.
func forgedFirst(g channelGen, o Order, t0 time.Time, rng *rand.Rand) []*notice {
	trade := g.trade()
	f := g.pay(o, trade, o.Amount, o.Currency, t0.Add(-3*time.Minute), true)
	f.attempts, f.forged = []int{1}, "signature, ahead of the genuine event"
	p := g.pay(o, trade, o.Amount, o.Currency, t0, false)
	p.attempts = someAttempts(rng, g.schedule())
	return []*notice{f, p}
}

// wrongAmount: a genuine payment of less than the order costs (the amount
// was tampered with before the payment was created); once re-sent.
func wrongAmount(g channelGen, o Order, t0 time.Time, rng *rand.Rand) []*notice {
	p := g.pay(o, g.trade(), 1, o.Currency, t0, false)
	p.attempts, p.wrong = []int{1, 2}, "amount"
	return []*notice{p}
}

// wrongAmountFirst: a validly signed payment notice of the trade with
// another amount reaches the consumer ahead of the genuine one. The handler
// refuses it (consumer.Reject), so that its key, the trade and status,
// stays free for the genuine notice, which is applied. Recorded as failed
// (consumer.Permanent), it would have the genuine one dead-lettered as a
// mismatch: a lost payment.
func wrongAmountFirst(g channelGen, o Order, t0 time.Time, rng *rand.Rand) []*notice {
	trade := g.trade()
	w := g.pay(o, trade, o.Amount-1, o.Currency, t0.Add(-3*time.Minute), false)
	w.attempts, w.wrong = []int{1}, "amount, ahead of the genuine event"
	p := g.pay(o, trade, o.Amount, o.Currency, t0, false)
	p.attempts = someAttempts(rng, g.schedule())
	return []*notice{w, p}
}

// wrongCurrency: a genuine payment of the right number in another currency.
func wrongCurrency(g channelGen, o Order, t0 time.Time, rng *rand.Rand) []*notice {
	p := g.pay(o, g.trade(), o.Amount, "EUR", t0, false)
	p.attempts, p.wrong = []int{1}, "currency"
	return []*notice{p}
}

func payThenFinish(g channelGen, o Order, t0 time.Time, rng *rand.Rand) []*notice {
	a := g.(*alipayGen)
	trade := a.trade()
	p := a.pay(o, trade, o.Amount, o.Currency, t0, false)
	p.attempts = someAttempts(rng, a.schedule())
	f := a.status(o, trade, "TRADE_FINISHED", t0.Add(time.Duration(1+rng.IntN(20))*time.Hour))
	f.attempts = someAttempts(rng, a.schedule())
	return []*notice{p, f}
}

// finishFirst: TRADE_SUCCESS failed at the gateway until after
// TRADE_FINISHED got through: the late TRADE_SUCCESS must not move the
// order back, nor be dead-lettered.
func finishFirst(g channelGen, o Order, t0 time.Time, rng *rand.Rand) []*notice {
	a := g.(*alipayGen)
	trade := a.trade()
	after := time.Duration(20+rng.IntN(40)) * time.Minute
	f := a.status(o, trade, "TRADE_FINISHED", t0.Add(after))
	f.attempts = []int{1}
	p := a.pay(o, trade, o.Amount, o.Currency, t0, false)
	p.attempts = attemptsAfter(a.schedule(), after+time.Minute)
	return []*notice{p, f}
}

func waitThenPay(g channelGen, o Order, t0 time.Time, rng *rand.Rand) []*notice {
	a := g.(*alipayGen)
	trade := a.trade()
	w := a.status(o, trade, "WAIT_BUYER_PAY", t0)
	w.attempts = []int{1}
	p := a.pay(o, trade, o.Amount, o.Currency, t0.Add(time.Duration(1+rng.IntN(5))*time.Minute), false)
	p.attempts = someAttempts(rng, a.schedule())
	return []*notice{w, p}
}

// partialRefunds: paid, then refunded in two parts, hours apart. Alipay
// reports each as another TRADE_SUCCESS notice of the trade, with the
// refunded total in refund_fee, gmt_refund and the refund's out_biz_no:
// keyed by trade and status alone, both would be skipped as duplicates of
// the payment.
func partialRefunds(g channelGen, o Order, t0 time.Time, rng *rand.Rand) []*notice {
	a := g.(*alipayGen)
	trade := a.trade()
	p := a.pay(o, trade, o.Amount, o.Currency, t0, false)
	p.attempts = someAttempts(rng, a.schedule())
	first, second := max(1, o.Amount/4), max(1, o.Amount/3)
	at := t0.Add(time.Duration(2+rng.IntN(20)) * time.Hour)
	r1 := a.notification(o, trade, "TRADE_SUCCESS", o.Amount, first, "RF"+o.ID+"-1", at, false)
	r1.attempts = someAttempts(rng, a.schedule())
	r2 := a.notification(o, trade, "TRADE_SUCCESS", o.Amount, first+second, "RF"+o.ID+"-2", at.Add(time.Duration(1+rng.IntN(30))*time.Hour), false)
	r2.attempts = someAttempts(rng, a.schedule())
	return []*notice{p, r1, r2}
}

// closedUnpaid: the buyer never paid; the trade closed on timeout.
func closedUnpaid(g channelGen, o Order, t0 time.Time, rng *rand.Rand) []*notice {
	a := g.(*alipayGen)
	trade := a.trade()
	w := a.status(o, trade, "WAIT_BUYER_PAY", t0)
	w.attempts = []int{1}
	c := a.status(o, trade, "TRADE_CLOSED", t0.Add(15*time.Minute))
	c.attempts = someAttempts(rng, a.schedule())
	return []*notice{w, c}
}

func digits(rng *rand.Rand, n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte('0' + rng.IntN(10))
	}
	return string(b)
}

func alnum(rng *rand.Rand, n int) string {
	const chars = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
	b := make([]byte, n)
	for i := range b {
		b[i] = chars[rng.IntN(len(chars))]
	}
	return string(b)
}

func hexOf(rng *rand.Rand, n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.IntN(256))
	}
	return hex.EncodeToString(b)
}

// forger is a key no channel signs with.
var forger = []byte("not-the-channel's-key")

// alipayGen writes Alipay notifications.
type alipayGen struct {
	a   Alipay
	rng *rand.Rand
}

func (g *alipayGen) spec() spec                     { return g.a.spec() }
func (g *alipayGen) Decode(p []byte) (Event, error) { return g.a.Decode(p) }
func (g *alipayGen) Entity(m *consumer.Message) (consumer.Entity, error) {
	return g.a.Entity(m)
}
func (g *alipayGen) schedule() []time.Duration { return alipaySchedule }
func (g *alipayGen) zone() *time.Location      { return cst }
func (g *alipayGen) random() *rand.Rand        { return g.rng }
func (g *alipayGen) trade() string             { return "20260302220014" + digits(g.rng, 14) }
func (g *alipayGen) order(i int) Order {
	rng := g.rng
	return Order{ID: fmt.Sprintf("ALI20260302%04d", i+1), Account: fmt.Sprintf("merchant-%02d", 1+rng.IntN(4)),
		SKU: fmt.Sprintf("sku-%02d", 1+rng.IntN(6)), Amount: int64(100 + rng.IntN(99900)), Currency: "CNY"}
}

const alipayTime = "2006-01-02 15:04:05"

// notification is one Alipay notification of trade at status, sent first
// at at; the fields a re-send changes are set per delivery. refund is the
// trade's refunded total, and bizNo the refund request's number when it is
// above zero.
func (g *alipayGen) notification(o Order, trade, status string, total, refund int64, bizNo string, at time.Time, forged bool) *notice {
	v := url.Values{}
	v.Set("notify_type", "trade_status_sync")
	v.Set("notify_id", hexOf(g.rng, 17))
	v.Set("app_id", "2021000000000001")
	v.Set("charset", "utf-8")
	v.Set("version", "1.0")
	v.Set("trade_no", trade)
	v.Set("out_trade_no", o.ID)
	v.Set("trade_status", status)
	v.Set("total_amount", formatYuan(total))
	v.Set("refund_fee", formatYuan(refund))
	v.Set("seller_id", "2088000000000001")
	v.Set("buyer_id", "2088"+trade[len(trade)-12:]) // one buyer per trade
	v.Set("subject", "order "+o.ID)
	switch status {
	case "WAIT_BUYER_PAY":
		v.Set("gmt_create", at.In(cst).Format(alipayTime))
	case "TRADE_SUCCESS", "TRADE_FINISHED":
		v.Set("gmt_payment", at.In(cst).Format(alipayTime))
	case "TRADE_CLOSED":
		v.Set("gmt_close", at.In(cst).Format(alipayTime))
	}
	if refund > 0 {
		v.Set("gmt_refund", at.In(cst).Format(alipayTime))
		v.Set("out_biz_no", bizNo)
	}
	signer := g.a
	if forged {
		signer = Alipay{Secret: forger}
	}
	return &notice{at: at, render: func(sent time.Time) []byte {
		d := url.Values{}
		for k, vs := range v {
			d[k] = append([]string(nil), vs...)
		}
		d.Set("notify_time", sent.In(cst).Format(alipayTime))
		signer.sign(d)
		return []byte(d.Encode())
	}}
}

func (g *alipayGen) pay(o Order, trade string, amount int64, _ string, at time.Time, forged bool) *notice {
	return g.notification(o, trade, "TRADE_SUCCESS", amount, 0, "", at, forged)
}

// refund is the notification of a full refund: the trade closes.
func (g *alipayGen) refund(o Order, trade string, at time.Time) *notice {
	return g.notification(o, trade, "TRADE_CLOSED", o.Amount, o.Amount, "RF"+o.ID, at, false)
}

func (g *alipayGen) status(o Order, trade, status string, at time.Time) *notice {
	return g.notification(o, trade, status, o.Amount, 0, "", at, false)
}

// wechatGen writes WeChat Pay notifications.
type wechatGen struct {
	w   WeChatPay
	rng *rand.Rand
}

func (g *wechatGen) spec() spec                     { return g.w.spec() }
func (g *wechatGen) Decode(p []byte) (Event, error) { return g.w.Decode(p) }
func (g *wechatGen) Entity(m *consumer.Message) (consumer.Entity, error) {
	return g.w.Entity(m)
}
func (g *wechatGen) schedule() []time.Duration { return wechatSchedule }
func (g *wechatGen) zone() *time.Location      { return cst }
func (g *wechatGen) random() *rand.Rand        { return g.rng }
func (g *wechatGen) trade() string             { return "4200002026030" + digits(g.rng, 15) }
func (g *wechatGen) order(i int) Order {
	rng := g.rng
	return Order{ID: fmt.Sprintf("WX20260302%04d", i+1), Account: fmt.Sprintf("merchant-%02d", 1+rng.IntN(4)),
		SKU: fmt.Sprintf("sku-%02d", 1+rng.IntN(6)), Amount: int64(100 + rng.IntN(99900)), Currency: "CNY"}
}

func (g *wechatGen) notification(eventType, summary string, res wechatResource, at time.Time, forged bool) *notice {
	body, _ := json.Marshal(wechatNotification{
		ID: "EV-" + at.In(cst).Format("20060102150405") + digits(g.rng, 6), CreateTime: at.In(cst).Format(time.RFC3339),
		ResourceType: "encrypt-resource", EventType: eventType, Summary: summary, Resource: res,
	})
	signer := g.w
	if forged {
		signer.Secret = forger
	}
	rng := g.rng
	return &notice{at: at, render: func(sent time.Time) []byte {
		return signer.record(strconv.FormatInt(sent.Unix(), 10), alnum(rng, 32), body)
	}}
}

func (g *wechatGen) pay(o Order, trade string, amount int64, currency string, at time.Time, forged bool) *notice {
	return g.notification("TRANSACTION.SUCCESS", "支付成功", wechatResource{
		Mchid: "1900000109", Appid: "wxd678efh567hg6787", TransactionID: trade, OutTradeNo: o.ID, TradeState: "SUCCESS",
		SuccessTime: at.In(cst).Format(time.RFC3339),
		Amount:      wechatAmount{Total: amount, PayerTotal: amount, Currency: currency, PayerCurrency: currency},
	}, at, forged)
}

func (g *wechatGen) refund(o Order, trade string, at time.Time) *notice {
	return g.notification("REFUND.SUCCESS", "退款成功", wechatResource{
		Mchid: "1900000109", TransactionID: trade, OutTradeNo: o.ID, RefundID: "50300" + digits(g.rng, 24),
		OutRefundNo: "RF" + o.ID, RefundStatus: "SUCCESS", SuccessTime: at.In(cst).Format(time.RFC3339),
		Amount: wechatAmount{Total: o.Amount, PayerTotal: o.Amount, Refund: o.Amount, PayerRefund: o.Amount},
	}, at, false)
}

// stripeGen writes Stripe events.
type stripeGen struct {
	s   Stripe
	rng *rand.Rand
}

func (g *stripeGen) spec() spec                     { return g.s.spec() }
func (g *stripeGen) Decode(p []byte) (Event, error) { return g.s.Decode(p) }
func (g *stripeGen) Entity(m *consumer.Message) (consumer.Entity, error) {
	return g.s.Entity(m)
}
func (g *stripeGen) schedule() []time.Duration { return stripeSchedule }
func (g *stripeGen) zone() *time.Location      { return time.UTC }
func (g *stripeGen) random() *rand.Rand        { return g.rng }
func (g *stripeGen) trade() string             { return "pi_" + alnum(g.rng, 24) }
func (g *stripeGen) order(i int) Order {
	rng := g.rng
	return Order{ID: fmt.Sprintf("ST-20260302-%04d", i+1), Account: fmt.Sprintf("merchant-%02d", 1+rng.IntN(4)),
		SKU: fmt.Sprintf("sku-%02d", 1+rng.IntN(6)), Amount: int64(500 + rng.IntN(24500)), Currency: "USD"}
}

func (g *stripeGen) event(typ string, obj stripeObject, at time.Time, forged bool) *notice {
	e := stripeEvent{ID: "evt_" + alnum(g.rng, 24), Object: "event", APIVersion: "2024-06-20", Created: at.Unix(), Type: typ}
	e.Data.Object = obj
	body, _ := json.Marshal(e)
	signer := g.s
	if forged {
		signer.Secret = forger
	}
	return &notice{at: at, render: func(sent time.Time) []byte {
		return signer.record(strconv.FormatInt(sent.Unix(), 10), body)
	}}
}

func (g *stripeGen) pay(o Order, trade string, amount int64, currency string, at time.Time, forged bool) *notice {
	return g.event("payment_intent.succeeded", stripeObject{
		ID: trade, Object: "payment_intent", Amount: amount, AmountReceived: amount, Currency: strings.ToLower(currency),
		Status: "succeeded", Metadata: map[string]string{"order_id": o.ID},
	}, at, forged)
}

func (g *stripeGen) refund(o Order, trade string, at time.Time) *notice {
	return g.event("charge.refunded", stripeObject{
		ID: "ch_" + alnum(g.rng, 24), Object: "charge", Amount: o.Amount, AmountRefunded: o.Amount, Currency: strings.ToLower(o.Currency),
		PaymentIntent: trade, Refunded: true, Status: "succeeded", Metadata: map[string]string{"order_id": o.ID},
	}, at, false)
}
