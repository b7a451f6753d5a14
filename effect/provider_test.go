package effect_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/memstore"
	"github.com/idemkit/idem/effect"
	"github.com/idemkit/idem/internal/testenv/provider"
)

// TestAgainstTheSimulator runs steps against the provider simulator over
// real HTTP, on one clock for the journal and the provider's key TTL: a
// lost answer is never repeated once the provider forgot the key (in
// doubt without a read-back, resolved by one with it), and a request that
// never executed is repeated once the read-back says so. The provider's
// ledger is the truth.
func TestAgainstTheSimulator(t *testing.T) {
	clk := &clock{now: time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)}
	faults := map[string]provider.Fault{}
	p := provider.Start(t, provider.Config{KeyTTL: 10 * time.Minute, Now: clk.Now, Fault: func(r provider.Request) provider.Fault {
		f := faults[r.TradeNo]
		delete(faults, r.TradeNo) // the first request only
		return f
	}})
	journal := memstore.New(memstore.Config{Now: clk.Now})
	client := &provider.Client{URL: p.URL()}
	query := func(ctx context.Context, c effect.Call) (effect.ReadBack, error) {
		e, found, err := client.Query(ctx, c.ProviderKey)
		if err != nil || !found {
			return effect.ReadBack{}, err
		}
		return effect.ReadBack{Status: effect.Executed, Result: []byte(e.RefundID)}, nil
	}
	step := func(trade string, readBack bool) effect.Step {
		s := effect.Step{Name: "refund", KeyTTL: 10 * time.Minute, Lease: 30 * time.Second,
			Call: func(ctx context.Context, c effect.Call) ([]byte, error) {
				res, err := client.Refund(ctx, provider.Request{OutRequestNo: c.ProviderKey, TradeNo: trade, Amount: 10}, c.Token)
				var refusal *provider.Refusal
				if errors.As(err, &refusal) {
					return nil, effect.Refused(err, refusal.Body)
				}
				return res, err
			}}
		if readBack {
			s.ReadBack = query
		}
		return s
	}
	do := func(trade string, readBack bool) error {
		_, err := effect.DoKey(context.Background(), journal, dedup.Key{Scope: "refunds", ID: trade}, dedup.Fingerprint{}, step(trade, readBack))
		return err
	}
	cases := []struct {
		trade    string
		fault    provider.Fault
		readBack bool
		wait     time.Duration
		want     error // of the second run
		executed int
	}{
		{"kept", provider.DropAfterCommit, false, 5 * time.Minute, nil, 1},                     // repeated with the key: answered from it
		{"forgotten", provider.DropAfterCommit, false, 10 * time.Minute, effect.ErrInDoubt, 1}, // not repeated: the provider forgot the key
		{"read-back", provider.Error500AfterCommit, true, 10 * time.Minute, nil, 1},            // found out, not repeated
		{"never-ran", provider.Error500, true, 10 * time.Minute, nil, 1},                       // not found: repeated
		{"refused", provider.None, false, 0, effect.ErrRefused, 0},
	}
	for _, c := range cases {
		faults[c.trade] = c.fault
	}
	for _, c := range cases {
		t.Run(c.trade, func(t *testing.T) {
			if c.trade == "refused" {
				// An amount the provider refuses: nothing happens, and the
				// refusal is final.
				_, err := effect.DoKey(context.Background(), journal, dedup.Key{Scope: "refunds", ID: c.trade}, dedup.Fingerprint{}, effect.Step{Name: "refund",
					Call: func(ctx context.Context, call effect.Call) ([]byte, error) {
						_, err := client.Refund(ctx, provider.Request{OutRequestNo: call.ProviderKey, TradeNo: c.trade, Amount: -1}, call.Token)
						var refusal *provider.Refusal
						if errors.As(err, &refusal) {
							return nil, effect.Refused(err, refusal.Body)
						}
						return nil, err
					}})
				if !errors.Is(err, effect.ErrRefused) {
					t.Fatalf("Do = %v, want ErrRefused", err)
				}
			} else {
				if err := do(c.trade, c.readBack); !errors.Is(err, effect.ErrUnknownOutcome) {
					t.Fatalf("first run = %v, want an unknown outcome", err)
				}
				clk.Add(c.wait)
				if err := do(c.trade, c.readBack); !errors.Is(err, c.want) && (c.want != nil || err != nil) {
					t.Fatalf("second run = %v, want %v", err, c.want)
				}
			}
			n := 0
			for _, e := range p.Ledger() {
				if e.TradeNo == c.trade {
					n++
				}
			}
			if n != c.executed {
				t.Fatalf("the provider executed %q %d times, want %d", c.trade, n, c.executed)
			}
		})
	}
}
