package sqlitestore

// Parked keys (dedup.Parking) are the table <Table>_parked_keys, a row per
// parked record key, and their messages the table <Table>_parked, a row
// per message with its position in the key's list (migration 008). SQLite
// has one writer at a time: the IMMEDIATE transaction of a change holds
// the database's write lock from its beginning, so concurrent calls are
// serialized whole, a wait bounded by Config.LockTimeout (busy_timeout)
// and surfacing as dedup.ErrStoreBusy.
//
// CheckParked asks first, in one statement outside any transaction,
// whether any key of the call is parked (WAL readers do not wait for the
// writer); most calls find none and are done. Otherwise it reads the
// call's keys and messages in a transaction, decides the messages in Go
// in their order (internal/storekit/parkrule), and writes the followers
// added and the keys expired.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/internal/storekit/parkrule"
	"github.com/idemkit/idem/internal/storekit/rowscan"
)

func (s *Store) parkedKeysTable() string { return `"` + s.cfg.Table + `_parked_keys"` }
func (s *Store) parkedTable() string     { return `"` + s.cfg.Table + `_parked"` }

// parkChunk bounds the keys, or messages, of one statement: four
// variables each at most, under SQLite's limit of 32766 per statement.
const parkChunk = 5000

// parkedKey is a key of a CheckParked call as it found it.
type parkedKey struct {
	parkrule.Key
	nextPos int64
}

// CheckParked decides each ref in order, adding followers to their keys;
// see dedup.Parking. When no key of refs is parked it is one statement
// (per 5,000 keys); else one IMMEDIATE transaction.
func (s *Store) CheckParked(ctx context.Context, refs []dedup.ParkRef, limits dedup.ParkLimits, now time.Time, out []dedup.ParkDecision) error {
	if len(out) < len(refs) {
		return fmt.Errorf("sqlitestore: %d decisions for %d parked refs", len(out), len(refs))
	}
	for _, r := range refs {
		if err := r.Validate(); err != nil {
			return fmt.Errorf("sqlitestore: check parked: %w", err)
		}
	}
	keys := parkrule.Keys(refs)
	parked, err := s.readParked(ctx, s.db, keys, nil)
	if err != nil {
		return s.parkErr("check parked", err)
	}
	if len(parked) == 0 {
		for i := range refs {
			out[i] = dedup.ParkDecision{Action: dedup.ParkTry}
		}
		return nil
	}
	return s.parkErr("check parked", s.InTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		parked, err := s.readParked(ctx, tx, keys, refs)
		if err != nil {
			return err
		}
		for i, r := range refs {
			out[i] = parked[r.ParkKey].decide(r.ID, limits, now)
		}
		return s.writeParked(ctx, tx, keys, parked)
	}))
}

func (pk *parkedKey) decide(id string, limits dedup.ParkLimits, now time.Time) dedup.ParkDecision {
	if pk == nil {
		return dedup.ParkDecision{Action: dedup.ParkTry}
	}
	return pk.Decide(id, limits, now)
}

// readParked reads which of keys are parked, and with refs, which of refs
// are in their keys' lists.
func (s *Store) readParked(ctx context.Context, q querier, keys []dedup.ParkKey, refs []dedup.ParkRef) (map[dedup.ParkKey]*parkedKey, error) {
	parked := make(map[dedup.ParkKey]*parkedKey)
	var b strings.Builder
	var args []any
	for chunk := range slices.Chunk(keys, parkChunk) {
		b.Reset()
		args = args[:0]
		b.WriteString(`WITH v(s, t, k) AS (VALUES `)
		for i, k := range chunk {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(`(?, ?, ?)`)
			args = append(args, k.Scope, k.Topic, []byte(k.Key))
		}
		b.WriteString(`) SELECT p.scope, p.topic, p.key, p.head, p.head_delay_ns, p.depth, p.next_pos, p.head_since, p.expired
FROM v JOIN ` + s.parkedKeysTable() + ` p ON p.scope = v.s AND p.topic = v.t AND p.key = v.k`)
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
		if err := closeRows(rows); err != nil {
			return nil, err
		}
	}
	if refs == nil || len(parked) == 0 {
		return parked, nil
	}
	var ofParked []dedup.ParkRef
	for _, r := range refs {
		if parked[r.ParkKey] != nil {
			ofParked = append(ofParked, r)
		}
	}
	for chunk := range slices.Chunk(ofParked, parkChunk) {
		b.Reset()
		args = args[:0]
		b.WriteString(`WITH v(s, t, k, id) AS (VALUES `)
		for i, r := range chunk {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(`(?, ?, ?, ?)`)
			args = append(args, r.Scope, r.Topic, []byte(r.Key), r.ID)
		}
		b.WriteString(`) SELECT m.scope, m.topic, m.key, m.id
FROM v JOIN ` + s.parkedTable() + ` m ON m.scope = v.s AND m.topic = v.t AND m.key = v.k AND m.id = v.id`)
		rows, err := q.QueryContext(ctx, b.String(), args...)
		if err != nil {
			return nil, err
		}
		for rows.Next() {
			var k dedup.ParkKey
			var key []byte
			var id string
			if err := rows.Scan(&k.Scope, &k.Topic, &key, &id); err != nil {
				rows.Close()
				return nil, err
			}
			k.Key = string(key)
			if pk := parked[k]; pk != nil {
				if pk.Members == nil {
					pk.Members = make(map[string]bool)
				}
				pk.Members[id] = true
			}
		}
		if err := closeRows(rows); err != nil {
			return nil, err
		}
	}
	return parked, nil
}

// closeRows closes rows and returns the error of either.
func closeRows(rows *sql.Rows) error {
	return errors.Join(rows.Close(), rows.Err())
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
			for _, del := range []string{`DELETE FROM ` + s.parkedTable(), `DELETE FROM ` + s.parkedKeysTable()} {
				if _, err := tx.ExecContext(ctx, del+` WHERE scope = ? AND topic = ? AND key = ?`, k.Scope, k.Topic, []byte(k.Key)); err != nil {
					return err
				}
			}
			continue
		}
		for chunk := range slices.Chunk(pk.Added, parkChunk) {
			b.Reset()
			args = args[:0]
			b.WriteString(`INSERT INTO ` + s.parkedTable() + ` (scope, topic, key, id, pos) VALUES `)
			for i, id := range chunk {
				if i > 0 {
					b.WriteByte(',')
				}
				b.WriteString(`(?, ?, ?, ?, ?)`)
				args = append(args, k.Scope, k.Topic, []byte(k.Key), id, pk.nextPos)
				pk.nextPos++
			}
			if _, err := tx.ExecContext(ctx, b.String(), args...); err != nil {
				return err
			}
		}
		if _, err := tx.ExecContext(ctx, `UPDATE `+s.parkedKeysTable()+` SET depth = ?, next_pos = ?, expired = ?
WHERE scope = ? AND topic = ? AND key = ?`, pk.Depth, pk.nextPos, pk.Expired, k.Scope, k.Topic, []byte(k.Key)); err != nil {
			return err
		}
	}
	return nil
}

// Park records that ref went to retry with delay; see dedup.Parking.
func (s *Store) Park(ctx context.Context, ref dedup.ParkRef, delay time.Duration, now time.Time) error {
	if err := ref.Validate(); err != nil {
		return fmt.Errorf("sqlitestore: park: %w", err)
	}
	key := []byte(ref.Key)
	return s.parkErr("park", s.InTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO `+s.parkedKeysTable()+`
    (scope, topic, key, head, head_delay_ns, depth, next_pos, parked_at, head_since) VALUES (?, ?, ?, ?, ?, 0, 0, ?, ?)
ON CONFLICT (scope, topic, key) DO NOTHING`, ref.Scope, ref.Topic, key, ref.ID, int64(delay), now.UnixMicro(), now.UnixMicro()); err != nil {
			return err
		}
		res, err := tx.ExecContext(ctx, `INSERT INTO `+s.parkedTable()+` (scope, topic, key, id, pos)
SELECT scope, topic, key, ?, next_pos FROM `+s.parkedKeysTable()+` WHERE scope = ? AND topic = ? AND key = ?
ON CONFLICT (scope, topic, key, id) DO NOTHING`, ref.ID, ref.Scope, ref.Topic, key)
		if err != nil {
			return err
		}
		added, err := res.RowsAffected()
		if err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, `UPDATE `+s.parkedKeysTable()+` SET depth = depth + ?, next_pos = next_pos + ?,
    head_delay_ns = CASE WHEN head = ? THEN ? ELSE head_delay_ns END
WHERE scope = ? AND topic = ? AND key = ?`, added, added, ref.ID, int64(delay), ref.Scope, ref.Topic, key)
		return err
	}))
}

// Unpark removes ref from its key; see dedup.Parking. A new head keeps the
// key's HeadDelay: it went to retry as a follower with that delay.
func (s *Store) Unpark(ctx context.Context, ref dedup.ParkRef, now time.Time) error {
	if err := ref.Validate(); err != nil {
		return fmt.Errorf("sqlitestore: unpark: %w", err)
	}
	key := []byte(ref.Key)
	return s.parkErr("unpark", s.InTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		return s.unpark(ctx, tx, ref, key, now)
	}))
}

func (s *Store) unpark(ctx context.Context, tx *sql.Tx, ref dedup.ParkRef, key []byte, now time.Time) error {
	const byKey = ` WHERE scope = ? AND topic = ? AND key = ?`
	res, err := tx.ExecContext(ctx, `DELETE FROM `+s.parkedTable()+byKey+` AND id = ?`, ref.Scope, ref.Topic, key, ref.ID)
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err != nil || n == 0 {
		return err // not parked
	}
	var head string
	var depth int
	err = tx.QueryRowContext(ctx, `SELECT head, depth FROM `+s.parkedKeysTable()+byKey, ref.Scope, ref.Topic, key).Scan(&head, &depth)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return nil
	case err != nil:
		return err
	case depth <= 1:
		_, err = tx.ExecContext(ctx, `DELETE FROM `+s.parkedKeysTable()+byKey, ref.Scope, ref.Topic, key)
		return err
	case head != ref.ID:
		_, err = tx.ExecContext(ctx, `UPDATE `+s.parkedKeysTable()+` SET depth = depth - 1`+byKey, ref.Scope, ref.Topic, key)
		return err
	}
	var next string
	if err := tx.QueryRowContext(ctx, `SELECT id FROM `+s.parkedTable()+byKey+` ORDER BY pos LIMIT 1`, ref.Scope, ref.Topic, key).Scan(&next); err != nil {
		return err
	}
	_, err = tx.ExecContext(ctx, `UPDATE `+s.parkedKeysTable()+` SET depth = depth - 1, head = ?, head_since = ?`+byKey,
		next, now.UnixMicro(), ref.Scope, ref.Topic, key)
	return err
}

// parkErr names a missing table (SQLite says so only in the message of a
// plain SQLITE_ERROR, so the catalogue is asked) as dedup.ErrNotMigrated,
// and wraps other errors as wrap does.
func (s *Store) parkErr(op string, err error) error {
	if err == nil {
		return nil
	}
	var se *sqlite.Error
	if errors.As(err, &se) && se.Code()&0xff == sqlite3.SQLITE_ERROR {
		var n int
		if s.db.QueryRow(`SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?`, s.cfg.Table+"_parked_keys").Scan(&n) == nil && n == 0 {
			return fmt.Errorf("%w: sqlitestore: %s does not exist: run Store.Migrate (idem migrate)", dedup.ErrNotMigrated, s.parkedKeysTable())
		}
	}
	if errors.Is(err, dedup.ErrStoreBusy) {
		return err // InTx's wait for the write lock, wrapped
	}
	return s.wrap(op, err)
}

// Parked lists the parked keys f selects, oldest first; see dedup.Parking.
func (s *Store) Parked(ctx context.Context, f dedup.ParkFilter) ([]dedup.ParkedKey, error) {
	limit := f.Limit
	if limit <= 0 {
		limit = 100
	}
	where, args := parkFilter(f)
	keys, err := rowscan.ParkedKeys(s.db.QueryContext(ctx, `SELECT scope, topic, key, head, head_delay_ns, depth, parked_at, head_since, expired
FROM `+s.parkedKeysTable()+where+` ORDER BY parked_at, scope, topic, key LIMIT ?`, append(args, limit)...))
	if err != nil {
		return nil, s.parkErr("parked", err)
	}
	return keys, nil
}

// parkFilter is the WHERE clause of f and its arguments.
func parkFilter(f dedup.ParkFilter) (string, []any) {
	var conds []string
	var args []any
	if f.Scope != "" {
		conds, args = append(conds, "scope = ?"), append(args, f.Scope)
	}
	if f.Topic != "" {
		conds, args = append(conds, "topic = ?"), append(args, f.Topic)
	}
	if f.Key != "" {
		conds, args = append(conds, "key = ?"), append(args, []byte(f.Key))
	}
	if len(conds) == 0 {
		return "", nil
	}
	return " WHERE " + strings.Join(conds, " AND "), args
}

// ParkStats counts the parked keys and finds the oldest; see
// dedup.Parking.
func (s *Store) ParkStats(ctx context.Context) (dedup.ParkStats, error) {
	var st dedup.ParkStats
	var oldest sql.NullInt64
	if err := s.db.QueryRowContext(ctx, `SELECT count(*), min(parked_at) FROM `+s.parkedKeysTable()).Scan(&st.Keys, &oldest); err != nil {
		return dedup.ParkStats{}, s.parkErr("park stats", err)
	}
	if oldest.Valid {
		st.Oldest = time.UnixMicro(oldest.Int64)
	}
	return st, nil
}

var _ dedup.Parking = (*Store)(nil)
