package effect_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/memstore"
	"github.com/idemkit/idem/effect"
)

// A step is called once: the second run returns the stored answer.
// (Inside a consumer's handler, effect.Do takes the key from the message.)
func ExampleDoKey() {
	ctx := context.Background()
	journal := memstore.New(memstore.Config{})
	key := dedup.Key{Scope: "refunds", ID: "rf-1001"}
	calls := 0
	step := effect.Step{
		Name: "refund",
		Call: func(ctx context.Context, c effect.Call) ([]byte, error) {
			calls++
			return []byte("refunded under " + c.ProviderKey), nil
		},
	}
	for range 2 {
		answer, err := effect.DoKey(ctx, journal, key, dedup.Fingerprint{}, step)
		fmt.Println(string(answer), err)
	}
	fmt.Println("calls:", calls)
	// Output:
	// refunded under 5f55a9eabac19f2b48d94811b44fb38d <nil>
	// refunded under 5f55a9eabac19f2b48d94811b44fb38d <nil>
	// calls: 1
}

// A provider's definite refusal is stored like an answer: no later run
// calls again.
func ExampleRefused() {
	ctx := context.Background()
	journal := memstore.New(memstore.Config{})
	step := effect.Step{
		Name: "refund",
		Call: func(ctx context.Context, c effect.Call) ([]byte, error) {
			return nil, effect.Refused(errors.New("422 refund exceeds the payment"), []byte(`{"code":"REFUND_AMT_EXCEED"}`))
		},
	}
	_, err := effect.DoKey(ctx, journal, dedup.Key{Scope: "refunds", ID: "rf-1002"}, dedup.Fingerprint{}, step)
	var refused *effect.RefusedError
	fmt.Println(errors.Is(err, effect.ErrRefused), errors.As(err, &refused) && string(refused.Result) == `{"code":"REFUND_AMT_EXCEED"}`)
	// Output:
	// true true
}
