package retrytest

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/pgstore"
)

// LyingStore reports a transient failure for every transaction that claimed
// a message it targets (its Ref; the handler sets it: Target, AddTarget) —
// after the transaction committed: a COMMIT whose outcome the client did
// not learn.
type LyingStore struct {
	*pgstore.Store
	lies    atomic.Int32
	mu      sync.Mutex
	targets map[string]bool
	claims  map[pgx.Tx][]string // the sources claimed in each open transaction
}

// NewLyingStore wraps s; it lies about nothing until Target is called.
func NewLyingStore(s *pgstore.Store) *LyingStore {
	return &LyingStore{Store: s, targets: map[string]bool{}, claims: map[pgx.Tx][]string{}}
}

// Target names the message (its Ref) whose transactions' COMMITs are
// reported failed from now on, in place of those targeted before.
func (s *LyingStore) Target(ref string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	clear(s.targets)
	s.targets[ref] = true
}

// AddTarget adds a message (its Ref) to those whose transactions' COMMITs
// are reported failed from now on.
func (s *LyingStore) AddTarget(ref string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.targets[ref] = true
}

// Lies is how many COMMITs were reported failed.
func (s *LyingStore) Lies() int32 { return s.lies.Load() }

func (s *LyingStore) Claim(ctx context.Context, tx pgx.Tx, claims []dedup.Claim, results []dedup.Result) error {
	s.mu.Lock()
	for _, c := range claims {
		s.claims[tx] = append(s.claims[tx], c.Source)
	}
	s.mu.Unlock()
	return s.Store.Claim(ctx, tx, claims, results)
}

func (s *LyingStore) InTx(ctx context.Context, fn func(ctx context.Context, tx pgx.Tx) error) error {
	var in pgx.Tx
	err := s.Store.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		in = tx
		return fn(ctx, tx)
	})
	s.mu.Lock()
	sources := s.claims[in]
	delete(s.claims, in)
	lie := slices.ContainsFunc(sources, func(src string) bool { return s.targets[src] })
	s.mu.Unlock()
	if err == nil && lie {
		s.lies.Add(1)
		return consumer.Retryable(errors.New("connection reset during COMMIT"))
	}
	return err
}
