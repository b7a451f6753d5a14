package consumer_test

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"

	"golang.org/x/text/encoding"
	"golang.org/x/text/encoding/simplifiedchinese"

	"github.com/idemkit/idem/consumer"
)

// formIn percent-encodes fields in enc (nil: UTF-8), every byte outside
// unreserved as %XX — spaces as %20, where url.Values.Encode writes '+'.
func formIn(t *testing.T, enc encoding.Encoding, fields ...string) string {
	t.Helper()
	var b strings.Builder
	for i := 0; i < len(fields); i += 2 {
		if i > 0 {
			b.WriteByte('&')
		}
		for j, s := range fields[i : i+2] {
			if j == 1 {
				b.WriteByte('=')
			}
			if enc != nil {
				var err error
				if s, err = enc.NewEncoder().String(s); err != nil {
					t.Fatal(err)
				}
			}
			for k := 0; k < len(s); k++ {
				c := s[k]
				if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("-._~", c) >= 0 {
					b.WriteByte(c)
				} else {
					fmt.Fprintf(&b, "%%%02X", c)
				}
			}
		}
	}
	return b.String()
}

// TestFormBodiesDecoded: form values are compared after URL-decoding, and a
// body in GBK, GB2312 or GB18030 — said by the Content-Type header or by a
// charset field — keys and fingerprints like its UTF-8 twin.
func TestFormBodiesDecoded(t *testing.T) {
	const subject = "订单 A-1：测试 付款"
	key := consumer.Composite(consumer.ByFormField("out_trade_no"), consumer.ByFormField("subject"))
	fp := consumer.FormFields("out_trade_no", "subject", "total_amount")
	twin := url.Values{"out_trade_no": {"A 1"}, "subject": {subject}, "total_amount": {"88.00"}, "charset": {"utf-8"}}.Encode()
	if !strings.Contains(twin, "A+1") {
		t.Fatalf("the UTF-8 twin %q spells the space other than '+'", twin)
	}
	ct := func(v string) []consumer.Header { return []consumer.Header{{Key: "Content-Type", Value: []byte(v)}} }
	msg := func(body string, h []consumer.Header) *consumer.Message {
		return &consumer.Message{Value: []byte(body), Headers: h}
	}
	want := msg(twin, nil)
	wantKey, err := key(want)
	if err != nil || wantKey != "A 1:"+subject {
		t.Fatalf("the UTF-8 twin: key %q, %v", wantKey, err)
	}
	wantFP, err := fp(want)
	if err != nil {
		t.Fatal(err)
	}
	fields := func(charset string) []string {
		f := []string{"out_trade_no", "A 1", "subject", subject, "total_amount", "88.00"}
		if charset != "" {
			f = append(f, "charset", charset)
		}
		return f
	}
	for name, m := range map[string]*consumer.Message{
		"%20 for the space":             msg(formIn(t, nil, fields("utf-8")...), nil),
		"GBK, a charset field":          msg(formIn(t, simplifiedchinese.GBK, fields("GBK")...), nil),
		"gb2312, a charset field":       msg(formIn(t, simplifiedchinese.GBK, fields("gb2312")...), nil),
		"GB18030, a charset field":      msg(formIn(t, simplifiedchinese.GB18030, fields("GB18030")...), nil),
		"GBK, the Content-Type header":  msg(formIn(t, simplifiedchinese.GBK, fields("")...), ct("application/x-www-form-urlencoded; charset=GBK")),
		"the header over the field":     msg(formIn(t, simplifiedchinese.GBK, fields("utf-8")...), []consumer.Header{{Key: "content-type", Value: []byte("application/x-www-form-urlencoded;charset=\"gbk\"")}}),
		"UTF-8 in the header, no field": msg(formIn(t, nil, fields("")...), ct("application/x-www-form-urlencoded; charset=UTF-8")),
	} {
		if k, err := key(m); err != nil || k != wantKey {
			t.Errorf("%s: key %q, %v; want %q", name, k, err, wantKey)
		}
		if f, err := fp(m); err != nil || f != wantFP {
			t.Errorf("%s: another fingerprint (%v)", name, err)
		}
	}
	// Read without its charset, a GBK body is another key: what the
	// decoding is for.
	if k, err := key(msg(formIn(t, simplifiedchinese.GBK, fields("")...), nil)); err != nil || k == wantKey {
		t.Errorf("a GBK body read as UTF-8: key %q, %v", k, err)
	}
	for name, m := range map[string]*consumer.Message{
		"another charset":        msg(formIn(t, nil, fields("ISO-8859-1")...), nil),
		"another charset header": msg(formIn(t, nil, fields("")...), ct("application/x-www-form-urlencoded; charset=Big5")),
		"charset twice":          msg(formIn(t, nil, fields("GBK")...)+"&charset=utf-8", nil),
		"not GBK":                msg("out_trade_no=A1&subject=%FF%FF&charset=GBK", nil),
	} {
		if _, err := key(m); !errors.Is(err, consumer.ErrBadPayload) {
			t.Errorf("%s: key %v, want ErrBadPayload", name, err)
		}
		if _, err := fp(m); !errors.Is(err, consumer.ErrBadPayload) {
			t.Errorf("%s: fingerprint %v, want ErrBadPayload", name, err)
		}
	}
}
