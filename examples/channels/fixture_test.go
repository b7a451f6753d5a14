package channels

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/dedup"
)

const testdata = "../../testdata/channels"

// TestFixturesAreGenerated fails when testdata/channels and the generator
// disagree: run go generate ./examples/channels.
func TestFixturesAreGenerated(t *testing.T) {
	for _, ch := range ChannelNames() {
		f, err := Generate(ch, TestKeys())
		if err != nil {
			t.Fatal(err)
		}
		files, err := f.files()
		if err != nil {
			t.Fatal(err)
		}
		for name, want := range files {
			got, err := os.ReadFile(filepath.Join(testdata, ch, name))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("%s/%s differs from what the generator writes: run go generate ./examples/channels", ch, name)
			}
		}
	}
}

func load(t *testing.T, ch string) Fixture {
	t.Helper()
	f, err := Load(testdata, ch)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

type verifier interface {
	Verify([]byte) error
	Decode([]byte) (Event, error)
	spec() spec
}

func channelOf(t *testing.T, name string) verifier {
	k := TestKeys()
	switch name {
	case "alipay":
		return Alipay{Secret: k.Alipay}
	case "wechatpay":
		return WeChatPay{Secret: k.WeChatPay, Serial: k.WeChatPaySerial}
	case "stripe":
		return Stripe{Secret: k.Stripe}
	}
	t.Fatalf("no channel %q", name)
	return nil
}

// TestSignatures: every genuine delivery verifies and every forged one
// fails; a genuine one with an altered amount fails too.
func TestSignatures(t *testing.T) {
	for _, name := range ChannelNames() {
		t.Run(name, func(t *testing.T) {
			ch := channelOf(t, name)
			forged := 0
			for _, d := range load(t, name).Stream {
				err := ch.Verify([]byte(d.Value))
				switch {
				case d.Forged == "" && err != nil:
					t.Errorf("line %d: genuine, but %v", d.Line, err)
				case d.Forged != "" && !errors.Is(err, ErrBadSignature):
					t.Errorf("line %d: forged (%s), but Verify says %v", d.Line, d.Forged, err)
				case d.Forged != "":
					forged++
				}
				if d.Forged != "" {
					continue
				}
				ev, err := ch.Decode([]byte(d.Value))
				if err != nil {
					t.Fatalf("line %d: %v", d.Line, err)
				}
				if ev.Amount == 0 {
					continue
				}
				altered := alterAmount(d.Value, ev.Amount)
				if altered == d.Value {
					t.Fatalf("line %d: could not alter the amount %d", d.Line, ev.Amount)
				}
				if err := ch.Verify([]byte(altered)); !errors.Is(err, ErrBadSignature) {
					t.Errorf("line %d: the amount altered, Verify says %v", d.Line, err)
				}
			}
			if forged == 0 {
				t.Error("no forged delivery in the stream")
			}
		})
	}
}

// alterAmount adds one to the first spelling of amount in v.
func alterAmount(v string, amount int64) string {
	for _, s := range []string{formatYuan(amount), itoa(amount)} {
		if i := strings.Index(v, s); i >= 0 {
			return v[:i] + "1" + v[i:]
		}
	}
	return v
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// TestResendsDifferOnlyInWhatTheFingerprintIgnores is the issue in data:
// the deliveries of one event all differ as payloads, and all have one key
// and one field fingerprint — but for a wrong notice and the genuine one
// behind it, two requests under one key.
func TestResendsDifferOnlyInWhatTheFingerprintIgnores(t *testing.T) {
	for _, name := range ChannelNames() {
		t.Run(name, func(t *testing.T) {
			sp := channelOf(t, name).spec()
			values := map[string]bool{}
			fps := map[string]string{}
			resent := 0
			for _, d := range load(t, name).Stream {
				if values[d.Value] {
					t.Errorf("line %d: a payload seen before", d.Line)
				}
				values[d.Value] = true
				if d.Forged != "" {
					continue
				}
				key, err := sp.keyOf([]byte(d.Value))
				if err != nil || key != d.Event {
					t.Fatalf("line %d: key %q (%v), the stream says %q", d.Line, key, err, d.Event)
				}
				fp, err := sp.fingerprintOf([]byte(d.Value))
				if err != nil {
					t.Fatal(err)
				}
				if first, ok := fps[key+"|"+d.Wrong]; !ok {
					fps[key+"|"+d.Wrong] = fp
				} else if fp != first {
					t.Errorf("line %d: %s has another fingerprint than its first delivery", d.Line, key)
				} else {
					resent++
				}
			}
			if resent == 0 {
				t.Error("no re-sends in the stream")
			}
		})
	}
}

func TestYuan(t *testing.T) {
	for s, want := range map[string]int64{"88.00": 8800, "0.01": 1, "12.5": 1250, "7": 700, "100000.99": 10000099} {
		if got, err := yuan(s); err != nil || got != want {
			t.Errorf("yuan(%q) = %d, %v; want %d", s, got, err, want)
		}
	}
	for _, s := range []string{"", ".5", "1.", "1.234", "-1.00", "1,00", "1e3"} {
		if _, err := yuan(s); !errors.Is(err, ErrBadCallback) {
			t.Errorf("yuan(%q): %v, want ErrBadCallback", s, err)
		}
	}
}

// TestConsumerReadsWhatTheGeneratorMeant: the consumer's key and fingerprint
// functions agree with the generator's reading of the fields: every
// delivery's key is its event, and two genuine deliveries have one
// fingerprint exactly when the generator says they carry the same request.
func TestConsumerReadsWhatTheGeneratorMeant(t *testing.T) {
	k := TestKeys()
	for _, ch := range []Channel{Alipay{Secret: k.Alipay}, WeChatPay{Secret: k.WeChatPay, Serial: k.WeChatPaySerial}, Stripe{Secret: k.Stripe}} {
		t.Run(ch.Name(), func(t *testing.T) {
			key, fingerprint := ch.Key(), ch.Fingerprint()
			sp := ch.(verifier).spec()
			byFields := map[string]dedup.Fingerprint{}
			byFP := map[dedup.Fingerprint]string{}
			for _, d := range load(t, ch.Name()).Stream {
				m := &consumer.Message{Value: []byte(d.Value)}
				if got, err := key(m); err != nil || got != d.Event {
					t.Errorf("line %d: key %q, %v; want %q", d.Line, got, err, d.Event)
				}
				if err := ch.Verify(m.Value); (err != nil) != (d.Forged != "") {
					t.Errorf("line %d (forged %q): Verify says %v", d.Line, d.Forged, err)
				}
				fp, err := fingerprint(m)
				if err != nil {
					t.Fatalf("line %d: %v", d.Line, err)
				}
				fields, err := sp.fingerprintOf(m.Value)
				if err != nil {
					t.Fatal(err)
				}
				if prev, ok := byFields[fields]; ok && prev != fp {
					t.Errorf("line %d: the same fields, another fingerprint", d.Line)
				}
				if prev, ok := byFP[fp]; ok && prev != fields {
					t.Errorf("line %d: other fields, the same fingerprint", d.Line)
				}
				byFields[fields], byFP[fp] = fp, fields
			}
		})
	}
}
