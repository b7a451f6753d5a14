package pgstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem/dedup"
)

// Offsets in the store: the table <Table>_offsets (migration 003) holds one
// row per (scope, topic, partition) with the next offset not yet settled;
// see dedup.OffsetStore.
//
// AdvanceOffset is a compare-and-set on the stored next offset — an UPDATE
// … WHERE next_offset = expected — not a generation number. The next
// offset is itself the fence: it only grows, so a writer that read it
// before another writer moved it (a consumer that lost its partition in a
// rebalance and has not noticed) finds it changed and is refused, whatever
// the broker's generations did in between. Under READ COMMITTED a
// concurrent UPDATE of the row waits for the holder of the row lock and then
// re-checks the WHERE clause on the committed row, so of two racing
// writers exactly one holds.
type offsetQueries struct {
	next, advance, insert, all, reset string
}

func newOffsetQueries(t string) offsetQueries {
	const key = `scope = $1 AND topic = $2 AND partition = $3`
	return offsetQueries{
		next: `SELECT next_offset FROM ` + t + ` WHERE ` + key,
		advance: `UPDATE ` + t + ` SET next_offset = $5, updated_at = now()
WHERE ` + key + ` AND next_offset = $4`,
		insert: `INSERT INTO ` + t + ` (scope, topic, partition, next_offset) VALUES ($1, $2, $3, $4)
ON CONFLICT (scope, topic, partition) DO NOTHING`,
		all:   `SELECT partition, next_offset FROM ` + t + ` WHERE scope = $1 AND topic = $2`,
		reset: `DELETE FROM ` + t + ` WHERE scope = $1 AND topic = $2`,
	}
}

// OffsetsTable returns the sanitized, schema-qualified name of the offsets
// table.
func (s *Store) OffsetsTable() string { return s.offsets }

// NextOffset returns p's next offset in tx; see dedup.OffsetStore. On
// Postgres a read never waits for a writer of the row; in distributed mode
// it can (CockroachDB's reads wait for a conflicting uncommitted write), so
// there it is bounded as a claim is, by statement_timeout set to
// Config.LockTimeout around the read alone, and a read that runs out
// fails with dedup.ErrInFlight.
func (s *Store) NextOffset(ctx context.Context, tx pgx.Tx, p dedup.Partition) (int64, error) {
	var next int64
	var err error
	if s.cfg.Distributed {
		err = s.nextBounded(ctx, tx, p, &next)
	} else {
		err = tx.QueryRow(ctx, s.offSQL.next, p.Scope, p.Topic, p.Partition).Scan(&next)
	}
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return 0, nil
	case err != nil:
		return 0, s.offsetErr("read", p, err)
	}
	return next, nil
}

// nextBounded reads p's next offset into next, its wait bounded (see
// queueBounded).
func (s *Store) nextBounded(ctx context.Context, tx pgx.Tx, p dedup.Partition, next *int64) error {
	br, err := s.sendBounded(ctx, tx, s.offSQL.next, p.Scope, p.Topic, p.Partition)
	if err != nil {
		return err
	}
	err = br.QueryRow().Scan(next)
	if err == nil || errors.Is(err, pgx.ErrNoRows) {
		if _, rerr := br.Exec(); rerr != nil { // statement_timeout restored
			err = rerr
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return err
}

// AdvanceOffset moves p's next offset from expected to next in tx, if it
// still is expected; see dedup.OffsetStore. It waits at most
// Config.LockTimeout for a concurrent writer of the row.
func (s *Store) AdvanceOffset(ctx context.Context, tx pgx.Tx, p dedup.Partition, expected, next int64) (bool, error) {
	if expected < 0 || next < expected || next == expected && expected == 0 {
		return false, fmt.Errorf("pgstore: advance %s: next offset %d is not above the expected %d (nor equal to it, above 0: a hold)", partName(p), next, expected)
	}
	// The wait on a concurrent writer is bounded as a claim's is.
	var br pgx.BatchResults
	var err error
	if expected == 0 {
		br, err = s.sendBounded(ctx, tx, s.offSQL.insert, p.Scope, p.Topic, p.Partition, next)
	} else {
		br, err = s.sendBounded(ctx, tx, s.offSQL.advance, p.Scope, p.Topic, p.Partition, expected, next)
	}
	if err != nil {
		return false, s.offsetErr("advance", p, err)
	}
	tag, err := br.Exec()
	if err == nil && s.cfg.Distributed {
		_, err = br.Exec()
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return false, s.offsetErr("advance", p, err)
	}
	return tag.RowsAffected() == 1, nil
}

// NextOffsets returns the next offsets of scope's partitions of topic; see
// dedup.OffsetStore.
func (s *Store) NextOffsets(ctx context.Context, scope, topic string) (map[int32]int64, error) {
	rows, err := s.pool.Query(ctx, s.offSQL.all, scope, topic)
	if err != nil {
		return nil, fmt.Errorf("pgstore: next offsets of %s %s: %w", scope, topic, err)
	}
	defer rows.Close()
	out := make(map[int32]int64)
	for rows.Next() {
		var part int32
		var next int64
		if err := rows.Scan(&part, &next); err != nil {
			return nil, fmt.Errorf("pgstore: next offsets of %s %s: %w", scope, topic, err)
		}
		out[part] = next
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("pgstore: next offsets of %s %s: %w", scope, topic, err)
	}
	return out, nil
}

// ResetOffsets deletes the offsets rows of scope's partitions of topic and
// returns how many it deleted: the consumer then takes every message it is
// delivered of that topic as new. For a topic that was deleted and created
// again (dedup.ErrOffsetsAhead): stop the consumers of scope, reset, start
// them. Resetting while the old log still exists applies its messages again.
func (s *Store) ResetOffsets(ctx context.Context, scope, topic string) (int, error) {
	tag, err := s.pool.Exec(ctx, s.offSQL.reset, scope, topic)
	if err != nil {
		return 0, fmt.Errorf("pgstore: reset offsets of %s %s: %w", scope, topic, err)
	}
	return int(tag.RowsAffected()), nil
}

// offsetErr turns a lock timeout into dedup.ErrInFlight, like a claim's.
func (s *Store) offsetErr(op string, p dedup.Partition, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "55P03" {
		return fmt.Errorf("%w: offset of %s (lock_timeout %s): %w", dedup.ErrInFlight, partName(p), s.lockTimeout, err)
	}
	if s.cfg.Distributed && errors.As(err, &pgErr) && pgErr.Code == "57014" {
		return fmt.Errorf("%w: offset of %s (statement_timeout %s): %w", dedup.ErrInFlight, partName(p), s.lockTimeout, err)
	}
	return fmt.Errorf("pgstore: %s offset of %s: %w", op, partName(p), err)
}

func partName(p dedup.Partition) string {
	return fmt.Sprintf("%s %s/%d", p.Scope, p.Topic, p.Partition)
}

var _ dedup.OffsetStore[pgx.Tx] = (*Store)(nil)
