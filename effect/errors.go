package effect

import (
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/idem/dedup"
)

var (
	// ErrRefused: the provider refused the step's request and said that
	// nothing happened. The error is a *RefusedError with its answer.
	ErrRefused = errors.New("effect: the provider refused the request")
	// ErrUnknownOutcome: the step's outcome is not known yet (a timeout, a
	// reset, a 5xx, a read-back that failed or is not trusted yet). Do
	// marks it consumer.Retryable: a later run finds out.
	ErrUnknownOutcome = errors.New("effect: the outcome of the call is unknown")
	// ErrInDoubt: the step's outcome can no longer be found out nor the
	// request repeated safely. The error is an *InDoubtError marked
	// consumer.InDoubt: the message is dead-lettered with cause in_doubt.
	ErrInDoubt = errors.New("effect: the outcome of the call is in doubt")
	// ErrBusy: another holder's call of the step is in flight. Do marks it
	// consumer.Retryable.
	ErrBusy = errors.New("effect: the step is in flight elsewhere")
)

// RefusedError is a provider's refusal: Step.Call returns it (Refused) and
// Do returns it for that call and every later run of the step.
type RefusedError struct {
	Err    error  // the refusal as Call saw it; nil when read from the journal
	Result []byte // the provider's answer
	Reason string // Err's text, kept by the journal
}

// Refused says that the provider refused the request and that nothing
// happened (a definite 4xx: insufficient balance, refund exceeds the
// payment), with its answer. Return it from Step.Call: Do records the step
// as failed and never calls it again.
func Refused(err error, result []byte) error {
	if err == nil {
		err = errors.New("refused")
	}
	return &RefusedError{Err: err, Result: result, Reason: err.Error()}
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("effect: the provider refused the request: %s", e.Reason)
}
func (e *RefusedError) Unwrap() error        { return e.Err }
func (e *RefusedError) Is(target error) bool { return target == ErrRefused }

// InDoubtError is a step in doubt, with the facts an operator needs; its
// text is the dead letter's reason.
type InDoubtError struct {
	Ref               dedup.StepRef
	ProviderKey       string
	Attempts          int
	Token             int64
	SinceFirstAttempt time.Duration // the first attempt's age when the step was judged
	KeyTTL            time.Duration
	LastError         string // what made the outcome unknown
}

func (e *InDoubtError) Error() string {
	kept := "keeps no keys"
	if e.KeyTTL > 0 {
		kept = fmt.Sprintf("keeps keys %v", e.KeyTTL)
	}
	return fmt.Sprintf("effect: step %q of %s is in doubt (no read-back, and the provider %s): provider key %s, %d attempts, first attempt %v ago, last error: %s; find out from the provider, then resolve the step as succeeded or failed",
		e.Ref.Step, e.Ref.Key, kept, e.ProviderKey, e.Attempts, e.SinceFirstAttempt.Round(time.Millisecond), e.LastError)
}
func (e *InDoubtError) Is(target error) bool { return target == ErrInDoubt }
