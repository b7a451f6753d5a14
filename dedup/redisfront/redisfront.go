package redisfront

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/internal/retention"
)

// Config configures a Store. Zero values take the defaults.
type Config struct {
	// Client is the Redis client; required. Its ContextTimeoutEnabled must
	// be set, so that Timeout bounds a slow Redis (go-redis otherwise waits
	// its ReadTimeout, 3s by default). Redis 6.2 or later.
	Client redis.UniversalClient
	// Prefix starts every key; default "idem:". It must not contain '{' or
	// '}' (the keys of a scope share a Redis Cluster hash slot).
	Prefix string
	// Retention and ScopeRetention are the inner store's: an entry expires
	// when its row's retention ends. Shorter is safe; longer would answer
	// keys the store has purged. Zero: forever, capped by MaxTTL.
	Retention      time.Duration
	ScopeRetention map[string]time.Duration
	// MaxTTL caps how long an entry lives; default 24h.
	MaxTTL time.Duration
	// Timeout bounds each Redis round trip; default 50ms. A lookup that
	// runs out costs the database round trip it was to save.
	Timeout time.Duration
	// WriteWindow: an entry is written only this long after the Redis
	// lookup that preceded its claim (by Redis's clock). Default 30s.
	// Transactions that take longer leave no entry (their claims cost the
	// database round trip next time).
	WriteWindow time.Duration
	// RetryAfter: after a Redis error, claims go straight to the database
	// for this long; default 1s. So they do after a failed read of the
	// release epochs.
	RetryAfter time.Duration
	// Epochs is where the release epochs are kept (see the package doc):
	// default the inner store, which must then be a dedup.EpochStore (the
	// stores of this module are). Set it when inner wraps such a store.
	Epochs dedup.EpochStore
	// EpochTTL is how long the front trusts the release epochs it read
	// from the database before it reads them again; default 1s. Release
	// and Forget wait a little longer than this (so that every process has
	// read the epochs again) before they delete rows or return. Every
	// process of a store must have the same EpochTTL, or one shorter than
	// the releasing process's.
	EpochTTL time.Duration
	// ReleaseHold is how long a Release may take: its scopes' entries are
	// not trusted from its start until it ends, or for at most this long
	// (a Release that crashed). deleteRows is given a context that ends
	// before it runs out. Default 10m.
	ReleaseHold time.Duration
	// AlwaysTransact: InTx always runs fn in a database transaction (see
	// the package doc); default false.
	AlwaysTransact bool
	// Logger receives the warnings (Redis unavailable, writes that failed);
	// default slog.Default().
	Logger *slog.Logger
}

// Store is a dedup.Store[TTx] with Redis in front of the inner store. Safe
// for concurrent use.
type Store[TTx any] struct {
	inner  dedup.Store[TTx]
	epochs dedup.EpochStore
	cfg    Config
	rdb    redis.UniversalClient
	write  *redis.Script

	downUntil atomic.Int64 // unix nanoseconds; Redis is left alone before
	stats     struct{ lookups, hits, skipped, writes, refused, errors, epochReads atomic.Int64 }

	epoch          atomic.Pointer[epochView] // the last epochs read; see epochs.go
	epochMu        sync.Mutex                // held by the one reading them
	epochDownUntil atomic.Int64              // unix nanoseconds; after a failed read
}

// New returns inner with Redis in front of it.
func New[TTx any](inner dedup.Store[TTx], cfg Config) (*Store[TTx], error) {
	if inner == nil {
		return nil, errors.New("redisfront: inner store is nil")
	}
	if cfg.Client == nil {
		return nil, errors.New("redisfront: Config.Client is nil")
	}
	var ctxTimeouts bool
	switch c := cfg.Client.(type) {
	case *redis.Client:
		ctxTimeouts = c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		ctxTimeouts = c.Options().ContextTimeoutEnabled
	default:
		ctxTimeouts = true // cannot tell
	}
	if !ctxTimeouts {
		return nil, errors.New("redisfront: Config.Client: set ContextTimeoutEnabled in its options, or Config.Timeout cannot bound a slow Redis")
	}
	if cfg.Prefix == "" {
		cfg.Prefix = "idem:"
	}
	if strings.ContainsAny(cfg.Prefix, "{}") {
		return nil, fmt.Errorf("redisfront: Config.Prefix %q has '{' or '}'", cfg.Prefix)
	}
	if cfg.Epochs == nil {
		e, ok := inner.(dedup.EpochStore)
		if !ok {
			return nil, fmt.Errorf("redisfront: the inner store %T keeps no release epochs (dedup.EpochStore), "+
				"without which an entry written before a release could not be told from one written after it: set Config.Epochs", inner)
		}
		cfg.Epochs = e
	}
	for name, d := range map[string]time.Duration{"Retention": cfg.Retention, "MaxTTL": cfg.MaxTTL, "Timeout": cfg.Timeout,
		"WriteWindow": cfg.WriteWindow, "RetryAfter": cfg.RetryAfter, "EpochTTL": cfg.EpochTTL, "ReleaseHold": cfg.ReleaseHold} {
		if d < 0 {
			return nil, fmt.Errorf("redisfront: Config.%s is negative", name)
		}
	}
	if err := retention.CheckScopes("redisfront", cfg.ScopeRetention); err != nil {
		return nil, err
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&cfg.MaxTTL, 24*time.Hour)
	def(&cfg.Timeout, 50*time.Millisecond)
	def(&cfg.WriteWindow, 30*time.Second)
	def(&cfg.RetryAfter, time.Second)
	def(&cfg.EpochTTL, time.Second)
	def(&cfg.ReleaseHold, 10*time.Minute)
	if cfg.ReleaseHold <= 2*cfg.EpochTTL {
		return nil, fmt.Errorf("redisfront: Config.ReleaseHold %v must be more than twice Config.EpochTTL %v: Release waits EpochTTL within it before it deletes rows", cfg.ReleaseHold, cfg.EpochTTL)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Store[TTx]{inner: inner, epochs: cfg.Epochs, cfg: cfg, rdb: cfg.Client, write: redis.NewScript(writeScript)}, nil
}

// Inner returns the store behind Redis.
func (s *Store[TTx]) Inner() dedup.Store[TTx] { return s.inner }

// Stats counts what the front did.
type Stats struct {
	Lookups int64 // keys looked up in Redis
	Hits    int64 // claims answered from Redis (duplicates)
	Skipped int64 // InTx calls answered without a database transaction
	Writes  int64 // entries written after COMMIT
	Refused int64 // writes the script refused (too late, expired)
	Errors  int64 // Redis errors and timeouts
	// EpochReads counts the reads of the release epochs from the
	// database: about one per Config.EpochTTL while claims come.
	EpochReads int64
}

// Stats returns the counters since New.
func (s *Store[TTx]) Stats() Stats {
	return Stats{Lookups: s.stats.lookups.Load(), Hits: s.stats.hits.Load(), Skipped: s.stats.skipped.Load(),
		Writes: s.stats.writes.Load(), Refused: s.stats.refused.Load(), Errors: s.stats.errors.Load(),
		EpochReads: s.stats.epochReads.Load()}
}

// entry is what Redis holds for a committed key: 'e', the fingerprint,
// when the key was first claimed (Unix ms) and the release epoch of its
// scope that the front had read before the claim (both big-endian).
type entry struct {
	fp      dedup.Fingerprint
	firstAt int64
	epoch   int64
}

const entryLen = 1 + 32 + 8 + 8

func (e entry) encode() string {
	b := make([]byte, entryLen)
	b[0] = 'e'
	copy(b[1:], e.fp[:])
	binary.BigEndian.PutUint64(b[33:], uint64(e.firstAt))
	binary.BigEndian.PutUint64(b[41:], uint64(e.epoch))
	return string(b)
}

func decode(v string) (entry, bool) {
	if len(v) != entryLen || v[0] != 'e' {
		return entry{}, false // an entry of an earlier version (no epoch), or not ours
	}
	var e entry
	copy(e.fp[:], v[1:33])
	e.firstAt = int64(binary.BigEndian.Uint64([]byte(v[33:41])))
	e.epoch = int64(binary.BigEndian.Uint64([]byte(v[41:])))
	return e, true
}

// scopeTag is the part of every key of scope that Redis Cluster hashes:
// the scope's length makes the key unambiguous whatever the scope holds.
func (s *Store[TTx]) scopeTag(scope string) string {
	return s.cfg.Prefix + "{" + strconv.Itoa(len(scope)) + ":" + scope + "}"
}

func (s *Store[TTx]) entryKey(k dedup.Key) string { return s.scopeTag(k.Scope) + "k" + k.ID }

// writeScript writes a committed fact unless the write comes later than
// ARGV[3] or the entry would already have expired (ARGV[2]), both by
// Redis's clock. Whether the fact is still true is not Redis's to say: the
// entry carries its epoch, which the reader checks.
const writeScript = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if now > tonumber(ARGV[3]) or now >= tonumber(ARGV[2]) then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PXAT', ARGV[2])
return 1`

// up reports whether Redis may be asked (no error within RetryAfter).
func (s *Store[TTx]) up() bool { return time.Now().UnixNano() >= s.downUntil.Load() }

// failed counts a Redis error and leaves Redis alone for RetryAfter.
func (s *Store[TTx]) failed(op string, err error) {
	s.stats.errors.Add(1)
	until := time.Now().Add(s.cfg.RetryAfter).UnixNano()
	if prev := s.downUntil.Swap(until); prev < time.Now().UnixNano() {
		s.cfg.Logger.Warn("idem: redis front: Redis failed; claims go to the database meanwhile",
			slog.String("op", op), slog.Any("error", err), slog.Duration("retry_after", s.cfg.RetryAfter))
	}
}

// txState is one InTx call's: what Redis said, and what the database said,
// to be written after COMMIT. Claim finds it in its context.
type txState struct {
	dry     bool       // fn runs without a transaction
	claimed bool       // Claim ran
	ep      *epochView // the release epochs, read before any claim; nil: trust and write nothing
	now     int64
	known   map[dedup.Key]entry
	looked  map[dedup.Key]bool
	writes  []pending
}

type pending struct {
	claim  dedup.Claim
	result dedup.Result
}

type stateKey struct{}

// needTx is what Claim panics with when it runs without a transaction and
// Redis cannot answer every claim: it unwinds fn at once, so fn runs on
// (and its code after Claim runs) once only, in the database's transaction.
type needTx struct{}

// InTx runs fn, without a transaction when Redis answers all of its claims
// as duplicates, else in the inner store's; see the package doc.
func (s *Store[TTx]) InTx(ctx context.Context, fn func(ctx context.Context, tx TTx) error) error {
	st := &txState{known: map[dedup.Key]entry{}, looked: map[dedup.Key]bool{}}
	if s.up() {
		// Before the database reads any row for this InTx: an entry it
		// writes carries an epoch no later than the one its rows were read
		// under.
		st.ep = s.epochsNow(ctx)
	}
	ctx = context.WithValue(ctx, stateKey{}, st)
	if !s.cfg.AlwaysTransact && ctx.Err() == nil && s.up() {
		if done, err := s.withoutTx(ctx, fn, st); done {
			if err == nil {
				err = ctx.Err() // as the stores: no success for a caller that gave up
			}
			if err == nil {
				s.stats.skipped.Add(1)
			}
			return err
		}
		st.writes, st.claimed = nil, false
	}
	if err := s.inner.InTx(ctx, fn); err != nil {
		return err
	}
	s.remember(ctx, st)
	return nil
}

// withoutTx runs fn with TTx's zero value. It is done when fn claimed and
// Redis answered every claim: fn's error (none, or its own) is then the
// outcome, as it would be in a transaction that wrote nothing. It is not
// done when Claim needed the database, fn claimed nothing, or fn panicked
// (it used the zero transaction): fn then runs in a transaction.
func (s *Store[TTx]) withoutTx(ctx context.Context, fn func(ctx context.Context, tx TTx) error, st *txState) (done bool, err error) {
	st.dry = true
	defer func() {
		st.dry = false
		if recover() != nil {
			done, err = false, nil
		}
	}()
	var zero TTx
	err = fn(ctx, zero)
	return st.claimed, err
}

// Claim answers the claims Redis knows as committed duplicates with the
// same fingerprint, and passes the others to the inner store; see the
// package doc.
func (s *Store[TTx]) Claim(ctx context.Context, tx TTx, claims []dedup.Claim, results []dedup.Result) error {
	st, _ := ctx.Value(stateKey{}).(*txState)
	if st == nil {
		// Not this Store's InTx (or fn dropped its context): the inner
		// store answers, and nothing is remembered.
		return s.inner.Claim(ctx, tx, claims, results)
	}
	n := len(claims)
	if len(results) < n {
		return fmt.Errorf("redisfront: %d results for %d claims", len(results), n)
	}
	clear(results[:n])
	st.claimed = true
	s.lookup(ctx, st, claims)
	var rest []int
	for i := range claims {
		if e, ok := st.known[claims[i].Key]; ok && e.fp == claims[i].Fingerprint {
			results[i] = dedup.Result{Status: dedup.StatusDuplicate, FirstAt: time.UnixMilli(e.firstAt)}
			continue
		}
		rest = append(rest, i)
	}
	if len(rest) == 0 {
		s.stats.hits.Add(int64(n))
		return nil
	}
	if st.dry {
		panic(needTx{})
	}
	s.stats.hits.Add(int64(n - len(rest)))
	sub := make([]dedup.Claim, len(rest))
	subRes := make([]dedup.Result, len(rest))
	for j, i := range rest {
		sub[j] = claims[i]
	}
	if err := s.inner.Claim(ctx, tx, sub, subRes); err != nil {
		return err
	}
	for j, i := range rest {
		results[i] = subRes[j]
		st.writes = append(st.writes, pending{claims[i], subRes[j]})
	}
	return nil
}

// lookup asks Redis, in one pipeline, for the time and the keys not
// looked up yet in this InTx whose scope's epoch is known and no release
// of it in progress. Errors leave the keys unknown.
func (s *Store[TTx]) lookup(ctx context.Context, st *txState, claims []dedup.Claim) {
	var keys []dedup.Key
	for i := range claims {
		k := claims[i].Key
		if !st.looked[k] {
			st.looked[k] = true
			if _, ok := st.ep.of(k.Scope); ok {
				keys = append(keys, k)
			}
		}
	}
	if len(keys) == 0 || !s.up() || ctx.Err() != nil {
		return
	}
	s.stats.lookups.Add(int64(len(keys)))
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	pipe := s.rdb.Pipeline()
	now := pipe.Time(ctx)
	gets := make([]*redis.StringCmd, len(keys))
	for i, k := range keys {
		gets[i] = pipe.Get(ctx, s.entryKey(k))
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		s.failed("lookup", err)
		return
	}
	t, err := now.Result()
	if err != nil {
		s.failed("lookup", err)
		return
	}
	if ms := t.UnixMilli(); st.now == 0 || ms < st.now {
		st.now = ms // the earliest lookup bounds the writes
	}
	for i, k := range keys {
		if v, err := gets[i].Result(); err == nil {
			// Trusted only under the epoch it was written in: a release
			// since (or one in progress) moved the scope's epoch.
			if e, ok := decode(v); ok && st.ep.trusts(k.Scope, e.epoch) {
				st.known[k] = e
			}
		}
	}
}

// remember writes what the committed transaction learned: its new keys
// (first claimed at the lookup's time) and the duplicates the database
// found (at their FirstAt), each to expire when its row's retention ends.
func (s *Store[TTx]) remember(ctx context.Context, st *txState) {
	if st.now == 0 || len(st.writes) == 0 || !s.up() {
		return
	}
	writeBy := st.now + s.cfg.WriteWindow.Milliseconds()
	maxAt := st.now + s.cfg.MaxTTL.Milliseconds()
	type write struct {
		key      dedup.Key
		val      string
		expireAt int64
	}
	var ws []write
	seen := map[dedup.Key]bool{}
	for _, p := range st.writes {
		k := p.claim.Key
		if seen[k] {
			continue
		}
		epoch, ok := st.ep.of(k.Scope)
		if !ok {
			continue // a release of the scope is in progress
		}
		var first int64
		switch p.result.Status {
		case dedup.StatusNew:
			first = st.now
		case dedup.StatusDuplicate:
			first = p.result.FirstAt.UnixMilli()
		default:
			continue // mismatch (the stored fingerprint is not known here), failed
		}
		seen[k] = true
		at := maxAt
		if r, ok := retention.Of(s.cfg.Retention, s.cfg.ScopeRetention, k.Scope); ok {
			at = min(at, first+r.Milliseconds())
		}
		if at <= st.now {
			continue
		}
		ws = append(ws, write{k, entry{fp: p.claim.Fingerprint, firstAt: first, epoch: epoch}.encode(), at})
	}
	if len(ws) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.Timeout)
	defer cancel()
	run := func() ([]*redis.Cmd, error) {
		pipe := s.rdb.Pipeline()
		cmds := make([]*redis.Cmd, len(ws))
		for i, w := range ws {
			cmds[i] = s.write.EvalSha(ctx, pipe, []string{s.entryKey(w.key)}, w.val, w.expireAt, writeBy)
		}
		_, err := pipe.Exec(ctx)
		return cmds, err
	}
	cmds, err := run()
	if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		if err = s.write.Load(ctx, s.rdb).Err(); err == nil {
			cmds, err = run()
		}
	}
	if err != nil {
		s.failed("write", err)
		return
	}
	for _, c := range cmds {
		if v, _ := c.Int64(); v == 1 {
			s.stats.writes.Add(1)
		} else {
			s.stats.refused.Add(1)
		}
	}
}

// RecordFailure records the failure in the inner store; see dedup.Store.
// Failed keys are not kept in Redis.
func (s *Store[TTx]) RecordFailure(ctx context.Context, c dedup.Claim, reason string) error {
	return s.inner.RecordFailure(ctx, c, reason)
}

// Check checks the inner store and reads the release epochs (a table that
// Migrate creates: an error wrapping dedup.ErrNotMigrated when it is
// missing); Redis is optional and not checked.
func (s *Store[TTx]) Check(ctx context.Context) error {
	if err := s.inner.Check(ctx); err != nil {
		return err
	}
	if _, err := s.readEpochs(ctx); err != nil {
		return fmt.Errorf("redisfront: check: %w", err)
	}
	return nil
}

// ClassifyError is the inner store's: Redis errors never surface.
func (s *Store[TTx]) ClassifyError(err error) dedup.ErrorClass { return s.inner.ClassifyError(err) }

// Purge purges the inner store, which must be a dedup.Purger. Redis needs
// no invalidation: its entries expire no later than the rows' retention.
func (s *Store[TTx]) Purge(ctx context.Context, limit int) (int, error) {
	p, ok := s.inner.(dedup.Purger)
	if !ok {
		return 0, fmt.Errorf("redisfront: the inner store %T does not purge", s.inner)
	}
	return p.Purge(ctx, limit)
}

var (
	_ dedup.Store[any] = (*Store[any])(nil)
	_ dedup.Purger     = (*Store[any])(nil)
)
