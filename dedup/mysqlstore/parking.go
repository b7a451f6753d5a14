package mysqlstore

// Parked keys (dedup.Parking) are the table <Table>_parked_keys, a row per
// parked record key, and their messages the table <Table>_parked, a row
// per message with its position in the key's list (migrations 008 and
// 009). A key's row is the lock of its messages: every change takes it
// first, exclusively, in a short transaction of its own; InnoDB's waits
// are bounded by innodb_lock_wait_timeout (Config.LockTimeout) and
// reported as dedup.ErrInFlight.
//
// CheckParked asks first, in one statement outside any transaction,
// whether any key of the call is parked; most calls find none and are
// done. Otherwise a transaction locks the rows of the parked keys found,
// in primary key order (FORCE INDEX, point ranges: the same order for
// every call, so that calls on crossed key sets do not deadlock, and no
// lock on a key not parked, no gap lock under REPEATABLE READ), reads
// which of the call's messages are in their lists, decides the messages
// in Go in their order (internal/storekit/parkrule), and writes the
// followers added and the keys expired.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/internal/storekit/parkrule"
	"github.com/idemkit/idem/internal/storekit/rowscan"
)

// parkChunk bounds the keys, or messages, of one statement.
const parkChunk = 1000

// parkedKey is a key of a CheckParked call as it found it locked.
type parkedKey struct {
	parkrule.Key
	nextPos int64
}

// queryer is a *sql.DB or a *sql.Tx.
type queryer interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

const parkKeyCond = "(scope = ? AND topic = ? AND `key` = ?)"

// CheckParked decides each ref in order, adding followers to their keys;
// see dedup.Parking. When no key of refs is parked it is one statement
// (per 1,000 keys); else one transaction.
func (s *Store) CheckParked(ctx context.Context, refs []dedup.ParkRef, limits dedup.ParkLimits, now time.Time, out []dedup.ParkDecision) error {
	if len(out) < len(refs) {
		return fmt.Errorf("mysqlstore: %d decisions for %d parked refs", len(out), len(refs))
	}
	for _, r := range refs {
		if err := r.Validate(); err != nil {
			return fmt.Errorf("mysqlstore: check parked: %w", err)
		}
	}
	found, err := s.readParked(ctx, s.db, parkrule.Keys(refs), false)
	if err != nil {
		return s.parkErr("check parked", err)
	}
	if len(found) == 0 {
		for i := range refs {
			out[i] = dedup.ParkDecision{Action: dedup.ParkTry}
		}
		return nil
	}
	keys := make([]dedup.ParkKey, 0, len(found))
	for k := range found {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, parkrule.Compare)
	return s.parkErr("check parked", s.InTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		parked, err := s.readParked(ctx, tx, keys, true)
		if err != nil {
			return err
		}
		if err := s.readMembers(ctx, tx, refs, parked); err != nil {
			return err
		}
		for i, r := range refs {
			if pk := parked[r.ParkKey]; pk != nil {
				out[i] = pk.Decide(r.ID, limits, now)
			} else {
				out[i] = dedup.ParkDecision{Action: dedup.ParkTry}
			}
		}
		return s.writeParked(ctx, tx, keys, parked)
	}))
}

// readParked reads which of keys are parked; locked, it locks their rows
// in primary key order (keys is in that order).
func (s *Store) readParked(ctx context.Context, q queryer, keys []dedup.ParkKey, locked bool) (map[dedup.ParkKey]*parkedKey, error) {
	parked := make(map[dedup.ParkKey]*parkedKey)
	var b strings.Builder
	var args []any
	for chunk := range slices.Chunk(keys, parkChunk) {
		b.Reset()
		args = args[:0]
		b.WriteString("SELECT scope, topic, `key`, head, head_delay_ns, depth, next_pos, head_since, expired FROM " + s.parkedKeys + " FORCE INDEX (PRIMARY) WHERE ")
		for i, k := range chunk {
			if i > 0 {
				b.WriteString(" OR ")
			}
			b.WriteString(parkKeyCond)
			args = append(args, k.Scope, k.Topic, []byte(k.Key))
		}
		if locked {
			b.WriteString(" ORDER BY scope, topic, `key` FOR UPDATE")
		}
		rows, err := q.QueryContext(ctx, b.String(), args...)
		if err != nil {
			return nil, err
		}
		for rows.Next() {
			var k dedup.ParkKey
			var key []byte
			var delay, since int64
			pk := new(parkedKey)
			if err := rows.Scan(&k.Scope, &k.Topic, &key, &pk.Head, &delay, &pk.Depth, &pk.nextPos, &since, &pk.Expired); err != nil {
				rows.Close()
				return nil, err
			}
			k.Key, pk.HeadDelay, pk.HeadSince = string(key), time.Duration(delay), time.UnixMicro(since)
			parked[k] = pk
		}
		if err := errors.Join(rows.Close(), rows.Err()); err != nil {
			return nil, err
		}
	}
	return parked, nil
}

// readMembers marks which of refs are in their parked keys' lists. The
// keys' rows are locked: their lists do not change meanwhile, and the
// read, the first plain one of the transaction, sees what their last
// holders committed also under REPEATABLE READ.
func (s *Store) readMembers(ctx context.Context, tx *sql.Tx, refs []dedup.ParkRef, parked map[dedup.ParkKey]*parkedKey) error {
	var ofParked []dedup.ParkRef
	for _, r := range refs {
		if parked[r.ParkKey] != nil {
			ofParked = append(ofParked, r)
		}
	}
	var b strings.Builder
	var args []any
	for chunk := range slices.Chunk(ofParked, parkChunk) {
		b.Reset()
		args = args[:0]
		b.WriteString("SELECT scope, topic, `key`, id FROM " + s.parked + " FORCE INDEX (PRIMARY) WHERE ")
		for i, r := range chunk {
			if i > 0 {
				b.WriteString(" OR ")
			}
			b.WriteString("(scope = ? AND topic = ? AND `key` = ? AND id = ?)")
			args = append(args, r.Scope, r.Topic, []byte(r.Key), r.ID)
		}
		rows, err := tx.QueryContext(ctx, b.String(), args...)
		if err != nil {
			return err
		}
		for rows.Next() {
			var k dedup.ParkKey
			var key []byte
			var id string
			if err := rows.Scan(&k.Scope, &k.Topic, &key, &id); err != nil {
				rows.Close()
				return err
			}
			k.Key = string(key)
			if pk := parked[k]; pk != nil {
				if pk.Members == nil {
					pk.Members = make(map[string]bool)
				}
				pk.Members[id] = true
			}
		}
		if err := errors.Join(rows.Close(), rows.Err()); err != nil {
			return err
		}
	}
	return nil
}

// writeParked writes what a CheckParked call changed, key by key in keys'
// order: the followers added at the key's tail, its depth, next position
// and expiry, or the key and its list deleted when it was released.
func (s *Store) writeParked(ctx context.Context, tx *sql.Tx, keys []dedup.ParkKey, parked map[dedup.ParkKey]*parkedKey) error {
	var b strings.Builder
	var args []any
	for _, k := range keys {
		pk := parked[k]
		if pk == nil || !pk.Changed() {
			continue
		}
		if pk.Release {
			for _, table := range []string{s.parked, s.parkedKeys} {
				if _, err := tx.ExecContext(ctx, "DELETE FROM "+table+" WHERE "+parkKeyCond, k.Scope, k.Topic, []byte(k.Key)); err != nil {
					return err
				}
			}
			continue
		}
		for chunk := range slices.Chunk(pk.Added, parkChunk) {
			b.Reset()
			args = args[:0]
			b.WriteString("INSERT INTO " + s.parked + " (scope, topic, `key`, id, pos) VALUES ")
			for i, id := range chunk {
				if i > 0 {
					b.WriteByte(',')
				}
				b.WriteString("(?, ?, ?, ?, ?)")
				args = append(args, k.Scope, k.Topic, []byte(k.Key), id, pk.nextPos)
				pk.nextPos++
			}
			if _, err := tx.ExecContext(ctx, b.String(), args...); err != nil {
				return err
			}
		}
		if _, err := tx.ExecContext(ctx, "UPDATE "+s.parkedKeys+" SET depth = ?, next_pos = ?, expired = ? WHERE "+parkKeyCond,
			pk.Depth, pk.nextPos, pk.Expired, k.Scope, k.Topic, []byte(k.Key)); err != nil {
			return err
		}
	}
	return nil
}

// Park records that ref went to retry with delay; see dedup.Parking. The
// key's row is inserted or locked first (a no-op update: INSERT IGNORE
// would take a shared lock, and two calls upgrading theirs deadlock),
// then ref added at its tail.
func (s *Store) Park(ctx context.Context, ref dedup.ParkRef, delay time.Duration, now time.Time) error {
	if err := ref.Validate(); err != nil {
		return fmt.Errorf("mysqlstore: park: %w", err)
	}
	key := []byte(ref.Key)
	return s.parkErr("park", s.InTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, "INSERT INTO "+s.parkedKeys+
			" (scope, topic, `key`, head, head_delay_ns, depth, next_pos, parked_at, head_since) VALUES (?, ?, ?, ?, ?, 0, 0, ?, ?)"+
			" ON DUPLICATE KEY UPDATE depth = depth", ref.Scope, ref.Topic, key, ref.ID, int64(delay), now.UnixMicro(), now.UnixMicro()); err != nil {
			return err
		}
		var head string
		var next int64
		if err := tx.QueryRowContext(ctx, "SELECT head, next_pos FROM "+s.parkedKeys+" WHERE "+parkKeyCond+" FOR UPDATE",
			ref.Scope, ref.Topic, key).Scan(&head, &next); err != nil {
			return err
		}
		res, err := tx.ExecContext(ctx, "INSERT INTO "+s.parked+" (scope, topic, `key`, id, pos) VALUES (?, ?, ?, ?, ?) ON DUPLICATE KEY UPDATE pos = pos",
			ref.Scope, ref.Topic, key, ref.ID, next)
		if err != nil {
			return err
		}
		added, err := res.RowsAffected()
		if err != nil {
			return err
		}
		if added == 0 && head != ref.ID {
			return nil
		}
		_, err = tx.ExecContext(ctx, "UPDATE "+s.parkedKeys+" SET depth = depth + ?, next_pos = next_pos + ?,"+
			" head_delay_ns = IF(head = ?, ?, head_delay_ns) WHERE "+parkKeyCond, added, added, ref.ID, int64(delay), ref.Scope, ref.Topic, key)
		return err
	}))
}

// Unpark removes ref from its key; see dedup.Parking. A new head keeps the
// key's HeadDelay: it went to retry as a follower with that delay.
func (s *Store) Unpark(ctx context.Context, ref dedup.ParkRef, now time.Time) error {
	if err := ref.Validate(); err != nil {
		return fmt.Errorf("mysqlstore: unpark: %w", err)
	}
	key := []byte(ref.Key)
	return s.parkErr("unpark", s.InTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		var head string
		var depth int
		err := tx.QueryRowContext(ctx, "SELECT head, depth FROM "+s.parkedKeys+" WHERE "+parkKeyCond+" FOR UPDATE",
			ref.Scope, ref.Topic, key).Scan(&head, &depth)
		if errors.Is(err, sql.ErrNoRows) {
			return nil // not parked
		}
		if err != nil {
			return err
		}
		res, err := tx.ExecContext(ctx, "DELETE FROM "+s.parked+" WHERE "+parkKeyCond+" AND id = ?", ref.Scope, ref.Topic, key, ref.ID)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil || n == 0 {
			return err // not in the key's list
		}
		switch {
		case depth <= 1:
			_, err = tx.ExecContext(ctx, "DELETE FROM "+s.parkedKeys+" WHERE "+parkKeyCond, ref.Scope, ref.Topic, key)
			return err
		case head != ref.ID:
			_, err = tx.ExecContext(ctx, "UPDATE "+s.parkedKeys+" SET depth = depth - 1 WHERE "+parkKeyCond, ref.Scope, ref.Topic, key)
			return err
		}
		var next string
		if err := tx.QueryRowContext(ctx, "SELECT id FROM "+s.parked+" WHERE "+parkKeyCond+" ORDER BY pos LIMIT 1",
			ref.Scope, ref.Topic, key).Scan(&next); err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, "UPDATE "+s.parkedKeys+" SET depth = depth - 1, head = ?, head_since = ? WHERE "+parkKeyCond,
			next, now.UnixMicro(), ref.Scope, ref.Topic, key)
		return err
	}))
}

// parkErr names a missing table (1146) as dedup.ErrNotMigrated and a lock
// wait that ran out as dedup.ErrInFlight (lockErr).
func (s *Store) parkErr(op string, err error) error {
	var me *mysql.MySQLError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &me) && me.Number == erNoSuchTable:
		return fmt.Errorf("%w: mysqlstore: %s: %s does not exist: run Store.Migrate (idem migrate): %w", dedup.ErrNotMigrated, op, s.parkedKeys, err)
	}
	return s.lockErr(op, err)
}

// Parked lists the parked keys f selects, oldest first; see dedup.Parking.
func (s *Store) Parked(ctx context.Context, f dedup.ParkFilter) ([]dedup.ParkedKey, error) {
	limit := f.Limit
	if limit <= 0 {
		limit = 100
	}
	var conds []string
	var args []any
	if f.Scope != "" {
		conds, args = append(conds, "scope = ?"), append(args, f.Scope)
	}
	if f.Topic != "" {
		conds, args = append(conds, "topic = ?"), append(args, f.Topic)
	}
	if f.Key != "" {
		conds, args = append(conds, "`key` = ?"), append(args, []byte(f.Key))
	}
	where := ""
	if len(conds) > 0 {
		where = " WHERE " + strings.Join(conds, " AND ")
	}
	keys, err := rowscan.ParkedKeys(s.db.QueryContext(ctx, "SELECT scope, topic, `key`, head, head_delay_ns, depth, parked_at, head_since, expired FROM "+
		s.parkedKeys+where+" ORDER BY parked_at, scope, topic, `key` LIMIT ?", append(args, limit)...))
	if err != nil {
		return nil, s.parkErr("parked", err)
	}
	return keys, nil
}

// ParkStats counts the parked keys and finds the oldest; see
// dedup.Parking.
func (s *Store) ParkStats(ctx context.Context) (dedup.ParkStats, error) {
	var st dedup.ParkStats
	var oldest sql.NullInt64
	if err := s.db.QueryRowContext(ctx, "SELECT count(*), min(parked_at) FROM "+s.parkedKeys).Scan(&st.Keys, &oldest); err != nil {
		return dedup.ParkStats{}, s.parkErr("park stats", err)
	}
	if oldest.Valid {
		st.Oldest = time.UnixMicro(oldest.Int64)
	}
	return st, nil
}

var _ dedup.Parking = (*Store)(nil)
