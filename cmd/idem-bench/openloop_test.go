package main

import (
	"encoding/json"
	"testing"
	"time"
)

// An open-loop payload carries the time stamped into it, stays JSON with
// the fields the rows' handlers read, and keeps the key where the
// producer takes it; a closed-loop payload carries no time.
func TestOpenPayloadStamp(t *testing.T) {
	ps := openPayloads(3, 256)
	at := time.Date(2026, 12, 7, 16, 0, 0, 123456789, time.UTC)
	for i, p := range ps {
		if len(p) != 256 {
			t.Fatalf("payload %d is %d bytes, want 256", i, len(p))
		}
		if _, ok := producedAt(p); !ok {
			t.Fatalf("payload %d: no produce time before stamping: %s", i, p)
		}
		stamp(p, at.Add(time.Duration(i)))
		got, ok := producedAt(p)
		if !ok || !got.Equal(at.Add(time.Duration(i))) {
			t.Fatalf("payload %d: produced at %v, %v; want %v", i, got, ok, at.Add(time.Duration(i)))
		}
		var v struct {
			TxnID  string `json:"txn_id"`
			Amount int64  `json:"amount"`
		}
		if err := json.Unmarshal(p, &v); err != nil || v.TxnID != "T"+string(p[12:24]) || v.Amount == 0 {
			t.Fatalf("payload %d %s: %+v, %v", i, p, v, err)
		}
	}
	closed, _ := generate(settings{Messages: 1, Size: 256})
	if _, ok := producedAt(closed[0]); ok {
		t.Fatalf("closed-loop payload %s: a produce time found", closed[0])
	}
}

// A latency in an open-loop row runs from the produce time the payload
// carries, and the warm-up's messages are not timed.
func TestOpenLatencyFromProduceTime(t *testing.T) {
	t0 := time.Now()
	l := &latencies{produced: true, from: t0}
	ps := openPayloads(2, 128)
	stamp(ps[0], t0.Add(-time.Second)) // in the warm-up
	stamp(ps[1], t0.Add(10*time.Millisecond))
	l.sinceAt(ps[0], t0.Add(time.Hour), t0.Add(2*time.Second))
	l.sinceAt(ps[1], t0.Add(time.Hour), t0.Add(30*time.Millisecond))
	if len(l.d) != 1 || l.d[0] != 20*time.Millisecond {
		t.Fatalf("latencies %v, want [20ms]", l.d)
	}
}
