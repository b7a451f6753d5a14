package redisfront

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/internal/retry"
)

// Release runs keys again: it begins a release of their scopes in the
// database (each scope's epoch moves, and no process trusts or writes an
// entry of the scope while it lasts), waits until every process has read
// the epochs again (a little over Config.EpochTTL), calls deleteRows —
// which deletes the keys' rows from the store's table, with whatever the
// operator's tool uses, and must be done before Config.ReleaseHold runs
// out (its context ends before) — and ends the releases (the epochs move
// again). Entries written before the release, or by a transaction that
// read a row before deleteRows deleted it, carry an older epoch: none is
// trusted again, whatever Redis kept, lost or was restored to.
//
// Every entry of the scopes is answered by the database until it is
// written again: a release costs its scopes a cold cache. A release of a
// scope already in progress makes Release fail with an error wrapping
// dedup.ErrReleaseInProgress, before anything is deleted; so does a
// database that cannot be reached.
func (s *Store[TTx]) Release(ctx context.Context, keys []dedup.Key, deleteRows func(ctx context.Context) error) error {
	var scopes []string
	for _, k := range keys {
		scopes = append(scopes, k.Scope)
	}
	slices.Sort(scopes)
	return s.release(ctx, "release", slices.Compact(scopes), deleteRows)
}

// ReleaseScope is Release for every key of scope.
func (s *Store[TTx]) ReleaseScope(ctx context.Context, scope string, deleteRows func(ctx context.Context) error) error {
	return s.release(ctx, "release scope", []string{scope}, deleteRows)
}

func (s *Store[TTx]) release(ctx context.Context, op string, scopes []string, deleteRows func(ctx context.Context) error) (err error) {
	if len(scopes) == 0 {
		return deleteRows(ctx) // no key: nothing Redis could answer
	}
	began := time.Now() // before the holds began, by the database's clock
	tokens := make(map[string]int64, len(scopes))
	defer func() {
		// Always, also when deleteRows failed: until it ends, a release
		// keeps its scopes from Redis (for ReleaseHold at most).
		ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		for _, scope := range scopes {
			if t, ok := tokens[scope]; ok {
				if eerr := s.epochs.EndRelease(ectx, scope, t); eerr != nil {
					err = errors.Join(err, fmt.Errorf("redisfront: %s: ending the release of %s (its entries stay untrusted until Config.ReleaseHold runs out): %w", op, scope, eerr))
				}
			}
		}
	}()
	for _, scope := range scopes {
		t, err := s.epochs.BeginRelease(ctx, scope, s.cfg.ReleaseHold)
		if err != nil {
			return fmt.Errorf("redisfront: %s: nothing deleted: %w", op, err)
		}
		tokens[scope] = t
	}
	if err := retry.Sleep(ctx, s.settle()); err != nil {
		return fmt.Errorf("redisfront: %s: nothing deleted: %w", op, err)
	}
	deadline := began.Add(s.cfg.ReleaseHold - s.settle())
	dctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	if err := deleteRows(dctx); err != nil {
		return fmt.Errorf("redisfront: %s: deleting the rows: %w", op, err)
	}
	if time.Now().After(deadline) {
		return fmt.Errorf("redisfront: %s: deleteRows returned after Config.ReleaseHold (%v) ran out: an entry of a transaction that read a row before it was deleted may be trusted until EpochTTL after this release ends; call Forget", op, s.cfg.ReleaseHold)
	}
	return nil
}

// Forget is for keys whose rows were deleted some other way than Release
// (by hand): call it afterwards. It moves their scopes' epochs and returns
// once no process trusts an entry written before (a little over
// Config.EpochTTL); until then the deleted keys may still be answered as
// duplicates. Every entry of the scopes is answered by the database until
// it is written again.
func (s *Store[TTx]) Forget(ctx context.Context, keys ...dedup.Key) error {
	var scopes []string
	for _, k := range keys {
		scopes = append(scopes, k.Scope)
	}
	slices.Sort(scopes)
	return s.forget(ctx, slices.Compact(scopes))
}

// ForgetScope is Forget for every key of scope.
func (s *Store[TTx]) ForgetScope(ctx context.Context, scope string) error {
	return s.forget(ctx, []string{scope})
}

func (s *Store[TTx]) forget(ctx context.Context, scopes []string) error {
	if len(scopes) == 0 {
		return nil
	}
	for _, scope := range scopes {
		if _, err := s.epochs.AdvanceEpoch(ctx, scope); err != nil {
			return fmt.Errorf("redisfront: forget: %w", err)
		}
	}
	return retry.Sleep(ctx, s.settle())
}
