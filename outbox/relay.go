package outbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"github.com/idemkit/idem/internal/shorten"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/internal/retry"
	"github.com/idemkit/idem/internal/storekit/pgerr"
)

// RelayConfig configures a Relay. Zero values take the documented defaults.
type RelayConfig struct {
	// Outbox is the outbox to publish. Required.
	Outbox *Outbox
	// Publisher sends the records (outbox/kafkapub, outbox/rocketmqpub).
	// Required.
	Publisher Publisher

	// BatchSize is the most rows one round reads, publishes and marks;
	// default 500, at most 10000. A round holds its shards' locks while it
	// publishes.
	BatchSize int
	// PollInterval is how long an idle relay waits before it looks again;
	// default 50ms. A busy relay does not wait: it reads the next batch as
	// soon as the last one is marked. (Why a poll and not LISTEN/NOTIFY:
	// see the package doc.)
	PollInterval time.Duration
	// PublishTimeout bounds one Publish call; default 30s. Past it the
	// records not yet acknowledged are retried later.
	PublishTimeout time.Duration

	// Retention keeps sent rows, marked with sent_at, for this long, then
	// the relay purges them in batches of PurgeBatch; default 0: a row is
	// deleted as soon as it is sent. Downstream deduplication does not need
	// the rows; keep them to answer "was it sent, and when".
	Retention time.Duration
	// PurgeEvery is how often a relay with Retention purges; default 1m.
	PurgeEvery time.Duration
	// PurgeBatch bounds one purge statement; default 1000.
	PurgeBatch int

	// Backoff spaces the retries of a shard whose records failed to publish
	// (a broker down, a topic missing) and of the relay when Postgres does
	// not answer: exponential with jitter, cenkalti/backoff. Zero fields take
	// Initial 100ms, Max 10s, Multiplier 2, Jitter 0.5; MaxAttempts and
	// MaxElapsed are ignored: a relay never gives up on a row.
	Backoff consumer.RetryPolicy

	// Logger receives the relay's logs; default slog.Default().
	Logger *slog.Logger
	// Clock is used for waits and backoff; default the system clock.
	Clock consumer.Clock
}

func (c *RelayConfig) validate() error {
	var errs []error
	add := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("outbox: RelayConfig."+format, args...))
	}
	if c.Outbox == nil {
		add("Outbox is nil")
	}
	if c.Publisher == nil {
		add("Publisher is nil")
	}
	if c.BatchSize < 0 || c.BatchSize > 10000 {
		add("BatchSize is %d, want 1..10000 (0 for the default 500)", c.BatchSize)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"PollInterval", c.PollInterval}, {"PublishTimeout", c.PublishTimeout}, {"Retention", c.Retention}, {"PurgeEvery", c.PurgeEvery}} {
		if d.v < 0 {
			add("%s is negative (%v)", d.name, d.v)
		}
	}
	if c.PurgeBatch < 0 {
		add("PurgeBatch is negative (%d)", c.PurgeBatch)
	}
	b := c.Backoff
	if b.Initial < 0 || b.Max < 0 || b.Multiplier < 0 || b.Jitter < 0 || b.Jitter > 1 || (b.Multiplier != 0 && b.Multiplier < 1) {
		add("Backoff: want Initial, Max >= 0, Multiplier 0 or >= 1, Jitter 0..1: %+v", b)
	}
	return errors.Join(errs...)
}

func (c *RelayConfig) setDefaults() {
	c.BatchSize = cmp.Or(c.BatchSize, 500)
	c.PollInterval = cmp.Or(c.PollInterval, 50*time.Millisecond)
	c.PublishTimeout = cmp.Or(c.PublishTimeout, 30*time.Second)
	c.PurgeEvery = cmp.Or(c.PurgeEvery, time.Minute)
	c.PurgeBatch = cmp.Or(c.PurgeBatch, 1000)
	b := &c.Backoff
	b.Initial = cmp.Or(b.Initial, 100*time.Millisecond)
	b.Max = cmp.Or(b.Max, 10*time.Second)
	b.Multiplier = cmp.Or(b.Multiplier, 2)
	b.Jitter = cmp.Or(b.Jitter, 0.5)
	c.Logger = cmp.Or(c.Logger, slog.Default())
	if c.Clock == nil {
		c.Clock = retry.SystemClock{}
	}
}

// Relay publishes committed outbox rows and then deletes them (or marks
// them sent), at least once, per key in order. Run as many relays as you
// like, in the consumer's processes or on their own: each round locks the
// shards it reads (a transaction-scoped advisory lock, released by COMMIT,
// ROLLBACK or the connection's end), so no two relays publish one shard at
// once, and a relay killed mid-round leaves nothing locked.
type Relay struct {
	cfg RelayConfig
	o   *Outbox

	lockSQL, readSQL, sentSQL, deadSQL, purgeSQL string

	// Used by the Run goroutine only.
	shards    [shardCount]shardState
	rotation  int
	lastPurge time.Time

	stats relayCounters
	// For Health.
	running  atomic.Bool
	progress atomic.Int64 // unix ns
	failing  atomic.Int64
	lastErr  atomic.Pointer[error]

	runMu    sync.Mutex
	started  bool
	stopped  bool
	stopLoop context.CancelFunc
	stopWork context.CancelFunc
	done     chan struct{}
}

// shardState is a shard's backoff after a failed publish.
type shardState struct {
	until    time.Time
	b        *backoff.ExponentialBackOff
	failures int // rounds in a row with a failed record
}

// NewRelay validates cfg and returns a Relay. The error names every field
// that is wrong.
func NewRelay(cfg RelayConfig) (*Relay, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	o := cfg.Outbox
	cols := `seq, id, parent_scope, parent_key, position, topic, key, value, header_keys, header_values, created_at`
	r := &Relay{
		cfg: cfg,
		o:   o,
		// For each shard in $2's order: lock it when it has pending rows
		// (CASE keeps the lock from being taken on empty shards), then list
		// its oldest pending rows. The outer LIMIT stops the scan once the
		// batch is full, so the shards after it are neither read nor locked:
		// they are left to other relays.
		lockSQL: `SELECT o.seq FROM unnest($2::int[]) AS s(shard)
CROSS JOIN LATERAL (
    SELECT seq FROM ` + o.table + ` WHERE shard = s.shard AND sent_at IS NULL ORDER BY seq LIMIT $3) AS o
WHERE CASE WHEN (SELECT true FROM ` + o.table + ` p WHERE p.shard = s.shard AND p.sent_at IS NULL LIMIT 1)
           THEN pg_try_advisory_xact_lock($1::int, s.shard) ELSE false END
LIMIT $3`,
		// The lock statement's snapshot predates its locks: another relay
		// may have marked some of those rows between the two. A new
		// statement, a new snapshot, taken with the locks held, reads only
		// the rows still pending.
		readSQL: `SELECT shard, ` + cols + ` FROM ` + o.table + ` WHERE seq = ANY($1::bigint[]) AND sent_at IS NULL`,
		deadSQL: `WITH d AS (DELETE FROM ` + o.table + ` WHERE seq = ANY($1::bigint[]) RETURNING ` + cols + `)
INSERT INTO ` + o.dead + ` (` + cols + `, reason)
SELECT ` + prefixed("d.", cols) + `, r.reason FROM d JOIN unnest($1::bigint[], $2::text[]) AS r(seq, reason) ON r.seq = d.seq
ON CONFLICT (seq) DO NOTHING`,
		purgeSQL: `DELETE FROM ` + o.table + ` WHERE seq IN (
SELECT seq FROM ` + o.table + ` WHERE sent_at < now() - $1::bigint * interval '1 millisecond' LIMIT $2 FOR UPDATE SKIP LOCKED)`,
		done:     make(chan struct{}),
		rotation: rand.IntN(shardCount),
	}
	if cfg.Retention > 0 {
		r.sentSQL = `UPDATE ` + o.table + ` SET sent_at = now() WHERE seq = ANY($1::bigint[])`
	} else {
		r.sentSQL = `DELETE FROM ` + o.table + ` WHERE seq = ANY($1::bigint[])`
	}
	return r, nil
}

func prefixed(p, cols string) string {
	var out []byte
	for i, c := range []byte(cols) {
		if i == 0 || cols[i-1] == ' ' {
			out = append(out, p...)
		}
		out = append(out, c)
	}
	return string(out)
}

// RelayStats are a relay's counters since it started.
type RelayStats struct {
	Published    int64 // records the broker acknowledged, republished ones included
	DeadLettered int64 // records refused for good, moved to the dead-letter table
	Failed       int64 // records whose publish failed, to be retried
	Rounds       int64 // batches read and published
	MarkFailures int64 // rounds whose rows could not be marked after publishing: they are published again
	// Republished counts records the broker acknowledged in a round whose
	// marking failed (MarkFailures): they are published again, a duplicate
	// downstream deduplicates by HeaderID.
	Republished int64
	// FailedRounds counts rounds that did not go through: Postgres failed
	// (reading, marking), or a record's publish failed and waits to be
	// retried.
	FailedRounds int64
	Purged       int64 // sent rows deleted past Retention
	// OrderViolations counts records a Publisher reported sent after an
	// earlier record of their key had failed: a Publisher bug (logged at
	// ERROR).
	OrderViolations int64
}

type relayCounters struct {
	published, dead, failed, rounds, markFailures, purged, orderViolations atomic.Int64
	republished, failedRounds                                              atomic.Int64
}

// Stats returns the relay's counters.
func (r *Relay) Stats() RelayStats {
	s := &r.stats
	return RelayStats{Published: s.published.Load(), DeadLettered: s.dead.Load(), Failed: s.failed.Load(),
		Rounds: s.rounds.Load(), MarkFailures: s.markFailures.Load(), Purged: s.purged.Load(),
		OrderViolations: s.orderViolations.Load(), Republished: s.republished.Load(), FailedRounds: s.failedRounds.Load()}
}

// RelayHealth is how a relay fares, for a probe.
type RelayHealth struct {
	Running bool // Run is publishing: past its check of the tables, not returned
	// LastProgress is when a round last went through — an empty one too,
	// when no shard backs off: the relay is caught up — or Run started;
	// zero before Run. A round whose publish failed is no progress.
	LastProgress time.Time
	// Rounds and FailedRounds are RelayStats'; FailingRounds counts the
	// failed rounds since the last one that went through.
	Rounds, FailedRounds, FailingRounds int64
	// LastError is the last failed round's error, until a round goes
	// through; nil for a failed publish, whose error is logged per shard.
	LastError error
}

// Health reports how the relay fares. Safe for concurrent use.
func (r *Relay) Health() RelayHealth {
	// failing first: a reader that sees none sees the rounds that ended it.
	h := RelayHealth{FailingRounds: r.failing.Load()}
	h.Running, h.Rounds, h.FailedRounds = r.running.Load(), r.stats.rounds.Load(), r.stats.failedRounds.Load()
	if ns := r.progress.Load(); ns != 0 {
		h.LastProgress = time.Unix(0, ns)
	}
	if e := r.lastErr.Load(); e != nil {
		h.LastError = *e
	}
	return h
}

// roundDone records a round's end for Health: nil went through.
func (r *Relay) roundDone(err error) {
	if err == nil {
		r.progress.Store(r.cfg.Clock.Now().UnixNano())
		r.failing.Store(0)
		r.lastErr.Store(nil)
		return
	}
	r.stats.failedRounds.Add(1)
	r.failing.Add(1)
	if !errors.Is(err, errPublishFailed) {
		r.lastErr.Store(&err)
	}
}

// errPublishFailed marks a round that went through Postgres but some of
// whose records failed to publish (their shards back off).
var errPublishFailed = errors.New("outbox: a publish failed")

// Run checks the outbox's tables (returning an error wrapping
// dedup.ErrNotMigrated at once when they are missing, waiting while
// Postgres does not answer), then publishes until ctx ends or Stop is
// called. Postgres errors are waited out with backoff; a broken deployment
// (an error pgstore.Classify calls dedup.ClassFatal: a missing table or
// privilege) ends Run with that error. Cancelling ctx is a hard stop: a
// round in flight is abandoned, and what it published but did not mark is
// published again later. Stop is the graceful one. A Relay runs once.
func (r *Relay) Run(ctx context.Context) error {
	r.runMu.Lock()
	if r.started {
		r.runMu.Unlock()
		return errors.New("outbox: Run called twice")
	}
	r.started = true
	workCtx, stopWork := context.WithCancel(ctx)
	loopCtx, stopLoop := context.WithCancel(workCtx)
	r.stopWork, r.stopLoop = stopWork, stopLoop
	if r.stopped {
		stopLoop()
	}
	r.runMu.Unlock()
	defer close(r.done)
	defer stopWork()
	defer stopLoop()

	dbWait := retry.Policy{Initial: r.cfg.Backoff.Initial, Max: r.cfg.Backoff.Max, Multiplier: r.cfg.Backoff.Multiplier,
		Jitter: r.cfg.Backoff.Jitter, Clock: r.cfg.Clock}
	wait := dbWait.New()
	for {
		err := r.o.Check(loopCtx)
		if err == nil {
			break
		}
		if loopCtx.Err() != nil {
			return nil
		}
		if errors.Is(err, dedup.ErrNotMigrated) || pgerr.Classify(err) == dedup.ClassFatal {
			return err
		}
		r.cfg.Logger.Warn("idem outbox: relay waits for Postgres", slog.Any("error", err))
		if _, err := wait.Wait(loopCtx); err != nil {
			return nil
		}
	}
	wait = dbWait.New()
	r.progress.Store(r.cfg.Clock.Now().UnixNano())
	r.running.Store(true)
	defer r.running.Store(false)
	for loopCtx.Err() == nil {
		n, err := r.round(workCtx)
		if err != nil && loopCtx.Err() == nil {
			r.roundDone(err)
		}
		switch {
		case err != nil && loopCtx.Err() != nil:
			return nil
		case err != nil && pgerr.Classify(err) == dedup.ClassFatal:
			r.cfg.Logger.Error("idem outbox: relay stopped", slog.Any("error", err))
			return err
		case err != nil:
			r.cfg.Logger.Warn("idem outbox: relay round failed; retrying", slog.Any("error", err))
			if _, err := wait.Wait(loopCtx); err != nil {
				return nil
			}
			continue
		}
		wait = dbWait.New()
		r.purge(loopCtx)
		if n > 0 {
			continue // there may be more
		}
		if err := r.cfg.Clock.Sleep(loopCtx, r.idleWait()); err != nil {
			return nil
		}
	}
	return nil
}

// Stop lets the round in flight finish — publish, mark, commit — and
// returns once Run has. Past ctx's deadline it cancels the round (what was
// published and not marked is published again later) and returns ctx.Err().
// Stop before Run makes Run return at once.
func (r *Relay) Stop(ctx context.Context) error {
	r.runMu.Lock()
	r.stopped = true
	started := r.started
	if started {
		r.stopLoop()
	}
	r.runMu.Unlock()
	if !started {
		return nil
	}
	select {
	case <-r.done:
		return nil
	case <-ctx.Done():
		r.stopWork()
		<-r.done
		return ctx.Err()
	}
}

// idleWait is how long to wait with nothing to do: PollInterval, or less
// when a shard's backoff ends before.
func (r *Relay) idleWait() time.Duration {
	d := r.cfg.PollInterval
	now := r.cfg.Clock.Now()
	for i := range r.shards {
		if u := r.shards[i].until; !u.IsZero() && u.Sub(now) < d {
			d = max(u.Sub(now), time.Millisecond)
		}
	}
	return d
}

// eligible lists the shards not backing off, from a rotating start so that
// relays spread over the shards and none is always last.
func (r *Relay) eligible(now time.Time) []int32 {
	r.rotation++
	out := make([]int32, 0, shardCount)
	for i := range shardCount {
		s := (r.rotation + i) % shardCount
		if u := r.shards[s].until; u.IsZero() || !now.Before(u) {
			out = append(out, int32(s))
		}
	}
	return out
}

// round reads, publishes and marks one batch; it returns how many rows it
// read. It follows workCtx, which a graceful stop leaves alone: the round in
// flight finishes.
func (r *Relay) round(workCtx context.Context) (int, error) {
	shards := r.eligible(r.cfg.Clock.Now())
	if len(shards) == 0 {
		return 0, nil
	}
	tx, err := r.o.pool.Begin(workCtx)
	if err != nil {
		return 0, fmt.Errorf("outbox: begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(workCtx)) //nolint:errcheck // a no-op after COMMIT
	recs, shardOf, err := r.read(workCtx, tx, shards)
	if err != nil || len(recs) == 0 {
		if err == nil && len(shards) == shardCount {
			r.roundDone(nil) // nothing to publish, no shard backing off: caught up
		}
		return 0, err
	}
	r.stats.rounds.Add(1)

	errs := make([]error, len(recs))
	pctx, cancel := context.WithTimeout(workCtx, r.cfg.PublishTimeout)
	r.cfg.Publisher.Publish(pctx, recs, errs)
	cancel()

	var sent, dead []int64
	var reasons []string
	read := map[int16]bool{}
	for _, sh := range shardOf {
		read[sh] = true
	}
	failedShards := map[int16]error{}
	failedKeys := map[string]bool{}
	for i := range recs {
		rec, err := &recs[i], errs[i]
		switch {
		case err == nil:
			if failedKeys[rec.OrderKey()] {
				r.stats.orderViolations.Add(1)
				r.cfg.Logger.Error("idem outbox: the publisher sent a message after an earlier one of its key failed (per-key order broken)",
					slog.String("topic", rec.Topic), slog.String("id", rec.ID))
			}
			sent = append(sent, rec.Seq)
		case errors.Is(err, ErrRefused):
			dead = append(dead, rec.Seq)
			reasons = append(reasons, shorten.Reason(err.Error()))
		default:
			failedKeys[rec.OrderKey()] = true
			if _, ok := failedShards[shardOf[i]]; !ok {
				failedShards[shardOf[i]] = err
			}
		}
	}
	var b pgx.Batch
	if len(sent) > 0 {
		b.Queue(r.sentSQL, sent)
	}
	if len(dead) > 0 {
		b.Queue(r.deadSQL, dead, reasons)
	}
	if b.Len() > 0 {
		err = tx.SendBatch(workCtx, &b).Close()
		if err == nil {
			err = tx.Commit(workCtx)
		}
		if err != nil {
			r.stats.markFailures.Add(1)
			r.stats.republished.Add(int64(len(sent)))
			return len(recs), fmt.Errorf("outbox: mark %d sent and %d refused messages (they will be published again): %w", len(sent), len(dead), err)
		}
	}
	r.stats.published.Add(int64(len(sent)))
	r.stats.dead.Add(int64(len(dead)))
	r.stats.failed.Add(int64(len(recs) - len(sent) - len(dead)))
	if len(dead) > 0 {
		r.cfg.Logger.Warn("idem outbox: messages refused by the broker, moved to the dead-letter table",
			slog.Int("count", len(dead)), slog.String("table", r.o.dead), slog.String("first_reason", reasons[0]))
	}
	r.backoffShards(read, failedShards)
	if len(failedShards) > 0 {
		r.roundDone(errPublishFailed)
	} else {
		r.roundDone(nil)
	}
	return len(recs), nil
}

// read locks shards and reads their oldest pending rows, at most BatchSize,
// ordered by seq (so each shard's rows, and each key's, are in order).
func (r *Relay) read(ctx context.Context, tx pgx.Tx, shards []int32) ([]Record, []int16, error) {
	lrows, err := tx.Query(ctx, r.lockSQL, r.o.lockID, shards, r.cfg.BatchSize)
	if err != nil {
		return nil, nil, fmt.Errorf("outbox: lock: %w", err)
	}
	seqs, err := pgx.CollectRows(lrows, pgx.RowTo[int64])
	if err != nil {
		return nil, nil, fmt.Errorf("outbox: lock: %w", err)
	}
	if len(seqs) == 0 {
		return nil, nil, nil
	}
	rows, err := tx.Query(ctx, r.readSQL, seqs)
	if err != nil {
		return nil, nil, fmt.Errorf("outbox: read: %w", err)
	}
	type row struct {
		shard int16
		rec   Record
	}
	var got []row
	for rows.Next() {
		var w row
		var hk []string
		var hv [][]byte
		var pos int32
		if err := rows.Scan(&w.shard, &w.rec.Seq, &w.rec.ID, &w.rec.Parent.Scope, &w.rec.Parent.ID, &pos,
			&w.rec.Topic, &w.rec.Key, &w.rec.Value, &hk, &hv, &w.rec.Created); err != nil {
			rows.Close()
			return nil, nil, fmt.Errorf("outbox: read: %w", err)
		}
		w.rec.Position = int(pos)
		hs := make([]consumer.Header, 0, len(hk)+4)
		for i := range hk {
			if i < len(hv) {
				hs = append(hs, consumer.Header{Key: hk[i], Value: hv[i]})
			}
		}
		w.rec.Headers = append(hs,
			consumer.Header{Key: HeaderID, Value: []byte(w.rec.ID)},
			consumer.Header{Key: HeaderScope, Value: []byte(w.rec.Parent.Scope)},
			consumer.Header{Key: HeaderKey, Value: []byte(w.rec.Parent.ID)},
			consumer.Header{Key: HeaderPosition, Value: []byte(strconv.Itoa(w.rec.Position))})
		got = append(got, w)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("outbox: read: %w", err)
	}
	slices.SortFunc(got, func(a, b row) int { return int(a.rec.Seq - b.rec.Seq) })
	recs, shardOf := make([]Record, len(got)), make([]int16, len(got))
	for i := range got {
		recs[i], shardOf[i] = got[i].rec, got[i].shard
	}
	return recs, shardOf, nil
}

// backoffShards delays the shards read with a failed record (jittered,
// exponential per shard) and clears the backoff of those that went through.
func (r *Relay) backoffShards(read map[int16]bool, failed map[int16]error) {
	now := r.cfg.Clock.Now()
	for s := range read {
		st := &r.shards[s]
		err, bad := failed[s]
		if !bad {
			if st.b != nil {
				r.cfg.Logger.Info("idem outbox: the shard publishes again", slog.Int("shard", int(s)), slog.Int("failed_rounds", st.failures))
				*st = shardState{}
			}
			continue
		}
		if st.b == nil {
			p := r.cfg.Backoff
			st.b = &backoff.ExponentialBackOff{InitialInterval: p.Initial, RandomizationFactor: p.Jitter,
				Multiplier: p.Multiplier, MaxInterval: p.Max, Stop: backoff.Stop, Clock: r.cfg.Clock}
			st.b.Reset()
		}
		d := st.b.NextBackOff()
		st.until = now.Add(d)
		st.failures++
		level := slog.LevelDebug
		if st.failures == 1 || st.failures%20 == 0 {
			level = slog.LevelWarn // the first failure, then now and then
		}
		r.cfg.Logger.Log(context.Background(), level, "idem outbox: publish failed; the shard's messages wait and are retried",
			slog.Int("shard", int(s)), slog.Int("failed_rounds", st.failures), slog.Duration("retry_in", d), slog.Any("error", err))
	}
}

// purge deletes sent rows past Retention, in bounded batches, when it is
// time to.
func (r *Relay) purge(ctx context.Context) {
	if r.cfg.Retention <= 0 {
		return
	}
	now := r.cfg.Clock.Now()
	if now.Sub(r.lastPurge) < r.cfg.PurgeEvery {
		return
	}
	r.lastPurge = now
	for ctx.Err() == nil {
		tag, err := r.o.pool.Exec(ctx, r.purgeSQL, r.cfg.Retention.Milliseconds(), r.cfg.PurgeBatch)
		if err != nil {
			if ctx.Err() == nil {
				r.cfg.Logger.Warn("idem outbox: purge failed", slog.Any("error", err))
			}
			return
		}
		r.stats.purged.Add(tag.RowsAffected())
		if tag.RowsAffected() < int64(r.cfg.PurgeBatch) {
			return
		}
	}
}
