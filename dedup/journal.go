package dedup

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// The effect journal records the calls a handler makes to systems outside
// the store's database — a payment provider's refund API, a bank's payout —
// one row per step of a message: (the message's Key, the step's name). It
// is what lets a call whose outcome is unknown (a timeout, a reset
// connection, a 5xx after the work was done, a process killed mid-call) be
// resolved instead of repeated blindly. Package effect drives it from
// handlers; operators read and resolve it with the idem command.
//
// The discipline, which every Journal keeps:
//   - The intent is durable before the request leaves the process:
//     BeginStep and AttemptStep commit, in transactions of their own,
//     before they return.
//   - One holder at a time: BeginStep gives the step a lease with a
//     fencing token; a later holder (after the lease ran out, or after an
//     unknown outcome) gets a larger token, and the store refuses every
//     write with an older one (ErrLeaseLost). The token goes to the
//     provider too, which may refuse a zombie by it.
//   - The outcome is recorded as soon as it is known (FinishStep): a
//     succeeded or failed step is never called again, and every later
//     BeginStep returns its stored result.
//   - A step answers only the request that began it: it keeps the
//     fingerprint of that request's payload, and a later BeginStep under
//     the same key with another fingerprint is told StepMismatch — never
//     the first request's result, never a lease. A key that stayed free
//     (the handler rejected its message after the step, or the step went
//     in doubt) may come back with another payload.

// StepRef names one step of a message: the message's dedup key and the
// step's name, unique within the message's handler.
type StepRef struct {
	Key  Key
	Step string
}

// Validate reports whether r names a step: a valid key and a step name of
// 1 to 200 bytes.
func (r StepRef) Validate() error {
	if err := r.Key.Validate(); err != nil {
		return err
	}
	if r.Step == "" || len(r.Step) > 200 {
		return errors.New("dedup: a step's name must be 1 to 200 bytes")
	}
	return nil
}

// StepState is where a step stands.
type StepState uint8

const (
	// StepPending: the intent is recorded and a holder's lease runs — the
	// call may be in flight. A pending step whose lease ran out is a
	// holder that died mid-call: its outcome is unknown.
	StepPending StepState = iota + 1
	// StepSucceeded: the provider executed the request; Result holds its
	// answer.
	StepSucceeded
	// StepFailed: the provider refused the request and said that nothing
	// happened (a definite 4xx); Result holds its answer.
	StepFailed
	// StepUnknown: the last attempt's outcome is unknown (timeout, reset,
	// 5xx, no answer); no lease runs. The next holder must find out what
	// happened before it repeats anything.
	StepUnknown
	// StepInDoubt: the outcome stayed unknown and may no longer be found
	// out or repeated safely (the provider no longer keeps the request's
	// key); the message was dead-lettered for an operator, who resolves the
	// step (ResolveStep) as succeeded or failed.
	StepInDoubt
)

// Valid reports whether s is one of the states above.
func (s StepState) Valid() bool { return s >= StepPending && s <= StepInDoubt }

func (s StepState) String() string {
	switch s {
	case StepPending:
		return "pending"
	case StepSucceeded:
		return "succeeded"
	case StepFailed:
		return "failed"
	case StepUnknown:
		return "unknown"
	case StepInDoubt:
		return "in_doubt"
	default:
		return "invalid"
	}
}

// ParseStepState returns the state String names.
func ParseStepState(s string) (StepState, error) {
	for st := StepPending; st <= StepInDoubt; st++ {
		if st.String() == s {
			return st, nil
		}
	}
	return 0, errors.New("dedup: unknown step state " + `"` + s + `"` + " (want pending, succeeded, failed, unknown or in_doubt)")
}

// StepVerdict says what the caller of BeginStep may do.
type StepVerdict uint8

const (
	// StepCall: the step is new; its intent is recorded with attempt 1 and
	// a lease: call the provider.
	StepCall StepVerdict = iota + 1
	// StepDone: the step is succeeded, failed or in doubt; Record says
	// which and holds its result. Do not call.
	StepDone
	// StepBusy: another holder's lease runs; try again later.
	StepBusy
	// StepResolve: an earlier attempt's outcome is unknown (it said so, or
	// its holder's lease ran out); this caller now holds the step with a
	// larger token. Find out what happened (read back) before any repeat,
	// and record another attempt (AttemptStep) before a repeat leaves.
	StepResolve
	// StepMismatch: the step was begun for another payload under the same
	// key (Record.Fingerprint is its fingerprint, not the caller's); its
	// result is not the caller's to use. Nothing changed and no lease was
	// taken. Do not call; refuse the request (ErrFingerprintMismatch).
	StepMismatch
)

func (v StepVerdict) String() string {
	switch v {
	case StepCall:
		return "call"
	case StepDone:
		return "done"
	case StepBusy:
		return "busy"
	case StepResolve:
		return "resolve"
	case StepMismatch:
		return "mismatch"
	default:
		return "invalid"
	}
}

// StepRecord is a step as the store found or left it. Times are the
// store's clock; the durations were computed by it when the record was
// read.
type StepRecord struct {
	Ref     StepRef
	Verdict StepVerdict // set by BeginStep
	State   StepState
	// ProviderKey is the idempotency key the step's requests carry, fixed
	// at the first BeginStep and the same on every attempt.
	ProviderKey string
	// Fingerprint is the fingerprint of the payload of the request that
	// began the step, fixed at the first BeginStep; zero: it was begun
	// without one.
	Fingerprint Fingerprint
	// Attempts counts the requests recorded as about to leave (BeginStep's
	// first, then AttemptStep's).
	Attempts int
	// Token is the current holder's fencing token: larger for every holder
	// than for any before it. Compare tokens; their values mean nothing
	// else.
	Token int64
	// LeaseExpires is when a pending step's lease runs out; LeaseLeft is
	// how long that was from the store's now (negative once run out).
	LeaseExpires time.Time
	LeaseLeft    time.Duration
	// FirstAttemptAt is when the first request was recorded: a provider
	// keeps the step's key for a limited time from about then.
	// SinceFirstAttempt and SinceLastAttempt are the ages of the first and
	// the latest attempt.
	FirstAttemptAt    time.Time
	LastAttemptAt     time.Time
	SinceFirstAttempt time.Duration
	SinceLastAttempt  time.Duration
	// Result is the provider's answer of a succeeded or failed step (or
	// the reference an operator resolved it with).
	Result []byte
	// Error is what made the outcome unknown or the step in doubt, or
	// whom an operator's resolution came from.
	Error string
	// UpdatedAt is when the step last changed.
	UpdatedAt time.Time
}

// StepOutcome is what FinishStep and ResolveStep record.
type StepOutcome struct {
	// State is StepSucceeded, StepFailed, StepUnknown or StepInDoubt
	// (FinishStep); StepSucceeded or StepFailed (ResolveStep).
	State  StepState
	Result []byte // the provider's answer (succeeded, failed)
	Error  string // why unknown or in doubt; who resolved it (operators)
}

// StepFilter selects steps for operators, and for the consumer, which
// lists a stale event's steps by its key.
type StepFilter struct {
	// States selects steps in these states; empty: the unresolved ones
	// (unknown, in doubt, and pending steps whose lease ran out).
	States []StepState
	Scope  string // exact; empty: every scope
	// Key selects the steps of one message: its key's ID within Scope,
	// exact; empty: every key. It requires Scope.
	Key   string
	Limit int // at most this many, the oldest first attempt first; 0: 100
}

// Validate reports whether f can be used: known states, and Scope with
// Key.
func (f StepFilter) Validate() error {
	for _, st := range f.States {
		if !st.Valid() {
			return fmt.Errorf("dedup: step filter: no state %d", st)
		}
	}
	if f.Key != "" && f.Scope == "" {
		return errors.New("dedup: step filter: Key needs Scope (a key's ID is unique only within its scope)")
	}
	return nil
}

// ErrNoJournal: the store keeps no effect journal in its configuration
// (pgstore with Distributed), though its type implements Journal. Such a
// store has no steps; every Journal method returns an error wrapping
// ErrNoJournal.
var ErrNoJournal = errors.New("dedup: the store keeps no effect journal")

// Journal is the effect journal of a store. Every method runs in a
// transaction of its own, committed before it returns, and is safe for
// concurrent use. pgstore, sqlitestore, mysqlstore and memstore implement
// it; deduptest.RunJournal pins the contract down.
//
// A succeeded or failed step lives exactly as long as its message's key
// row: a store's Purge deletes it together with that row (in the same
// transaction, or with the partition that held the row), never before. A
// step whose key has no row — its message never committed: the handler
// rejected it after the step, its retries ran out — is never purged: it
// stays, answering a re-send or a redrive, and operators list it
// (Steps with States succeeded or failed; idem effects --state). An
// unknown, in-doubt or pending step is never purged either.
type Journal interface {
	// BeginStep takes ref for one call, committed before it returns:
	//   - a new step: State StepPending, Attempts 1, providerKey and fp
	//     kept, a lease of the given length and a fresh token; StepCall;
	//   - a step kept with a non-zero fingerprint other than a non-zero
	//     fp, in whatever state: StepMismatch with the record, nothing
	//     changed, no lease taken (checked before everything below);
	//   - a succeeded, failed or in-doubt step: StepDone with the record;
	//   - a pending step whose lease runs: StepBusy (LeaseLeft says how
	//     long it runs);
	//   - an unknown step, or a pending one whose lease ran out: the step
	//     stays as it is (State and Attempts unchanged: StepPending
	//     reports a holder that died mid-call) under a new lease and a
	//     larger token; StepResolve.
	// providerKey and fp are only stored for a new step; the record
	// carries the stored ones. fp is the fingerprint of the payload of the
	// request the step is begun for; the zero Fingerprint is none, and a
	// zero fp, or a step kept with none, never mismatches.
	BeginStep(ctx context.Context, ref StepRef, providerKey string, fp Fingerprint, lease time.Duration) (StepRecord, error)
	// AttemptStep records that the holder of token is about to send
	// another request (a repeat with the same provider key), committed
	// before it returns: Attempts grows by one, LastAttemptAt is now, the
	// state is StepPending with a lease of the given length from now.
	// ErrLeaseLost when token is no longer the step's or the step is
	// succeeded, failed or in doubt.
	AttemptStep(ctx context.Context, ref StepRef, token int64, lease time.Duration) (StepRecord, error)
	// FinishStep records the outcome of the holder of token and ends its
	// lease: StepSucceeded or StepFailed with the provider's answer (final:
	// every later BeginStep returns it), StepUnknown (the next BeginStep
	// resolves it at once), StepInDoubt (final until an operator resolves
	// it). ErrLeaseLost when token is no longer the step's or the step is
	// succeeded, failed or in doubt.
	FinishStep(ctx context.Context, ref StepRef, token int64, out StepOutcome) error
	// ResolveStep is an operator's resolution of an unresolved step
	// (unknown, in doubt, or pending with its lease run out) as
	// StepSucceeded or StepFailed; the token grows, fencing out any holder.
	// With token above 0 it resolves only while the step's token is still
	// token — the step the operator saw; with 0, whatever holds it. It
	// reports whether it resolved the step; a step that is succeeded,
	// failed, or pending under a running lease is left alone (false).
	ResolveStep(ctx context.Context, ref StepRef, token int64, out StepOutcome) (bool, error)
	// Step returns ref's record, and false when the journal has none.
	Step(ctx context.Context, ref StepRef) (StepRecord, bool, error)
	// Steps lists steps for operators, the oldest first attempt first.
	Steps(ctx context.Context, f StepFilter) ([]StepRecord, error)
	// CountSteps counts steps by state, with pending steps whose lease
	// ran out counted apart (expiredPending), for gauges: it may be
	// called at every collection.
	CountSteps(ctx context.Context) (byState map[StepState]int64, expiredPending int64, err error)
}

// TxSteps is a Journal that also reads steps in a transaction of its
// Store. The consumer reads the steps of a batch's stale events with it
// (Config.Entity), in the batch's own transaction: reading them through
// Steps, which takes a connection of its own while the batch's
// transaction holds one, stalls every lane once as many lanes as the pool
// has connections meet stale events at once. pgstore, sqlitestore,
// mysqlstore and memstore implement it; deduptest.RunTxSteps pins the
// contract down.
type TxSteps[TTx any] interface {
	Journal
	// LiveSteps returns, read in tx in one statement for all of keys, the
	// steps of keys that are not failed (pending, succeeded, unknown or
	// in doubt): for each key the records Steps lists for
	// StepFilter{Scope, Key, States: those four}, at most 100 of a key,
	// the oldest first attempt first; a key given twice is listed once;
	// the order between keys is not given. It sees at least every step
	// committed before tx began (the journal commits each step in a
	// transaction of its own). No keys: nil, and no statement. An error wrapping
	// ErrNoJournal: the store keeps no journal, and tx is untouched. After
	// any other error tx may be unusable (Postgres aborts it): roll it
	// back.
	LiveSteps(ctx context.Context, tx TTx, keys []Key) ([]StepRecord, error)
}

// LiveStepsPerKey is the most records TxSteps.LiveSteps returns for one
// key.
const LiveStepsPerKey = 100
