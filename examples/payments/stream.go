package payments

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
)

// Stream is a generated run of payment callbacks with the duplicates a real
// channel produces, and the bad messages a real queue carries.
type Stream struct {
	Orders   []Order
	Payloads [][]byte   // in send order, duplicates and bad messages included
	Expected []Expected // every valid payment, once
	// What was mixed in:
	GatewayRetries int // the same callback sent again right away
	ChannelResends int // the channel re-sending a callback later (three times)
	Bad            int // invalid JSON, missing txn_id, oversized
	Conflicting    int // an earlier txn_id with another amount (fingerprint mismatch)
}

// MaxPayload is the payload limit the examples configure; the stream's
// oversized messages exceed it.
const MaxPayload = 64 << 10

// Generate builds a stream of n payments, reproducible from seed.
func Generate(n int, seed uint64) Stream {
	rng := rand.New(rand.NewPCG(seed, seed^0x5eed))
	var s Stream
	channels := []string{"wechat", "alipay", "card"}
	for i := range n {
		o := Order{
			ID:      fmt.Sprintf("O-%06d", i),
			Account: fmt.Sprintf("merchant-%02d", rng.IntN(20)),
			SKU:     fmt.Sprintf("sku-%03d", rng.IntN(50)),
			Amount:  int64(100 + rng.IntN(100000)),
		}
		s.Orders = append(s.Orders, o)
		cb := Callback{TxnID: fmt.Sprintf("420000%010d", i), OrderID: o.ID, Amount: o.Amount, Channel: channels[rng.IntN(len(channels))], Status: "SUCCESS"}
		s.Expected = append(s.Expected, Expected{TxnID: cb.TxnID, Amount: cb.Amount})
		p, _ := json.Marshal(cb)
		s.Payloads = append(s.Payloads, p)
		switch r := rng.IntN(100); {
		case r < 10: // gateway retry: the same body, right behind
			s.Payloads = append(s.Payloads, p)
			s.GatewayRetries++
		case r < 15: // the channel re-sends its callback three times, later
			s.ChannelResends++
			for range 3 {
				at := len(s.Payloads) - rng.IntN(min(len(s.Payloads), 50))
				s.Payloads = append(s.Payloads[:at], append([][]byte{reformat(p)}, s.Payloads[at:]...)...)
			}
		}
	}
	// Bad messages, spread over the stream.
	bad := func(p []byte) {
		at := rng.IntN(len(s.Payloads) + 1)
		s.Payloads = append(s.Payloads[:at], append([][]byte{p}, s.Payloads[at:]...)...)
	}
	for i := 0; i < max(1, n/200); i++ {
		bad([]byte(`{"txn_id":"4200` + fmt.Sprint(i) + `","order_id":`)) // truncated JSON
		bad([]byte(`{"order_id":"O-000000","amount":100,"status":"SUCCESS"}`))
		bad([]byte(`{"txn_id":"big-` + fmt.Sprint(i) + `","pad":"` + strings.Repeat("x", MaxPayload) + `"}`))
		s.Bad += 3
		// An earlier transaction number with another amount: must not pay.
		e := s.Expected[rng.IntN(len(s.Expected))]
		o := s.Orders[indexOf(s.Expected, e.TxnID)]
		p, _ := json.Marshal(Callback{TxnID: e.TxnID, OrderID: o.ID, Amount: e.Amount + 1, Channel: "card", Status: "SUCCESS"})
		s.Payloads = append(s.Payloads, p)
		s.Conflicting++
	}
	return s
}

// reformat spells the same callback differently (key order, spacing), as a
// channel re-sending it from another server may: the fingerprint is the same.
func reformat(p []byte) []byte {
	var m map[string]any
	_ = json.Unmarshal(p, &m)
	out, _ := json.MarshalIndent(m, "", "  ")
	return out
}

func indexOf(es []Expected, txn string) int {
	for i, e := range es {
		if e.TxnID == txn {
			return i
		}
	}
	return -1
}

// PartitionKey is the record key a producer should send a callback with: its
// order ID, so that all callbacks of one order land on one partition, in
// order. A payload without one gets "".
func PartitionKey(payload []byte) string {
	var cb struct {
		OrderID string `json:"order_id"`
	}
	_ = json.Unmarshal(payload, &cb)
	return cb.OrderID
}
