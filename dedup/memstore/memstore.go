// Package memstore is an in-memory dedup.Store with real transaction
// semantics: claims are invisible to other transactions until commit,
// forgotten on rollback, and a concurrent claim of an uncommitted key waits
// (bounded by LockTimeout) like Postgres does on its unique index. Effects
// staged with Tx.OnCommit run only when the transaction commits.
//
// The store is also a dedup.Journal (journal.go), on the same clock, and
// keeps entity watermarks (dedup.Watermarks, entities.go) in its
// transactions like its claims, and parked keys (dedup.Parking,
// parking.go).
//
// It is for unit tests and demos: nothing survives the process.
package memstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"github.com/idemkit/idem/internal/shorten"
	"slices"
	"sync"
	"time"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/internal/retention"
)

// Config configures a Store. Zero values take the defaults.
type Config struct {
	// LockTimeout bounds the wait on another transaction's uncommitted claim;
	// default 5s.
	LockTimeout time.Duration
	// Retention is how long a row lives; default 0: forever.
	Retention time.Duration
	// ScopeRetention overrides Retention for the scopes it names.
	ScopeRetention map[string]time.Duration
	// Now is the clock; default time.Now.
	Now func() time.Time
}

// Store keeps dedup rows in memory. Safe for concurrent use.
type Store struct {
	cfg     Config
	mu      sync.Mutex
	rows    map[dedup.Key]row
	pending map[dedup.Key]*Tx

	steps     map[dedup.StepRef]*step // the effect journal (journal.go)
	lastToken int64

	marks       map[entity]mark // entity watermarks (entities.go)
	markHolders map[entity]*Tx
	stale       []staleRecord // in commit order

	parked map[dedup.ParkKey]*parkedKey // parked keys (parking.go)
}

type row struct {
	fp      dedup.Fingerprint
	created time.Time
	failed  bool
	reason  string
	expires time.Time // zero: never
}

// Tx is a memstore transaction.
type Tx struct {
	s        *Store
	claims   map[dedup.Key]dedup.Fingerprint
	first    map[dedup.Key]time.Time // when each claim was made
	order    []dedup.Key
	onCommit []func()
	done     chan struct{}
	finished bool

	marks map[entity]dedup.Version // watermarks moved, uncommitted
	stale []dedup.StaleEvent       // stale events, unrecorded
	held  []entity                 // entities this transaction holds
}

// New returns an empty Store.
func New(cfg Config) *Store {
	if cfg.LockTimeout == 0 {
		cfg.LockTimeout = 5 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Store{cfg: cfg, rows: make(map[dedup.Key]row), pending: make(map[dedup.Key]*Tx), steps: make(map[dedup.StepRef]*step),
		marks: make(map[entity]mark), markHolders: make(map[entity]*Tx), parked: make(map[dedup.ParkKey]*parkedKey)}
}

// OnCommit stages an effect: f runs if and when tx commits.
func (tx *Tx) OnCommit(f func()) { tx.onCommit = append(tx.onCommit, f) }

// InTx runs fn in a transaction; see dedup.Store.
func (s *Store) InTx(ctx context.Context, fn func(ctx context.Context, tx *Tx) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	tx := &Tx{s: s, claims: make(map[dedup.Key]dedup.Fingerprint), first: make(map[dedup.Key]time.Time), done: make(chan struct{}),
		marks: make(map[entity]dedup.Version)}
	err := fn(ctx, tx)
	if err == nil {
		err = ctx.Err()
	}
	s.mu.Lock()
	if err == nil {
		now := s.cfg.Now()
		for _, k := range tx.order {
			if _, ok := s.rows[k]; !ok {
				s.rows[k] = row{fp: tx.claims[k], created: tx.first[k], expires: s.expiry(k.Scope, now)}
			}
		}
		s.commitEntities(tx, now)
	}
	s.releaseEntities(tx)
	for _, k := range tx.order {
		if s.pending[k] == tx {
			delete(s.pending, k)
		}
	}
	tx.finished = true
	close(tx.done)
	s.mu.Unlock()
	if err != nil {
		return err
	}
	for _, f := range tx.onCommit {
		f()
	}
	return nil
}

func (s *Store) expiry(scope string, now time.Time) time.Time {
	d, ok := retention.Of(s.cfg.Retention, s.cfg.ScopeRetention, scope)
	if !ok {
		return time.Time{}
	}
	return now.Add(d)
}

// Claim claims keys in tx; see dedup.Store.
func (s *Store) Claim(ctx context.Context, tx *Tx, claims []dedup.Claim, results []dedup.Result) error {
	if len(results) < len(claims) {
		return fmt.Errorf("memstore: %d results for %d claims", len(results), len(claims))
	}
	if tx.finished {
		return errors.New("memstore: transaction is finished")
	}
	// Take the keys in (scope, id) order, first occurrences first: one lock
	// order for every transaction, as the SQL stores do.
	order := make([]int, len(claims))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int {
		return cmp.Or(cmp.Compare(claims[a].Key.Scope, claims[b].Key.Scope), cmp.Compare(claims[a].Key.ID, claims[b].Key.ID))
	})
	for _, i := range order {
		if err := ctx.Err(); err != nil {
			return err
		}
		r, err := s.claim(ctx, tx, claims[i])
		if err != nil {
			return err
		}
		results[i] = r
	}
	return nil
}

func (s *Store) claim(ctx context.Context, tx *Tx, c dedup.Claim) (dedup.Result, error) {
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		s.mu.Lock()
		if fp, ok := tx.claims[c.Key]; ok {
			s.mu.Unlock()
			return compare(fp, c.Fingerprint, tx.first[c.Key]), nil
		}
		if r, ok := s.rows[c.Key]; ok {
			s.mu.Unlock()
			if r.failed {
				if r.fp != c.Fingerprint {
					return dedup.Result{Status: dedup.StatusMismatch, FirstAt: r.created}, nil
				}
				return dedup.Result{Status: dedup.StatusFailed, Reason: r.reason, FirstAt: r.created}, nil
			}
			return compare(r.fp, c.Fingerprint, r.created), nil
		}
		owner, busy := s.pending[c.Key]
		if !busy {
			s.pending[c.Key] = tx
			tx.claims[c.Key] = c.Fingerprint
			tx.first[c.Key] = s.cfg.Now()
			tx.order = append(tx.order, c.Key)
			s.mu.Unlock()
			return dedup.Result{Status: dedup.StatusNew}, nil
		}
		s.mu.Unlock()
		if timer == nil {
			timer = time.NewTimer(s.cfg.LockTimeout)
		}
		select {
		case <-owner.done:
		case <-timer.C:
			return dedup.Result{}, fmt.Errorf("%w: %s", dedup.ErrInFlight, c.Key)
		case <-ctx.Done():
			return dedup.Result{}, ctx.Err()
		}
	}
}

func compare(have, got dedup.Fingerprint, first time.Time) dedup.Result {
	if have != got {
		return dedup.Result{Status: dedup.StatusMismatch, FirstAt: first}
	}
	return dedup.Result{Status: dedup.StatusDuplicate, FirstAt: first}
}

// RecordFailure records a failed key; see dedup.Store.
func (s *Store) RecordFailure(ctx context.Context, c dedup.Claim, reason string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.rows[c.Key]; !ok {
		now := s.cfg.Now()
		s.rows[c.Key] = row{fp: c.Fingerprint, created: now, failed: true, reason: shorten.Reason(reason), expires: s.expiry(c.Key.Scope, now)}
	}
	return nil
}

// Purge deletes expired rows, and with them the journal's succeeded and
// failed steps of their keys (counted too); see dedup.Store and
// dedup.Journal. A step whose key has no row is never purged. Watermarks
// untouched, and stale records kept, for longer than their scope's
// retention are deleted too (counted, within limit): a forgotten watermark
// is forgotten as a key is, and the entity's next event applies.
func (s *Store) Purge(ctx context.Context, limit int) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now, n := s.cfg.Now(), 0
	var gone map[dedup.Key]bool
	for k, r := range s.rows {
		if n >= limit {
			break
		}
		if !r.expires.IsZero() && r.expires.Before(now) {
			delete(s.rows, k)
			if gone == nil {
				gone = make(map[dedup.Key]bool)
			}
			gone[k] = true
			n++
		}
	}
	n += s.purgeEntities(now, limit-n)
	n += s.purgeSteps(gone)
	return n, nil
}

// ClassifyError has no store errors of its own to classify.
func (s *Store) ClassifyError(error) dedup.ErrorClass { return dedup.ClassUnknown }

// Len returns the number of committed rows.
func (s *Store) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.rows)
}

// Check reports nil: a memstore needs no migration.
func (s *Store) Check(context.Context) error { return nil }

var _ dedup.Store[*Tx] = (*Store)(nil)
