package pgstore

// A claim, in the order it runs: Claim (a batch) or claimOne (one key)
// sends the INSERT with its wait bounded (sendClaim: in partitioned mode
// the keys' advisory locks first; sendBounded otherwise), reads which keys
// it inserted, looks up the others, and turns a timed-out wait into
// dedup.ErrInFlight (claimErr). RecordFailure writes a key's 'failed' row
// the same way, in a transaction of its own. Then the batch's encoding:
// five text parameters (claimBuf) that inputSQL unpacks on the server.

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/internal/retention"
	"github.com/idemkit/idem/internal/shorten"
)

// Claim claims keys in tx with one INSERT … ON CONFLICT DO NOTHING; see
// dedup.Store. One key goes as a plain INSERT … VALUES (claimOne). A
// batch travels as five text parameters (fields joined by U+001F, which
// valid keys cannot contain) and is split by string_to_array on the
// server: encoding a Go []string as text[] costs an allocation per
// element, this costs one per batch. The insert answers with the ordinals
// of the claims it inserted; the rest are looked up in a second statement,
// which also sees rows committed while the insert waited.
func (s *Store) Claim(ctx context.Context, tx pgx.Tx, claims []dedup.Claim, results []dedup.Result) error {
	n := len(claims)
	if len(results) < n {
		return fmt.Errorf("pgstore: %d results for %d claims", len(results), n)
	}
	if n == 0 {
		return nil
	}
	clear(results[:n]) // a result left from an earlier batch must not stand
	if s.part != nil {
		if err := s.partitionsReady(ctx); err != nil {
			return err
		}
	}
	if n == 1 {
		return s.claimOne(ctx, tx, &claims[0], &results[0])
	}
	buf := s.bufs.Get().(*claimBuf)
	defer s.bufs.Put(buf)
	buf.encode(claims, s.retentionMillis)

	br, err := s.sendClaim(ctx, tx, s.insertSQL, buf.args[:]...)
	if err != nil {
		return s.claimErr(err)
	}
	rows, err := br.Query()
	if err != nil {
		br.Close()
		return s.claimErr(err)
	}
	inserted := 0
	for rows.Next() {
		i, err := ordinal(rows)
		if err != nil || i < 1 || i > n {
			rows.Close()
			br.Close()
			return s.claimErr(fmt.Errorf("bad ordinal %d: %v", i, err))
		}
		results[i-1] = dedup.Result{Status: dedup.StatusNew}
		inserted++
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		br.Close()
		return s.claimErr(err)
	}
	if err := s.closeBounded(br); err != nil {
		return s.claimErr(err)
	}
	if inserted == n {
		return nil
	}

	// Not inserted: committed before (by others, or by a claim earlier in
	// this batch). Compare fingerprints on the server.
	var rest []byte
	for i := range claims {
		if results[i].Status == 0 {
			if len(rest) > 0 {
				rest = append(rest, ',')
			}
			rest = strconv.AppendInt(rest, int64(i+1), 10)
		}
	}
	// Planned afresh each time (an unnamed statement): a prepared statement
	// gets a generic plan cached after five runs, built on the table's size
	// back then — a hash join over a full scan of what has become a large
	// table (found by idem-bench). Exec mode infers parameter types from Go
	// types, so the text parameters go as strings here.
	lrows, err := tx.Query(ctx, s.lookupSQL, pgx.QueryExecModeExec,
		string(buf.scopes), string(buf.keys), string(buf.fps), string(buf.srcs), string(buf.rets), string(rest))
	if err != nil {
		return s.claimErr(err)
	}
	for lrows.Next() {
		var i int32
		var same, failed bool
		var reason string
		var first time.Time
		if err := lrows.Scan(&i, &same, &failed, &reason, &first); err != nil {
			lrows.Close()
			return s.claimErr(err)
		}
		switch {
		case !same:
			results[i-1] = dedup.Result{Status: dedup.StatusMismatch, FirstAt: first}
		case failed:
			results[i-1] = dedup.Result{Status: dedup.StatusFailed, Reason: reason, FirstAt: first}
		default:
			results[i-1] = dedup.Result{Status: dedup.StatusDuplicate, FirstAt: first}
		}
	}
	lrows.Close()
	if err := lrows.Err(); err != nil {
		return s.claimErr(err)
	}
	for i := range claims {
		if results[i].Status == 0 {
			return fmt.Errorf("%w: key %s vanished during the claim (purged?)", dedup.ErrInFlight, claims[i].Key)
		}
	}
	return nil
}

// claimOne claims one key (BatchSize 1, or a batch of one): a plain
// INSERT … VALUES … ON CONFLICT DO NOTHING, and when it inserted nothing,
// the stored row by its primary key. The set-based statement's unpacking,
// sort, join and aggregate cost the database more than the insert itself
// for one key (2.5× a plain INSERT's CPU, issue 29), and its lookup, which
// must be planned afresh for a batch, is a primary-key read here: both are
// prepared statements, their generic plans an index probe whatever the
// table's size (TestOneKeyLookupPlan). The same rows, statuses and errors
// as a batch of one (TestOneKeyClaimStoresWhatABatchStores); the lookup
// runs in a statement of its own, so it sees a row committed while the
// insert waited.
func (s *Store) claimOne(ctx context.Context, tx pgx.Tx, c *dedup.Claim, res *dedup.Result) error {
	var src any // NULL without a source, as nullif(src, '') in a batch
	if c.Source != "" {
		src = cleanSource(c.Source)
	}
	br, err := s.sendClaim(ctx, tx, s.insertOneSQL, c.Key.Scope, c.Key.ID, c.Fingerprint[:], src, s.retentionMillis(c.Key.Scope))
	if err != nil {
		return s.claimErr(err)
	}
	tag, err := br.Exec()
	if err != nil {
		br.Close()
		return s.claimErr(err)
	}
	if err := s.closeBounded(br); err != nil {
		return s.claimErr(err)
	}
	if tag.RowsAffected() == 1 {
		*res = dedup.Result{Status: dedup.StatusNew}
		return nil
	}
	var same, failed bool
	var reason string
	var first time.Time
	err = tx.QueryRow(ctx, s.lookupOneSQL, c.Key.Scope, c.Key.ID, c.Fingerprint[:]).Scan(&same, &failed, &reason, &first)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("%w: key %s vanished during the claim (purged?)", dedup.ErrInFlight, c.Key)
	case err != nil:
		return s.claimErr(err)
	case !same:
		*res = dedup.Result{Status: dedup.StatusMismatch, FirstAt: first}
	case failed:
		*res = dedup.Result{Status: dedup.StatusFailed, Reason: reason, FirstAt: first}
	default:
		*res = dedup.Result{Status: dedup.StatusDuplicate, FirstAt: first}
	}
	return nil
}

// sendClaim is sendBounded for a claim's INSERT, whose first two
// arguments are the scopes and keys: in partitioned mode the keys' locks
// go first, in a statement of their own (so that the INSERT's snapshot is
// taken after them), in the same round trip.
func (s *Store) sendClaim(ctx context.Context, tx pgx.Tx, sql string, args ...any) (pgx.BatchResults, error) {
	if s.part == nil {
		return s.sendBounded(ctx, tx, sql, args...)
	}
	var b pgx.Batch
	b.Queue(`SELECT set_config('lock_timeout', $1, true)`, s.lockTimeout)
	b.Queue(s.lockSQL, args[0], args[1])
	b.Queue(sql, args...)
	br := tx.SendBatch(ctx, &b)
	_, err := br.Exec()
	var n int64
	var iso string
	if err == nil {
		err = br.QueryRow().Scan(&n, &iso)
	}
	if err == nil && iso != "read committed" {
		err = fmt.Errorf("%w, not %s: the look for a key after its lock needs a snapshot taken after the lock", ErrPartitionedIsolation, iso)
	}
	if err != nil {
		br.Close()
		return nil, err
	}
	return br, nil
}

// ErrPartitionedIsolation: a claim of a store with PartitionWidth in a
// transaction that is not READ COMMITTED (InTx begins its transactions
// so): under REPEATABLE READ the INSERT's snapshot would be older than the
// key's lock, and miss the row the lock's previous holder committed.
var ErrPartitionedIsolation = errors.New("pgstore: Config.PartitionWidth claims in READ COMMITTED transactions")

// queueBounded queues sql with its wait on a concurrent writer bounded: by
// lock_timeout for the transaction, or in distributed mode (where
// lock_timeout is not honoured for row locks) by statement_timeout set
// around the statement alone. It returns how many statements come before
// sql in b; in distributed mode one more follows it.
func (s *Store) queueBounded(b *pgx.Batch, sql string, args ...any) (before int) {
	if !s.cfg.Distributed {
		b.Queue(`SELECT set_config('lock_timeout', $1, true)`, s.lockTimeout)
		b.Queue(sql, args...)
		return 1
	}
	b.Queue(s.boundSQL[0])
	b.Queue(s.boundSQL[1], s.lockTimeout)
	b.Queue(sql, args...)
	b.Queue(s.boundSQL[2])
	return 2
}

// sendBounded sends sql queued by queueBounded and reads the results of
// the statements ahead of it: what br has left to read is sql's result and,
// in distributed mode, the restore of statement_timeout. On an error the
// batch is closed.
func (s *Store) sendBounded(ctx context.Context, tx pgx.Tx, sql string, args ...any) (pgx.BatchResults, error) {
	var b pgx.Batch
	before := s.queueBounded(&b, sql, args...)
	br := tx.SendBatch(ctx, &b)
	for range before {
		if _, err := br.Exec(); err != nil {
			br.Close()
			return nil, err
		}
	}
	return br, nil
}

// closeBounded reads, in distributed mode, the restore of
// statement_timeout that follows the statement sendBounded sent, and
// closes br.
func (s *Store) closeBounded(br pgx.BatchResults) error {
	if s.cfg.Distributed {
		if _, err := br.Exec(); err != nil { // statement_timeout restored
			br.Close()
			return err
		}
	}
	return br.Close()
}

// claimErr is boundedErr for a claim; in partitioned mode, a key beyond
// the partitions made has them made and is dedup.ErrInFlight too.
func (s *Store) claimErr(err error) error {
	if s.part != nil && noPartition(err) {
		// A row beyond the partitions made: create them, and let the
		// consumer retry.
		pctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if perr := s.ensurePartitions(pctx); perr != nil {
			err = errors.Join(err, perr)
		}
		cancel()
		// Not wrapped: its SQLSTATE (23514) would classify it permanent.
		return fmt.Errorf("%w (no partition for the key's expiry yet, now made): %v", dedup.ErrInFlight, err)
	}
	return s.boundedErr("claim", err)
}

// boundedErr turns the end of a wait bounded by queueBounded into
// dedup.ErrInFlight: a lock timeout, and in distributed mode a statement
// timeout (the statement ran out of statement_timeout, most likely waiting
// on a row another transaction holds, or slow enough that retrying later
// is right anyway). Other errors are wrapped with what failed.
func (s *Store) boundedErr(what string, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "55P03" {
		return fmt.Errorf("%w (lock_timeout %s): %w", dedup.ErrInFlight, s.lockTimeout, err)
	}
	if s.cfg.Distributed && errors.As(err, &pgErr) && pgErr.Code == "57014" {
		return fmt.Errorf("%w (statement_timeout %s on the %s): %w", dedup.ErrInFlight, s.lockTimeout, what, err)
	}
	return fmt.Errorf("pgstore: %s: %w", what, err)
}

// RecordFailure inserts a 'failed' row in its own transaction; see
// dedup.Store.
func (s *Store) RecordFailure(ctx context.Context, c dedup.Claim, reason string) error {
	args := []any{c.Key.Scope, c.Key.ID, c.Fingerprint[:], c.Source, shorten.Reason(reason), s.retentionMillis(c.Key.Scope)}
	var err error
	if s.part != nil {
		err = s.partitionsReady(ctx)
		if err == nil {
			err = s.recordFailurePartitioned(ctx, args...)
		}
	} else {
		_, err = s.pool.Exec(ctx, s.failSQL, args...)
	}
	if err != nil {
		return fmt.Errorf("pgstore: record failure: %w", err)
	}
	return nil
}

// recordFailurePartitioned is RecordFailure's transaction in partitioned
// mode: the key's lock, then the row where no partition holds the key.
func (s *Store) recordFailurePartitioned(ctx context.Context, args ...any) error {
	return pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, s.lockSQL, args[0], args[1]); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, s.failSQL, args...)
		return err
	})
}

// inputSQL unpacks a claim batch: five text parameters, fields separated by
// U+001F, into rows with their 1-based ordinal.
const inputSQL = `SELECT u.s, u.k, decode(u.f, 'hex') AS f, nullif(u.src, '') AS src, nullif(u.r, '')::bigint AS r, u.i
    FROM unnest(string_to_array($1::text, E'\x1f'), string_to_array($2::text, E'\x1f'),
                string_to_array($3::text, E'\x1f'), string_to_array($4::text, E'\x1f'),
                string_to_array($5::text, E'\x1f')) WITH ORDINALITY AS u(s, k, f, src, r, i)`

// claimBuf holds one batch's parameters; pooled per Store.
type claimBuf struct {
	scopes, keys, fps, srcs, rets []byte
	args                          [5]any
}

const sep = '\x1f'

func (b *claimBuf) encode(claims []dedup.Claim, retention func(string) int64) {
	b.scopes, b.keys, b.fps, b.srcs, b.rets = b.scopes[:0], b.keys[:0], b.fps[:0], b.srcs[:0], b.rets[:0]
	for i := range claims {
		c := &claims[i]
		if i > 0 {
			b.scopes, b.keys, b.fps, b.srcs, b.rets = append(b.scopes, sep), append(b.keys, sep), append(b.fps, sep), append(b.srcs, sep), append(b.rets, sep)
		}
		b.scopes = append(b.scopes, c.Key.Scope...)
		b.keys = append(b.keys, c.Key.ID...)
		b.fps = hex.AppendEncode(b.fps, c.Fingerprint[:])
		b.srcs = appendClean(b.srcs, c.Source)
		if r := retention(c.Key.Scope); r >= 0 {
			b.rets = strconv.AppendInt(b.rets, r, 10)
		}
	}
	b.args = [5]any{b.scopes, b.keys, b.fps, b.srcs, b.rets}
}

// appendClean appends an audit string with control characters (and so the
// separator) replaced.
func appendClean(dst []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == 0x7f {
			dst = append(dst, '?')
		} else {
			dst = append(dst, c)
		}
	}
	return dst
}

// cleanSource is appendClean of one audit string, without a copy when
// there is nothing to replace.
func cleanSource(s string) string {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == 0x7f {
			return string(appendClean(nil, s))
		}
	}
	return s
}

// ordinal reads an int4 column without the allocations of Scan.
func ordinal(rows pgx.Rows) (int, error) {
	fd := rows.FieldDescriptions()
	raw := rows.RawValues()
	if len(fd) == 1 && fd[0].Format == pgx.BinaryFormatCode && len(raw) == 1 && len(raw[0]) == 4 {
		return int(int32(binary.BigEndian.Uint32(raw[0]))), nil
	}
	var i int32
	err := rows.Scan(&i)
	return int(i), err
}

// retentionMillis returns the retention of scope in ms, -1 for forever.
func (s *Store) retentionMillis(scope string) int64 {
	d, ok := retention.Of(s.cfg.Retention, s.cfg.ScopeRetention, scope)
	if !ok {
		return -1
	}
	return d.Milliseconds()
}
