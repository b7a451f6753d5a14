package dedup

import (
	"context"
	"errors"
	"time"
)

// RequestStore is a Store whose key rows also hold a request's state,
// fencing token, lease and stored response (a consumer's rows leave them
// empty): one key space, one retention and one purge for consumers and
// requests. The HTTP Idempotency-Key middleware (package httpidem) runs on
// it; pgstore.Store and sqlitestore.Store implement it, and
// deduptest.RunRequests pins the contract down.
//
// Every method is safe for concurrent use. The stores' clocks, not the
// caller's, decide when a lease has run out.
//
// A lease is never shorter than the row that holds it: acquiring, taking
// over and extending a lease keep the key's row at least until the lease
// ends (its retention is lengthened when shorter), and the store's Purge
// never deletes a Processing key whose lease runs, whatever its retention.
// Tokens only grow: each one AcquireLease or ReleaseRequest gives a key is
// larger than every token the key had before — also when its row was
// purged and the key is claimed again — so that a holder that outlived its
// lease is refused on a later row too, by the store and by any system
// that checks the token.
type RequestStore[TTx any] interface {
	Store[TTx]

	// RunRequest runs a transactional request under c.Key. It looks at the
	// key without waiting for another request and, when the key is unknown
	// and no other transaction is executing it, calls fn in a transaction
	// that keeps others out of the key until it ends: fn's writes in tx,
	// the key — StateFinished with the StoredResponse fn returns, kept for
	// retention (≤ 0: for ever) — commit together, and the record's Verdict
	// is VerdictRun. When fn returns an error nothing commits, and
	// RunRequest returns that error (wrapped, when the connection was lost).
	// Otherwise fn is not called and the Verdict says why: VerdictReplay (a
	// response is stored), VerdictBusy (another transaction is executing
	// the key, or a lease on it runs), VerdictMismatch (the key is stored
	// with another fingerprint; Replay and Busy are only given for an equal
	// one). Should a writer that keeps no lock commit the key while fn
	// runs, fn's writes are rolled back and the Verdict is what the key
	// says then.
	RunRequest(ctx context.Context, c Claim, retention time.Duration,
		fn func(ctx context.Context, tx TTx) (StoredResponse, error)) (RequestRecord, error)

	// AcquireLease takes c.Key for a leased request, in a transaction of its
	// own, committed before it returns: VerdictRun for a new key (the key
	// and a StateProcessing record with a lease of the given length and a
	// fresh token), VerdictRun with Takeover set for a takeover of a
	// Processing key whose lease has run out (the token grows),
	// VerdictReplay, VerdictBusy (a lease still runs; see LeaseLeft) or
	// VerdictMismatch as for RunRequest. The key's row is kept for
	// retention, and at least as long as the lease.
	AcquireLease(ctx context.Context, c Claim, retention, lease time.Duration) (RequestRecord, error)
	// ExtendLease makes the lease of k run for lease from now, if token is
	// still the key's token and the key is Processing; otherwise it returns
	// ErrLeaseLost and changes nothing. The key's row is kept at least until
	// the extended lease ends. Time does not fence: a lease that ran out but
	// was not taken over (nor purged) can still be extended.
	ExtendLease(ctx context.Context, k Key, token int64, lease time.Duration) error
	// FinishLease stores res and makes k Finished, under the same condition
	// as ExtendLease; a stale token gets ErrLeaseLost: a zombie's late
	// write is refused by the store.
	FinishLease(ctx context.Context, k Key, token int64, res StoredResponse) error
	// EndLease ends the lease of k now, under the same condition: its
	// holder gives up without an outcome, and the next request takes over.
	EndLease(ctx context.Context, k Key, token int64) error

	// StuckRequests lists at most limit Processing keys whose lease has run
	// out, the longest expired first: crashed holders, uncertain outcomes no
	// request has retried.
	StuckRequests(ctx context.Context, limit int) ([]RequestRecord, error)
	// CountStuckRequests counts, by scope, the keys StuckRequests lists:
	// Processing keys whose lease has run out, without a limit. It reads
	// the Processing keys only (an index of them), so that a gauge may
	// call it at every collection.
	CountStuckRequests(ctx context.Context) (map[string]int64, error)
	// ReleaseRequest ends the lease of a Processing key and grows its token,
	// whatever its lease: the next request with the key takes over, and
	// the holder, should it be alive, is fenced out. With token above 0 it
	// does so only while the key's token is still token — the holder an
	// operator saw (StuckRequests), not one that took the key over since,
	// which it would fence out of a run that had just begun; with 0, it
	// releases whoever holds the key. It reports whether it released k.
	ReleaseRequest(ctx context.Context, k Key, token int64) (bool, error)
}

// Verdict says what a request may do with its key.
type Verdict uint8

const (
	// VerdictRun: the key is this request's (new, or taken over): run the
	// handler.
	VerdictRun Verdict = iota + 1
	// VerdictReplay: a response is stored under the key: send it again.
	VerdictReplay
	// VerdictBusy: another request holds the key, in an open transaction or
	// under a lease that still runs (HTTP: 409 Conflict).
	VerdictBusy
	// VerdictMismatch: the key was used for another request (another
	// fingerprint) (HTTP: 422 Unprocessable Content).
	VerdictMismatch
)

func (v Verdict) String() string {
	switch v {
	case VerdictRun:
		return "run"
	case VerdictReplay:
		return "replay"
	case VerdictBusy:
		return "busy"
	case VerdictMismatch:
		return "mismatch"
	default:
		return "invalid"
	}
}

// RequestState is where a request key stands.
type RequestState uint8

const (
	// StateProcessing: a leased request holds the key and has not stored
	// an outcome (it runs, it crashed, or its outcome was uncertain).
	StateProcessing RequestState = iota + 1
	// StateFinished: the response is stored and replayed to every retry.
	StateFinished
)

func (s RequestState) String() string {
	switch s {
	case StateProcessing:
		return "processing"
	case StateFinished:
		return "finished"
	default:
		return "invalid"
	}
}

// StoredResponse is a request's stored response.
type StoredResponse struct {
	Status int
	// Header holds the stored header fields as the middleware encodes them
	// (httpidem: a JSON array of [name, value] pairs); stores keep it as
	// bytes.
	Header []byte
	Body   []byte
}

// RequestRecord is a request key as the store found or left it.
type RequestRecord struct {
	Key     Key
	Verdict Verdict // set by RunRequest and AcquireLease
	State   RequestState
	// Token is the fencing token. Every lease of the key — new, taken
	// over, or after a release — has a larger one than all before it, also
	// after the key was purged and claimed again; a write with an older
	// token is refused. Compare tokens; their values mean nothing else (a
	// store draws them from a counter of its database). A transactional
	// key, which never had a lease, has token 1.
	Token int64
	// Takeover is set on AcquireLease's VerdictRun when the lease was taken
	// over from an earlier holder of the key (its lease ran out, or an
	// operator released it), whose outcome is unknown.
	Takeover bool
	// LeaseExpires is when a Processing key's lease runs out, by the store's
	// clock; LeaseLeft is how long that was from the store's now when the
	// record was read (negative once it has run out).
	LeaseExpires time.Time
	LeaseLeft    time.Duration
	// FirstAt is when the key was first claimed, by the store's clock.
	FirstAt time.Time
	// Response is the stored response of a Finished key.
	Response StoredResponse
}

// TakenOver reports whether the record's lease was taken over from an
// earlier holder (or released by an operator): that holder's outcome is
// unknown, and a handler should find out what it did before acting.
func (r RequestRecord) TakenOver() bool { return r.Takeover }

// ErrLeaseLost: the lease's token is no longer the key's — it was taken
// over after it ran out, or released — or the key is no longer Processing.
// The write was refused; the newer holder's outcome stands.
var ErrLeaseLost = errors.New("dedup: lease lost: the key was taken over or released")

// ErrNoRequestRecord: a key exists in the dedup table without a request's
// state — another entry point (a consumer) claimed it in the same scope.
// HTTP scopes start with the method and a space; a consumer's Name should
// not.
var ErrNoRequestRecord = errors.New("dedup: key exists without a request record")
