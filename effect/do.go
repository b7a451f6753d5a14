package effect

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/internal/shorten"
)

// finishTimeout bounds the recording of an outcome, which outlives the
// handler's context: an outcome known is worth recording even while the
// consumer stops.
const finishTimeout = 10 * time.Second

// Do runs step s of the message msg the consumer gave a handler, in the
// journal j, and returns the provider's result: see the package
// documentation for what it does on each delivery. The step's key and
// fingerprint are msg.DedupKey() and msg.DedupFingerprint(), the same on
// every delivery, retry copy and redrive.
//
// Its errors say what the consumer should do with the message, marked for
// it: ErrRefused (consumer.Permanent: the provider said nothing happened;
// a handler that records the refusal instead reads the *RefusedError and
// returns nil), ErrUnknownOutcome and ErrBusy (consumer.Retryable),
// ErrInDoubt (consumer.InDoubt: dead-lettered with cause in_doubt),
// dedup.ErrFingerprintMismatch (consumer.Reject: the step was begun under
// the key for another payload; dead-lettered with cause
// fingerprint_mismatch, the provider not called, the key left free). A
// journal's own errors are returned as they are.
func Do(ctx context.Context, j dedup.Journal, msg *consumer.Message, s Step) ([]byte, error) {
	k, ok := msg.DedupKey()
	if !ok {
		return nil, fmt.Errorf("effect: step %q: the message has no dedup key (Do needs a message a consumer keyed; use DoKey otherwise)", s.Name)
	}
	fp, _ := msg.DedupFingerprint()
	return DoKey(ctx, j, k, fp, s)
}

// DoKey is Do for a step of whatever k identifies: an HTTP request's key
// (httpidem), a job's. k must be the same every time the work is retried.
// fp is the fingerprint of what the work was asked with (the request's
// body): a step the journal keeps for another non-zero fingerprint is
// refused with dedup.ErrFingerprintMismatch instead of answered with
// another request's result. The zero Fingerprint is none: no check.
func DoKey(ctx context.Context, j dedup.Journal, k dedup.Key, fp dedup.Fingerprint, s Step) ([]byte, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	ref := dedup.StepRef{Key: k, Step: s.Name}
	derive := s.ProviderKey
	if derive == nil {
		derive = DefaultProviderKey
	}
	rec, err := j.BeginStep(ctx, ref, derive(k, s.Name), fp, s.lease())
	if err != nil {
		return nil, err
	}
	r := run{j: j, s: &s, rec: rec}
	switch rec.Verdict {
	case dedup.StepCall:
		return r.call(ctx)
	case dedup.StepResolve:
		return r.resolve(ctx)
	case dedup.StepMismatch:
		return nil, consumer.Reject(fmt.Errorf("%w: step %q of %s was begun for another payload (fingerprint %s, this one's %s); its outcome is not this request's, and the provider was not called",
			dedup.ErrFingerprintMismatch, s.Name, k, rec.Fingerprint, fp))
	case dedup.StepBusy:
		return nil, consumer.Retryable(fmt.Errorf("%w: step %q of %s, for %v more", ErrBusy, s.Name, k, rec.LeaseLeft.Round(time.Millisecond)))
	case dedup.StepDone:
		switch rec.State {
		case dedup.StepSucceeded:
			return rec.Result, nil
		case dedup.StepFailed:
			return nil, consumer.Permanent(&RefusedError{Result: rec.Result, Reason: rec.Error})
		case dedup.StepInDoubt:
			return nil, r.inDoubt(rec.Error)
		}
	}
	return nil, fmt.Errorf("effect: step %q of %s: the journal answered %v with state %v", s.Name, k, rec.Verdict, rec.State)
}

// then joins an attempt's error and what a later read-back found, in the
// step's recorded Error.
const then = "; then "

// run is one holder's turn at a step.
type run struct {
	j   dedup.Journal
	s   *Step
	rec dedup.StepRecord
}

func (r *run) c() Call {
	return Call{Ref: r.rec.Ref, ProviderKey: r.rec.ProviderKey, Token: r.rec.Token, Attempt: r.rec.Attempts}
}

// call sends a request the journal recorded as about to leave, and
// records its outcome.
func (r *run) call(ctx context.Context) ([]byte, error) {
	res, err := r.s.Call(ctx, r.c())
	var refused *RefusedError
	switch {
	case err == nil:
		return res, r.finish(ctx, dedup.StepOutcome{State: dedup.StepSucceeded, Result: res}, nil)
	case errors.As(err, &refused):
		return nil, r.finish(ctx, dedup.StepOutcome{State: dedup.StepFailed, Result: refused.Result, Error: shorten.Reason(refused.Reason)}, consumer.Permanent(err))
	default:
		return nil, r.unknown(ctx, fmt.Sprintf("attempt %d: %v", r.rec.Attempts, err), err)
	}
}

// resolve finds out what an earlier attempt did, and repeats it only when
// that is safe.
func (r *run) resolve(ctx context.Context) ([]byte, error) {
	last, _, _ := strings.Cut(r.rec.Error, then) // the attempt's error, without the last read-back's
	if last == "" {
		last = fmt.Sprintf("attempt %d: its holder's lease ran out mid-call", r.rec.Attempts)
	}
	if r.s.ReadBack != nil {
		rb, err := r.s.ReadBack(ctx, r.c())
		switch {
		case err != nil:
			// The query failed: nothing is learnt, and waiting may teach.
			if !r.s.keyKept(r.rec.SinceFirstAttempt) {
				err = fmt.Errorf("read-back: %w", err)
				return nil, r.unknown(ctx, last+then+err.Error(), err)
			}
		case rb.Status == Executed:
			return rb.Result, r.finish(ctx, dedup.StepOutcome{State: dedup.StepSucceeded, Result: rb.Result}, nil)
		case rb.Status == Declined:
			refused := &RefusedError{Result: rb.Result, Reason: "read-back: the provider declined request " + r.rec.ProviderKey}
			return nil, r.finish(ctx, dedup.StepOutcome{State: dedup.StepFailed, Result: rb.Result, Error: refused.Reason}, consumer.Permanent(refused))
		case rb.Status == NotFound && r.rec.SinceLastAttempt >= r.s.ReadBackLag:
			return r.repeat(ctx)
		case rb.Status == NotFound:
			// Not found yet, and the query may lag: trusted later.
			if !r.s.keyKept(r.rec.SinceFirstAttempt) {
				err := fmt.Errorf("read-back found nothing %v after the last attempt, and the provider's query may lag %v",
					r.rec.SinceLastAttempt.Round(time.Millisecond), r.s.ReadBackLag)
				return nil, r.unknown(ctx, last+then+err.Error(), err)
			}
		default:
			err := fmt.Errorf("read-back returned status %d", rb.Status)
			return nil, r.unknown(ctx, last+then+err.Error(), err)
		}
	}
	if r.s.keyKept(r.rec.SinceFirstAttempt) {
		return r.repeat(ctx)
	}
	return nil, r.finish(ctx, dedup.StepOutcome{State: dedup.StepInDoubt, Error: last}, r.inDoubt(last))
}

// repeat records another attempt, then sends it with the same provider key.
func (r *run) repeat(ctx context.Context) ([]byte, error) {
	rec, err := r.j.AttemptStep(ctx, r.rec.Ref, r.rec.Token, r.s.lease())
	if err != nil {
		if errors.Is(err, dedup.ErrLeaseLost) {
			return nil, consumer.Retryable(fmt.Errorf("effect: step %q of %s: not repeated: %w", r.s.Name, r.rec.Ref.Key, err))
		}
		return nil, err
	}
	rec.Verdict = r.rec.Verdict
	r.rec = rec
	return r.call(ctx)
}

// unknown records that the outcome is still unknown, and why (kept for the
// next holder and for operators), and returns the error the consumer
// retries.
func (r *run) unknown(ctx context.Context, why string, err error) error {
	return r.finish(ctx, dedup.StepOutcome{State: dedup.StepUnknown, Error: shorten.Reason(why)},
		consumer.Retryable(fmt.Errorf("%w: step %q of %s (provider key %s, attempt %d): %w", ErrUnknownOutcome, r.s.Name, r.rec.Ref.Key, r.rec.ProviderKey, r.rec.Attempts, err)))
}

// finish records out under this holder's token and returns ret; when the
// journal refuses the token, this holder's outcome is dropped and the
// error says so.
func (r *run) finish(ctx context.Context, out dedup.StepOutcome, ret error) error {
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finishTimeout)
	defer cancel()
	err := r.j.FinishStep(fctx, r.rec.Ref, r.rec.Token, out)
	switch {
	case err == nil:
		return ret
	case errors.Is(err, dedup.ErrLeaseLost):
		return consumer.Retryable(fmt.Errorf("effect: step %q of %s: this holder's outcome (%s) was dropped, a newer holder decides: %w",
			r.s.Name, r.rec.Ref.Key, out.State, err))
	default:
		return fmt.Errorf("effect: step %q of %s: recording the outcome (%s): %w", r.s.Name, r.rec.Ref.Key, out.State, err)
	}
}

func (r *run) inDoubt(last string) error {
	return consumer.InDoubt(&InDoubtError{Ref: r.rec.Ref, ProviderKey: r.rec.ProviderKey, Attempts: r.rec.Attempts, Token: r.rec.Token,
		SinceFirstAttempt: r.rec.SinceFirstAttempt, KeyTTL: r.s.KeyTTL, LastError: last})
}
