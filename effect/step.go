package effect

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/idem/dedup"
)

// DefaultLease is a Step's Lease when it has none.
const DefaultLease = 30 * time.Second

// A Step is one call a handler makes to a provider for a message. Its Name
// and ProviderKey must stay the same across deployments for as long as
// the journal keeps the step: they are how a later delivery finds it.
type Step struct {
	// Name names the step, unique within the handler ("refund",
	// "notify-merchant"); required.
	Name string
	// KeyTTL is how long the provider keeps idempotency keys (Stripe 24h,
	// Qonto 30m); 0: it keeps none. A request whose outcome is unknown is
	// repeated with the same key only while the first attempt is younger
	// than KeyTTL - Lease: the repeat must reach the provider while it
	// still knows the key, and may take up to Lease to get there.
	KeyTTL time.Duration
	// Lease is how long one call may take before another holder may
	// resolve it: longer than Call's own timeout. Default DefaultLease.
	Lease time.Duration
	// ReadBackLag is how long the provider's query may lag its executions:
	// a read-back's NotFound is trusted only once the last attempt is at
	// least this old. 0: its query never lags.
	ReadBackLag time.Duration
	// ProviderKey derives the key the step's requests carry (an
	// Idempotency-Key, Alipay's out_request_no, WeChat Pay's
	// out_refund_no) from the message's dedup key and the step's name.
	// Default DefaultProviderKey. It is called once per step: the journal
	// keeps the first one.
	ProviderKey func(k dedup.Key, step string) string
	// Call sends the request, with c.ProviderKey as its idempotency key
	// and c.Token as a fencing token if the provider checks one. nil: it
	// executed, the result is recorded and returned. Refused(err, result):
	// the provider said that nothing happened. Any other error: the
	// outcome is unknown. Required.
	Call func(ctx context.Context, c Call) ([]byte, error)
	// ReadBack asks the provider what happened to request c.ProviderKey
	// (Alipay's refund query, WeChat Pay's refund query, Stripe's list by
	// metadata). nil: the provider has no query; unknown outcomes are then
	// repeated only while it keeps keys.
	ReadBack func(ctx context.Context, c Call) (ReadBack, error)
}

// Call is what Step.Call and Step.ReadBack are given.
type Call struct {
	Ref         dedup.StepRef
	ProviderKey string
	// Token is the holder's fencing token, larger for every holder than
	// for any before it: a provider that remembers the largest token per
	// key and refuses smaller ones refuses a zombie holder's late request.
	Token int64
	// Attempt counts the step's requests, this one included (1 for the
	// first); for ReadBack, the requests sent so far.
	Attempt int
}

// Status is what a read-back found.
type Status uint8

const (
	// NotFound: the provider has no record of the request.
	NotFound Status = iota
	// Executed: the provider executed the request; Result is its answer.
	Executed
	// Declined: the provider has the request and refused it: nothing
	// happened; Result is its answer.
	Declined
)

func (s Status) String() string {
	switch s {
	case NotFound:
		return "not_found"
	case Executed:
		return "executed"
	case Declined:
		return "declined"
	default:
		return "invalid"
	}
}

// ReadBack is a provider's answer to "what happened to this request?".
type ReadBack struct {
	Status Status
	Result []byte
}

// DefaultProviderKey is a stable 32-character hex string of
// sha256(scope, id, step): the same for every delivery of a message, short
// and plain enough for Alipay's out_request_no (64) and WeChat Pay's
// out_refund_no (64, letters and digits).
func DefaultProviderKey(k dedup.Key, step string) string {
	h := sha256.New()
	for _, s := range []string{k.Scope, k.ID, step} {
		fmt.Fprintf(h, "%d:%s", len(s), s)
	}
	return hex.EncodeToString(h.Sum(nil))[:32]
}

func (s *Step) check() error {
	switch {
	case s.Name == "":
		return errors.New("effect: Step.Name is required")
	case s.Call == nil:
		return fmt.Errorf("effect: step %q: Step.Call is required", s.Name)
	case s.KeyTTL < 0:
		return fmt.Errorf("effect: step %q: Step.KeyTTL is negative (%v)", s.Name, s.KeyTTL)
	case s.Lease < 0:
		return fmt.Errorf("effect: step %q: Step.Lease is negative (%v)", s.Name, s.Lease)
	case s.ReadBackLag < 0:
		return fmt.Errorf("effect: step %q: Step.ReadBackLag is negative (%v)", s.Name, s.ReadBackLag)
	}
	return nil
}

func (s *Step) lease() time.Duration {
	if s.Lease == 0 {
		return DefaultLease
	}
	return s.Lease
}

// keyKept reports whether a repeat sent now still reaches the provider
// while it keeps the key of a step first attempted sinceFirst ago.
func (s *Step) keyKept(sinceFirst time.Duration) bool {
	return sinceFirst+s.lease() < s.KeyTTL
}
