package wire_test

import (
	"encoding/hex"
	"errors"
	"strings"
	"testing"

	"github.com/idemkit/idem/consumer/source"
	"github.com/idemkit/idem/consumer/wire"
	"github.com/idemkit/idem/dedup"
)

func TestLetterRecord(t *testing.T) {
	m := &source.Message{Topic: "pay", Partition: 3, Offset: 42, ID: "pay/3/42", Lane: "pay/3", Attempt: 2,
		Value: []byte(`{"txn_id":"T1"}`),
		Headers: []source.Header{{Key: "trace", Value: []byte("t1")}, {Key: wire.MetaReason, Value: []byte("an earlier one")},
			{Key: wire.MetaCause, Value: []byte("validate")}, {Key: "idem-outbox-id", Value: []byte("0f1e")},
			{Key: "Traceparent", Value: []byte("the producer's")}, {Key: "tracestate", Value: []byte("the producer's")}}}
	fp := dedup.FingerprintOf(m.Value)
	l := wire.Letter{Message: m, Key: dedup.Key{Scope: "payments", ID: "T1"}, Fingerprint: fp, Cause: wire.CausePermanent,
		Reason: errors.New("bad\namount"), Attempts: 3, Headers: []source.Header{{Key: "traceparent", Value: []byte("the batch's")}, {Key: "tracestate"}}}
	headers, value := l.Record(1 << 20)
	got := map[string]string{}
	for _, h := range headers {
		if _, dup := got[h.Key]; dup {
			t.Errorf("header %s twice", h.Key)
		}
		got[h.Key] = string(h.Value)
	}
	want := map[string]string{
		"trace": "t1", "idem-outbox-id": "0f1e", wire.MetaReason: "bad amount", wire.MetaAttempts: "3", wire.MetaTopic: "pay",
		wire.MetaPartition: "3", wire.MetaLane: "pay/3", wire.MetaOffset: "42", wire.MetaMessageID: "pay/3/42",
		wire.MetaAttempt: "2", wire.MetaKeyScope: "payments", wire.MetaKey: "T1",
		wire.MetaCause: "permanent", wire.MetaFingerprint: hex.EncodeToString(fp[:]), "traceparent": "the batch's",
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
	if len(got) != len(want) || string(value) != string(m.Value) {
		t.Errorf("headers %v, value %q", got, value)
	}
	bigHeaders, bigValue := l.Record(4)
	var sum, size string
	for _, h := range bigHeaders {
		switch h.Key {
		case wire.MetaValueSHA256:
			sum = string(h.Value)
		case wire.MetaValueSize:
			size = string(h.Value)
		}
	}
	if bigValue != nil || len(sum) != 64 || size != "15" {
		t.Errorf("oversized: value %q, sha %q, size %q", bigValue, sum, size)
	}
	l.Key, l.Fingerprint = dedup.Key{}, dedup.Fingerprint{}
	hs, _ := l.Record(1 << 20)
	for _, h := range hs {
		if strings.HasPrefix(h.Key, "idem-key") || h.Key == wire.MetaFingerprint {
			t.Errorf("no key derived, yet %s", h.Key)
		}
	}
}

// TestLetterKeepsLineage: a redriven message dead-lettered again keeps its
// redrive count and origin; its other idem-* headers are replaced.
func TestLetterKeepsLineage(t *testing.T) {
	m := &source.Message{Topic: "pay", Value: []byte("x"), Headers: []source.Header{
		{Key: wire.MetaRedriveCount, Value: []byte("2")},
		{Key: wire.MetaRedrivenFrom, Value: []byte("pay.dlq/0/7")},
		{Key: wire.MetaReason, Value: []byte("old reason")},
	}}
	got := map[string][]string{}
	hs, _ := (wire.Letter{Message: m, Reason: errors.New("new reason")}).Record(1 << 20)
	for _, h := range hs {
		got[h.Key] = append(got[h.Key], string(h.Value))
	}
	if c := got[wire.MetaRedriveCount]; len(c) != 1 || c[0] != "2" {
		t.Errorf("redrive count %v", c)
	}
	if f := got[wire.MetaRedrivenFrom]; len(f) != 1 || f[0] != "pay.dlq/0/7" {
		t.Errorf("redriven from %v", f)
	}
	if r := got[wire.MetaReason]; len(r) != 1 || r[0] != "new reason" {
		t.Errorf("reason %v", r)
	}
}
