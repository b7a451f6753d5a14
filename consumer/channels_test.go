package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/memstore"
)

func TestCompositeAndFormKeys(t *testing.T) {
	trade := consumer.Composite(consumer.ByJSONField("trade_no"), consumer.ByJSONField("trade_status"))
	for in, want := range map[string]string{
		`{"trade_no":"2026113022001","trade_status":"TRADE_SUCCESS"}`: `2026113022001:TRADE_SUCCESS`,
		`{"trade_no":"a:b","trade_status":"c"}`:                       `a\:b:c`,
		`{"trade_no":"a","trade_status":"b:c"}`:                       `a:b\:c`,
		`{"trade_no":"a\\","trade_status":"b"}`:                       `a\\:b`,
	} {
		if got, err := trade(&consumer.Message{Value: []byte(in)}); err != nil || got != want {
			t.Errorf("%s: %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := trade(&consumer.Message{Value: []byte(`{"trade_no":"x"}`)}); !errors.Is(err, consumer.ErrNoKey) {
		t.Errorf("a missing part: %v, want ErrNoKey", err)
	}
	form := consumer.ByFormField("trade_no")
	if got, err := form(&consumer.Message{Value: []byte("notify_id=n1&trade_no=2026%3A01&sign=abc")}); err != nil || got != "2026:01" {
		t.Errorf("form key: %q, %v", got, err)
	}
	if _, err := form(&consumer.Message{Value: []byte("trade_no=a&trade_no=b")}); !errors.Is(err, consumer.ErrBadPayload) {
		t.Errorf("a field twice: %v, want ErrBadPayload", err)
	}
	if _, err := form(&consumer.Message{Value: []byte("sign=x")}); !errors.Is(err, consumer.ErrNoKey) {
		t.Errorf("a missing field: %v, want ErrNoKey", err)
	}
	if _, err := form(&consumer.Message{Value: []byte("a=%zz")}); !errors.Is(err, consumer.ErrBadPayload) {
		t.Errorf("a malformed form: %v, want ErrBadPayload", err)
	}
}

// TestOptionalKeyParts: an absent optional part at the end leaves the key
// as it was without it; a present one tells two refunds of one trade
// apart; an absent one before a present one is an empty part; a malformed
// payload is still refused.
func TestOptionalKeyParts(t *testing.T) {
	f := consumer.ByFormField
	refund := consumer.Composite(f("trade_no"), f("trade_status"), f("out_biz_no").Optional())
	for in, want := range map[string]string{
		"trade_no=T1&trade_status=TRADE_SUCCESS&notify_id=n1":                  "T1:TRADE_SUCCESS",
		"trade_no=T1&trade_status=TRADE_SUCCESS&out_biz_no=RF1&refund_fee=1":   "T1:TRADE_SUCCESS:RF1",
		"trade_no=T1&trade_status=TRADE_SUCCESS&out_biz_no=RF2&refund_fee=3":   "T1:TRADE_SUCCESS:RF2",
		"trade_no=T1&trade_status=TRADE_SUCCESS&out_biz_no=&refund_fee=3":      "T1:TRADE_SUCCESS",
		"trade_no=T1&trade_status=TRADE_SUCCESS&out_biz_no=R%3A1&refund_fee=3": `T1:TRADE_SUCCESS:R\:1`,
	} {
		if got, err := refund(&consumer.Message{Value: []byte(in)}); err != nil || got != want {
			t.Errorf("%s: %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := refund(&consumer.Message{Value: []byte("trade_no=T1&out_biz_no=RF1")}); !errors.Is(err, consumer.ErrNoKey) {
		t.Errorf("a required part missing: %v, want ErrNoKey", err)
	}
	if _, err := refund(&consumer.Message{Value: []byte("trade_no=T1&trade_status=S&out_biz_no=a&out_biz_no=b")}); !errors.Is(err, consumer.ErrBadPayload) {
		t.Errorf("an optional part given twice: %v, want ErrBadPayload", err)
	}
	middle := consumer.Composite(f("a"), f("b").Optional(), f("c").Optional(), f("d"))
	for in, want := range map[string]string{"a=1&d=4": "1:::4", "a=1&b=2&d=4": "1:2::4", "a=1&c=3&d=4": "1::3:4"} {
		if got, err := middle(&consumer.Message{Value: []byte(in)}); err != nil || got != want {
			t.Errorf("%s: %q, %v; want %q", in, got, err, want)
		}
	}
	first := consumer.Composite(f("a").Optional(), f("b"))
	if got, err := first(&consumer.Message{Value: []byte("b=2")}); err != nil || got != ":2" {
		t.Errorf("an absent first part: %q, %v; want \":2\"", got, err)
	}
	none := consumer.Composite(f("a").Optional(), f("b").Optional())
	if _, err := none(&consumer.Message{Value: []byte("c=3")}); !errors.Is(err, consumer.ErrNoKey) {
		t.Errorf("every part absent: %v, want ErrNoKey", err)
	}
	if _, err := f("a").Optional()(&consumer.Message{Value: []byte("c=3")}); !errors.Is(err, consumer.ErrNoKey) {
		t.Errorf("Optional alone: %v, want ErrNoKey", err)
	}
}

func TestFieldFingerprints(t *testing.T) {
	fp := func(f consumer.FingerprintFunc, v string) dedup.Fingerprint {
		t.Helper()
		got, err := f(&consumer.Message{Value: []byte(v)})
		if err != nil {
			t.Fatalf("%s: %v", v, err)
		}
		return got
	}
	j := consumer.JSONFields("amount", "order.id", "status")
	a := fp(j, `{"amount":100,"order":{"id":"o1"},"status":"PAID","notify_time":"10:00","sign":"s1"}`)
	if b := fp(j, `{"sign":"s2","status":"PAID","order":{"id":"o1"},"amount":100.0,"notify_time":"10:04"}`); a != b {
		t.Error("a re-send with a new time and signature has another fingerprint")
	}
	for _, v := range []string{
		`{"amount":101,"order":{"id":"o1"},"status":"PAID"}`,
		`{"amount":100,"order":{"id":"o2"},"status":"PAID"}`,
		`{"amount":100,"order":{"id":"o1"},"status":"REFUNDED"}`,
		`{"amount":100,"order":{"id":"o1"}}`,
		`{"amount":100,"order":{"id":"o1"},"status":null}`,
	} {
		if fp(j, v) == a {
			t.Errorf("%s: same fingerprint as the original", v)
		}
	}
	if fp(j, `{"amount":100,"order":{"id":"o1"}}`) == fp(j, `{"amount":100,"order":{"id":"o1"},"status":null}`) {
		t.Error("an absent field and null have one fingerprint")
	}
	f := consumer.FormFields("total_amount", "out_trade_no", "trade_status")
	x := fp(f, "notify_time=2026-11-30+10%3A00%3A00&total_amount=88.00&out_trade_no=o1&trade_status=TRADE_SUCCESS&sign=AAA")
	if y := fp(f, "sign=BBB&trade_status=TRADE_SUCCESS&out_trade_no=o1&total_amount=88.00&notify_time=2026-11-30+10%3A04%3A00"); x != y {
		t.Error("a form re-send with a new time and signature has another fingerprint")
	}
	if fp(f, "total_amount=88.01&out_trade_no=o1&trade_status=TRADE_SUCCESS") == x {
		t.Error("another amount, one fingerprint")
	}
	if _, err := f(&consumer.Message{Value: []byte("total_amount=1&total_amount=2")}); !errors.Is(err, consumer.ErrBadPayload) {
		t.Errorf("a field twice: %v, want ErrBadPayload", err)
	}
	if _, err := j(&consumer.Message{Value: []byte(`{"amount":`)}); !errors.Is(err, consumer.ErrBadPayload) {
		t.Errorf("broken JSON: %v, want ErrBadPayload", err)
	}
	if fp(consumer.NoFingerprint(), `{"a":1}`) != fp(consumer.NoFingerprint(), `{"a":2}`) {
		t.Error("NoFingerprint differs")
	}
}

// alipayNotify is an Alipay-style asynchronous notification: the channel
// re-sends it with a fresh notify_time, notify_id and sign each time.
func alipayNotify(tradeNo, status string, amount string, resend int) string {
	v := url.Values{}
	v.Set("notify_time", fmt.Sprintf("2026-11-30 10:%02d:00", resend*4))
	v.Set("notify_id", fmt.Sprintf("n-%s-%s-%d", tradeNo, status, resend))
	v.Set("trade_no", tradeNo)
	v.Set("out_trade_no", "order-"+tradeNo)
	v.Set("trade_status", status)
	v.Set("total_amount", amount)
	v.Set("sign", fmt.Sprintf("sig-%d", resend))
	return v.Encode()
}

// TestChannelResendsAreDuplicatesNotMismatches: three re-sends of two
// statuses of one trade. Fingerprinted over the fields that define the
// request they are duplicates; over the whole payload they are refused as
// mismatches — the problem a payment channel's stamping causes.
func TestChannelResendsAreDuplicatesNotMismatches(t *testing.T) {
	var msgs []*consumer.Message
	off := int64(0)
	for _, status := range []string{"TRADE_SUCCESS", "TRADE_FINISHED"} {
		for resend := range 3 {
			msgs = append(msgs, consumertest.Message("alipay", 0, off, "", alipayNotify("T1", status, "88.00", resend)))
			off++
		}
	}
	run := func(fp consumer.FingerprintFunc) consumertest.Result {
		eff := newEffects()
		cfg := baseConfig(func(ctx context.Context, tx *memstore.Tx, m *consumer.Message) error {
			k, _ := consumer.Composite(consumer.ByFormField("trade_no"), consumer.ByFormField("trade_status"))(m)
			eff.add(tx, k)
			return nil
		})
		cfg.Key = consumer.Composite(consumer.ByFormField("trade_no"), consumer.ByFormField("trade_status"))
		cfg.Fingerprint = fp
		res := consumertest.Run(t, cfg, consumertest.Script{}, msgs...)
		eff.check(t, []string{"T1:TRADE_SUCCESS", "T1:TRADE_FINISHED"})
		return res
	}
	res := run(consumer.FormFields("trade_no", "out_trade_no", "trade_status", "total_amount"))
	if res.Stats.Applied != 2 || res.Stats.Duplicates != 4 || len(res.DeadLetters) != 0 {
		t.Errorf("chosen fields: applied %d, duplicates %d, dead letters %d; want 2, 4, 0", res.Stats.Applied, res.Stats.Duplicates, len(res.DeadLetters))
	}
	res = run(consumer.WholePayload())
	if res.Stats.Applied != 2 || len(res.DeadLetters) != 4 {
		t.Fatalf("whole payload: applied %d, dead letters %d; want 2 and the 4 re-sends", res.Stats.Applied, len(res.DeadLetters))
	}
	for _, l := range res.DeadLetters {
		if !errors.Is(l.Reason, dedup.ErrFingerprintMismatch) {
			t.Errorf("re-send dead-lettered with %v, want a fingerprint mismatch", l.Reason)
		}
	}
}

// TestOnDuplicateSeesTheFirstClaim: the hook gets every duplicate with when
// its key was first claimed, and Stats counts the ages.
func TestOnDuplicateSeesTheFirstClaim(t *testing.T) {
	var mu sync.Mutex
	var seen []consumer.Duplicate
	cfg := baseConfig(func(context.Context, *memstore.Tx, *consumer.Message) error { return nil })
	past := time.Now().Add(-3 * time.Hour)
	cfg.Store = memstore.New(memstore.Config{Now: func() time.Time { return past }}) // the first claims, three hours ago
	cfg.OnDuplicate = func(_ context.Context, d consumer.Duplicate) {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, d)
	}
	res := consumertest.Run(t, cfg, consumertest.Script{MinDeliveries: 3, MaxDeliveries: 3}, payments(2)...)
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 4 || res.Stats.Duplicates != 4 {
		t.Fatalf("hook saw %d duplicates, stats %d; want 4", len(seen), res.Stats.Duplicates)
	}
	for _, d := range seen {
		if !d.FirstAt.Equal(past) || d.Age < 3*time.Hour || d.Key.Scope != "payments" || d.Message == nil {
			t.Errorf("duplicate %+v: want FirstAt three hours ago", d)
		}
	}
	h := res.Stats.DuplicateAge
	if got := h.Quantile(0.999); got != 6*time.Hour {
		t.Errorf("p99.9 age bucket %v, want 6h (ages of 3h); %+v", got, h)
	}
	if h.Max < 3*time.Hour {
		t.Errorf("max age %v", h.Max)
	}
}

// TestMissingKeyFallsBackWhenAsked: by default a message without its
// business key is dead-lettered; FallBackToMessageID keys it by the message
// ID instead, counted.
func TestMissingKeyFallsBackWhenAsked(t *testing.T) {
	msgs := []*consumer.Message{
		consumertest.Message("pay", 0, 0, "", payment(0)),
		consumertest.Message("pay", 0, 1, "", `{"amount":5}`), // an old producer: no txn_id
	}
	cfg := baseConfig(func(context.Context, *memstore.Tx, *consumer.Message) error { return nil })
	res := consumertest.Run(t, cfg, consumertest.Script{}, msgs...)
	if len(res.DeadLetters) != 1 || !errors.Is(res.DeadLetters[0].Reason, consumer.ErrNoKey) {
		t.Fatalf("default: dead letters %+v, want the keyless message", res.DeadLetters)
	}
	cfg = baseConfig(func(context.Context, *memstore.Tx, *consumer.Message) error { return nil })
	cfg.OnMissingKey = consumer.FallBackToMessageID
	res = consumertest.Run(t, cfg, consumertest.Script{MinDeliveries: 2, MaxDeliveries: 2}, msgs...)
	if len(res.DeadLetters) != 0 || res.Stats.Applied != 2 || res.Stats.Duplicates != 2 || res.Stats.KeyFallbacks != 2 {
		t.Errorf("fallback: %v, key fallbacks %d; want 2 applied, 2 duplicates, 2 fallbacks", res, res.Stats.KeyFallbacks)
	}
}

// TestValidateRunsBeforeTheClaim: a message that fails Validate is
// dead-lettered without its key claimed, so the genuine message behind it
// under the same key is still applied.
func TestValidateRunsBeforeTheClaim(t *testing.T) {
	eff := newEffects()
	cfg := baseConfig(eff.apply)
	errForged := errors.New("bad signature")
	cfg.Validate = func(_ context.Context, m *consumer.Message) error {
		if sig, _ := consumer.ByJSONField("sig")(m); sig != "good" {
			return errForged
		}
		return nil
	}
	res := consumertest.Run(t, cfg, consumertest.Script{},
		consumertest.Message("pay", 0, 0, "", `{"txn_id":"T1","amount":100,"sig":"forged"}`),
		consumertest.Message("pay", 0, 1, "", `{"txn_id":"T1","amount":100,"sig":"good"}`))
	eff.check(t, []string{"T1"})
	if len(res.DeadLetters) != 1 || !errors.Is(res.DeadLetters[0].Reason, errForged) || res.DeadLetters[0].Message.Offset != 0 {
		t.Fatalf("dead letters %+v, want the forgery", res.DeadLetters)
	}
}

// TestValidateWaitsOutRetryable: a Validate that cannot make its check
// (Retryable: the verifier's certificate is unreachable) holds the message
// in its lane, far beyond the retry budget, and dead-letters nothing; the
// message ahead of it commits first; a plain error still refuses.
func TestValidateWaitsOutRetryable(t *testing.T) {
	eff := newEffects()
	cfg := baseConfig(eff.apply)
	cfg.Retry = consumer.RetryPolicy{MaxAttempts: 2, MaxElapsed: time.Millisecond, Initial: time.Microsecond, Max: time.Microsecond}
	var mu sync.Mutex
	calls := 0
	errCertAway := errors.New("platform certificate: connection refused")
	cfg.Validate = func(_ context.Context, m *consumer.Message) error {
		id, _ := consumer.ByJSONField("txn_id")(m)
		mu.Lock()
		defer mu.Unlock()
		switch {
		case id == "F1":
			return errors.New("bad signature")
		case id != "T2":
			return nil
		case calls < 50:
			if calls++; calls == 2 && eff.count("T1") != 1 { // after the first wait
				t.Error("T1, ahead of T2, was not committed before the wait")
			}
			return consumer.Retryable(errCertAway)
		}
		return nil
	}
	res := consumertest.Run(t, cfg, consumertest.Script{},
		consumertest.Message("pay", 0, 0, "", `{"txn_id":"T1","amount":100}`),
		consumertest.Message("pay", 0, 1, "", `{"txn_id":"T2","amount":100}`),
		consumertest.Message("pay", 0, 2, "", `{"txn_id":"F1","amount":100}`))
	eff.check(t, []string{"T1", "T2"})
	if calls != 50 || len(res.DeadLetters) != 1 || res.DeadLetters[0].Cause != consumer.CauseValidate {
		t.Fatalf("%d failed checks, dead letters %+v; want 50 and the forgery alone", calls, res.DeadLetters)
	}
}

// Findings of a review, each pinned.
func TestReviewFindings(t *testing.T) {
	t.Run("Composite keeps invalid UTF-8 apart, for Validate to refuse", func(t *testing.T) {
		k := consumer.Composite(consumer.ByRecordKey())
		a, _ := k(consumertest.Message("pay", 0, 0, "\xff", "{}"))
		b, _ := k(consumertest.Message("pay", 0, 1, "\xfe", "{}"))
		if a == b {
			t.Fatalf("Composite gives %q for \\xff and \\xfe", a)
		}
		cfg := baseConfig(func(context.Context, *memstore.Tx, *consumer.Message) error { return nil })
		cfg.Key = k
		res := consumertest.Run(t, cfg, consumertest.Script{},
			consumertest.Message("pay", 0, 0, "\xff", `{"amount":1}`), consumertest.Message("pay", 0, 1, "\xfe", `{"amount":1}`))
		if res.Stats.Duplicates != 0 || len(res.DeadLetters) != 2 {
			t.Errorf("duplicates %d, dead letters %d; want both refused as invalid keys", res.Stats.Duplicates, len(res.DeadLetters))
		}
	})
	t.Run("Quantile covers at least q", func(t *testing.T) {
		var h consumer.AgeHistogram
		h.Bounds[0] = time.Second
		h.Counts[0], h.Counts[len(h.Counts)-1], h.Max = 9, 1, 100*24*time.Hour
		if got := h.Quantile(0.999); got != h.Max {
			t.Errorf("Quantile(0.999) = %v, want the oldest, %v", got, h.Max)
		}
	})
	t.Run("an absent form field is not a value", func(t *testing.T) {
		fp := consumer.FormFields("trade_no", "refund_fee")
		a, _ := fp(&consumer.Message{Value: []byte("trade_no=1")})
		b, _ := fp(&consumer.Message{Value: []byte("trade_no=1&refund_fee=%00absent")})
		c, _ := fp(&consumer.Message{Value: []byte("trade_no=1&refund_fee=")})
		if a == b || a == c {
			t.Error("an absent field hashes like a value")
		}
	})
	t.Run("a JSON field under a null parent is absent", func(t *testing.T) {
		fp := consumer.JSONFields("trade_no", "refund.amount")
		a, err := fp(&consumer.Message{Value: []byte(`{"trade_no":"1","refund":null}`)})
		if err != nil {
			t.Fatal(err)
		}
		b, _ := fp(&consumer.Message{Value: []byte(`{"trade_no":"1"}`)})
		if a != b {
			t.Error("a null parent differs from a missing one")
		}
	})
}
