package httpidem

import (
	"context"
	"sync"
	"time"

	"github.com/idemkit/idem/dedup"
)

// leaseStore is what a Lease needs of its store.
type leaseStore interface {
	ExtendLease(ctx context.Context, k dedup.Key, token int64, lease time.Duration) error
	EndLease(ctx context.Context, k dedup.Key, token int64) error
}

// A Lease is a leased request's hold on its key: the handler of a Leased
// route finds it with LeaseFrom. The key is committed as Processing with
// the lease's token before the handler runs; other requests with the key
// get 409 until the handler's response is stored, or until the lease runs
// out and one of them takes the key over with a larger token. From then on
// the store refuses this lease's writes (dedup.ErrLeaseLost).
//
// Effects outside the store's database cannot be fenced by the store: pass
// Key and Token to the system that performs them (the key as its
// idempotency key, the token as a fencing token it checks), and when
// TakenOver reports true, find out what the earlier holder did first. The
// effect package does all of that with the effect journal:
//
//	res, err := effect.DoKey(ctx, journal, l.Key(), l.Fingerprint(), step)
//
// journals the call under the request's key, hands the provider a key
// derived from it, and reads back before it repeats a call whose outcome is
// unknown (docs/effects.md).
type Lease struct {
	store     leaseStore
	key       dedup.Key
	fp        dedup.Fingerprint
	token     int64
	takenOver bool
	lease     time.Duration
	mu        sync.Mutex
	ended     bool
	expires   time.Time // by this process's clock
}

type leaseKey struct{}

// LeaseFrom returns the lease of a leased request's context, or nil when
// the request has none (a keyless request of an Optional route). A nil
// Lease's methods do nothing and return nil.
func LeaseFrom(ctx context.Context) *Lease {
	l, _ := ctx.Value(leaseKey{}).(*Lease)
	return l
}

// Key is the request's key: its scope (method, route, tenant) and ID.
func (l *Lease) Key() dedup.Key {
	if l == nil {
		return dedup.Key{}
	}
	return l.key
}

// Fingerprint is the request's fingerprint, the one its key was claimed
// with (the route's Fingerprint over the body, with the method, route and
// path values). A step journaled with it refuses to run for a request
// with other content under the same key.
func (l *Lease) Fingerprint() dedup.Fingerprint {
	if l == nil {
		return dedup.Fingerprint{}
	}
	return l.fp
}

// Token is the fencing token: larger for every lease of the key than for
// any before it — takeovers, releases, and a key purged and claimed again
// included. Compare tokens; their values mean nothing else.
func (l *Lease) Token() int64 {
	if l == nil {
		return 0
	}
	return l.token
}

// TakenOver reports whether an earlier request held the key and left no
// outcome (it crashed, answered 5xx, or was released by an operator): its
// effects may or may not have happened.
func (l *Lease) TakenOver() bool { return l != nil && l.takenOver }

// Expires is when the lease runs out, as the last acquisition or Extend set
// it, on this process's clock (the store decides by its own).
func (l *Lease) Expires() time.Time {
	if l == nil {
		return time.Time{}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.expires
}

// Extend makes the lease run for d from now (the route's Lease when d ≤ 0).
// It fails with dedup.ErrLeaseLost once the key was taken over or released: stop
// then, and do not perform further effects.
func (l *Lease) Extend(ctx context.Context, d time.Duration) error {
	if l == nil {
		return nil
	}
	if d <= 0 {
		d = l.lease
	}
	if err := l.store.ExtendLease(ctx, l.key, l.token, d); err != nil {
		return err
	}
	l.mu.Lock()
	l.expires = time.Now().Add(d)
	l.mu.Unlock()
	return nil
}

// End gives the key up now, without an outcome: the response is sent but
// not stored, and the next request with the key takes it over at once. For
// a handler that knows nothing happened (a downstream refused before doing
// anything) and wants a retry to run rather than wait for the lease.
func (l *Lease) End(ctx context.Context) error {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended {
		return nil
	}
	if err := l.store.EndLease(ctx, l.key, l.token); err != nil {
		return err
	}
	l.ended = true
	return nil
}

func (l *Lease) isEnded() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ended
}
