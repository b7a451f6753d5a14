package main

import (
	"encoding/json"
	"testing"

	kafkago "github.com/segmentio/kafka-go"
)

// The payloads' trades: each trade's events lie on one partition, in the
// prefill's order there each new event's seq is above the trade's highest
// so far or, for about the stale share, equal to it (a re-sent event),
// and never below it; a repeated payload is a copy of an earlier one.
func TestGenerateTrades(t *testing.T) {
	s := settings{Messages: 20000, Size: 256, Partitions: 8, DupRate: 0.10, Entities: 800, StaleRate: 0.05}
	payloads, unique := generate(s)
	var balancer kafkago.Hash
	parts := []int{0, 1, 2, 3, 4, 5, 6, 7}
	type mark struct {
		part int
		seq  int64
	}
	top := map[string]mark{}
	seen := map[string]bool{}
	stale, fresh := 0, 0
	for i, p := range payloads {
		if len(p) != s.Size {
			t.Fatalf("payload %d is %d bytes, want %d", i, len(p), s.Size)
		}
		var ev struct {
			TxnID string `json:"txn_id"`
			Trade string `json:"trade"`
			Seq   int64  `json:"seq"`
		}
		if err := json.Unmarshal(p, &ev); err != nil || ev.Trade == "" {
			t.Fatalf("payload %d %s: %+v, %v", i, p, ev, err)
		}
		if seen[ev.TxnID] {
			continue // a repeated payload
		}
		seen[ev.TxnID] = true
		part := balancer.Balance(kafkago.Message{Key: p[11:24]}, parts...)
		m, ok := top[ev.Trade]
		switch {
		case !ok:
			top[ev.Trade] = mark{part, ev.Seq}
			fresh++
		case m.part != part:
			t.Fatalf("trade %s on partitions %d and %d", ev.Trade, m.part, part)
		case ev.Seq == m.seq:
			stale++
		case ev.Seq > m.seq:
			top[ev.Trade] = mark{part, ev.Seq}
			fresh++
		default:
			t.Fatalf("trade %s: seq %d below its highest %d", ev.Trade, ev.Seq, m.seq)
		}
	}
	if fresh+stale != unique || len(top) != s.Entities {
		t.Fatalf("%d fresh + %d stale events of %d trades, want %d events of %d", fresh, stale, len(top), unique, s.Entities)
	}
	if share := float64(stale) / float64(unique); share < 0.03 || share > 0.06 {
		t.Fatalf("%.3f of the events stale, want about %.2f", share, s.StaleRate)
	}
}
