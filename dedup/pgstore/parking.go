package pgstore

// Parked keys (dedup.Parking) are the table <Table>_parked_keys, a row per
// parked record key, and their messages the table <Table>_parked, a row
// per message with its position in the key's list (migration 009). A
// key's row is the lock of its messages: every change takes it first, in
// a short transaction of its own whose waits are bounded by
// Config.LockTimeout, a timed-out wait being dedup.ErrInFlight.
//
// CheckParked asks first, in one statement outside any transaction,
// whether any key of the call is parked; most calls find none and are
// done in that round trip. Otherwise it locks the call's keys' rows in
// one canonical order (bytewise scope, topic, record key), reads which of
// the call's messages are in their lists, decides the messages in Go in
// their order (internal/storekit/parkrule), and writes the followers
// added, the keys expired and the keys released in one batch.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/internal/storekit/parkrule"
	"github.com/idemkit/idem/internal/storekit/pgerr"
)

// parkQueries are the statements of the parked keys.
type parkQueries struct {
	keysTab               string
	find, lock, members   string // CheckParked
	add, update           string
	release               string
	upsert, park          string // Park
	lockOne, unpark       string // Unpark
	list, stats, boundSQL string
}

func newParkQueries(keys, msgs string, distributed bool) parkQueries {
	bound := `SELECT set_config('lock_timeout', $1, true)`
	if distributed {
		// lock_timeout is not honoured for row locks there: the
		// transaction, which runs these statements alone, is bounded whole.
		bound = `SELECT set_config('statement_timeout', $1, true)`
	}
	const byKey = `scope = $1 AND topic = $2 AND key = $3`
	return parkQueries{
		keysTab:  keys,
		boundSQL: bound,
		find: `SELECT count(*) FROM unnest($1::text[], $2::text[], $3::bytea[]) AS i(s, t, k)
WHERE EXISTS (SELECT 1 FROM ` + keys + ` p WHERE p.scope = i.s AND p.topic = i.t AND p.key = i.k)`,
		// The keys come in lock order; each row by primary key, locked in
		// that order (a lateral probe per key).
		lock: `SELECT i.s, i.t, i.k, p.head, p.head_delay_ns, p.depth, p.next_pos, p.head_since, p.expired
FROM unnest($1::text[], $2::text[], $3::bytea[]) WITH ORDINALITY AS i(s, t, k, o)
CROSS JOIN LATERAL (SELECT * FROM ` + keys + ` p WHERE p.scope = i.s AND p.topic = i.t AND p.key = i.k FOR UPDATE) p
ORDER BY i.o`,
		members: `SELECT m.scope, m.topic, m.key, m.id
FROM unnest($1::text[], $2::text[], $3::bytea[], $4::text[]) AS u(s, t, k, id)
JOIN ` + msgs + ` m ON m.scope = u.s AND m.topic = u.t AND m.key = u.k AND m.id = u.id`,
		add: `INSERT INTO ` + msgs + ` (scope, topic, key, id, pos)
SELECT * FROM unnest($1::text[], $2::text[], $3::bytea[], $4::text[], $5::int8[])`,
		update: `UPDATE ` + keys + ` p SET depth = u.d, next_pos = u.n, expired = u.e
FROM unnest($1::text[], $2::text[], $3::bytea[], $4::int4[], $5::int8[], $6::bool[]) AS u(s, t, k, d, n, e)
WHERE p.scope = u.s AND p.topic = u.t AND p.key = u.k`,
		// A released key's list and row (the row is locked: it goes last).
		release: `WITH del AS (DELETE FROM ` + msgs + ` WHERE ` + byKey + `)
DELETE FROM ` + keys + ` WHERE ` + byKey,
		// The key's row, inserted with ref the head, or locked as it is.
		upsert: `INSERT INTO ` + keys + ` AS p (scope, topic, key, head, head_delay_ns, depth, next_pos, parked_at, head_since)
VALUES ($1, $2, $3, $4, $5, 0, 0, $6, $6)
ON CONFLICT (scope, topic, key) DO UPDATE SET depth = p.depth`,
		// Run after upsert, in a snapshot that sees what the key's last
		// holder committed: ref at the tail unless it is in the list, and
		// the head's delay when it is the head.
		park: `WITH k AS (SELECT next_pos FROM ` + keys + ` WHERE ` + byKey + `),
ins AS (
    INSERT INTO ` + msgs + ` (scope, topic, key, id, pos) SELECT $1, $2, $3, $4, next_pos FROM k
    ON CONFLICT (scope, topic, key, id) DO NOTHING
    RETURNING 1)
UPDATE ` + keys + ` p SET depth = p.depth + (SELECT count(*) FROM ins), next_pos = p.next_pos + (SELECT count(*) FROM ins),
    head_delay_ns = CASE WHEN p.head = $4 THEN $5 ELSE p.head_delay_ns END
WHERE p.` + byKey,
		lockOne: `SELECT 1 FROM ` + keys + ` WHERE ` + byKey + ` FOR UPDATE`,
		// Run after lockOne, as park after upsert. The statement's
		// snapshot does not see its own DELETE: the next head is looked
		// for among the others.
		unpark: `WITH del AS (DELETE FROM ` + msgs + ` WHERE ` + byKey + ` AND id = $4 RETURNING 1),
nxt AS (SELECT id FROM ` + msgs + ` WHERE ` + byKey + ` AND id <> $4 ORDER BY pos LIMIT 1),
upd AS (
    UPDATE ` + keys + ` p SET depth = p.depth - 1,
        head = CASE WHEN p.head = $4 THEN (SELECT id FROM nxt) ELSE p.head END,
        head_since = CASE WHEN p.head = $4 THEN $5 ELSE p.head_since END
    WHERE p.` + byKey + ` AND p.depth > 1 AND EXISTS (SELECT 1 FROM del)
    RETURNING 1)
DELETE FROM ` + keys + ` p WHERE p.` + byKey + ` AND p.depth <= 1 AND EXISTS (SELECT 1 FROM del)`,
		list: `SELECT scope, topic, key, head, head_delay_ns, depth, parked_at, head_since, expired FROM ` + keys + `
WHERE ($1 = '' OR scope = $1) AND ($2 = '' OR topic = $2) AND (octet_length($3::bytea) = 0 OR key = $3)
ORDER BY parked_at, scope COLLATE "C", topic COLLATE "C", key LIMIT $4`,
		stats: `SELECT count(*), min(parked_at) FROM ` + keys,
	}
}

// parkedKey is a key of a CheckParked call as it found it locked.
type parkedKey struct {
	parkrule.Key
	nextPos int64
}

// keyArgs are the arrays of a call's keys.
type keyArgs struct {
	scopes, topics []string
	keys           [][]byte
}

func (a *keyArgs) add(k dedup.ParkKey) {
	a.scopes, a.topics, a.keys = append(a.scopes, k.Scope), append(a.topics, k.Topic), append(a.keys, []byte(k.Key))
}

// CheckParked decides each ref in order, adding followers to their keys;
// see dedup.Parking. When no key of refs is parked it is one statement;
// else a transaction locks the keys' rows in bytewise (scope, topic, key)
// order, its waits bounded by Config.LockTimeout.
func (s *Store) CheckParked(ctx context.Context, refs []dedup.ParkRef, limits dedup.ParkLimits, now time.Time, out []dedup.ParkDecision) error {
	if len(out) < len(refs) {
		return fmt.Errorf("pgstore: %d decisions for %d parked refs", len(out), len(refs))
	}
	for _, r := range refs {
		if err := r.Validate(); err != nil {
			return fmt.Errorf("pgstore: check parked: %w", err)
		}
	}
	if len(refs) == 0 {
		return nil
	}
	var ka keyArgs
	for _, k := range parkrule.Keys(refs) {
		ka.add(k)
	}
	var n int64
	if err := s.pool.QueryRow(ctx, s.park.find, ka.scopes, ka.topics, ka.keys).Scan(&n); err != nil {
		return s.parkErr("check parked", err)
	}
	if n == 0 {
		for i := range refs {
			out[i] = dedup.ParkDecision{Action: dedup.ParkTry}
		}
		return nil
	}
	return s.parkTx(ctx, "check parked", func(tx pgx.Tx) error {
		parked, err := s.lockParked(ctx, tx, &ka, refs)
		if err != nil {
			return err
		}
		for i, r := range refs {
			if pk := parked[r.ParkKey]; pk != nil {
				out[i] = pk.Decide(r.ID, limits, now)
			} else {
				out[i] = dedup.ParkDecision{Action: dedup.ParkTry}
			}
		}
		return s.writeParked(ctx, tx, parked)
	})
}

// lockParked locks the rows of ka's keys, in ka's order, and reads which
// of refs are in their keys' lists, in one round trip.
func (s *Store) lockParked(ctx context.Context, tx pgx.Tx, ka *keyArgs, refs []dedup.ParkRef) (map[dedup.ParkKey]*parkedKey, error) {
	var ma keyArgs
	ids := make([]string, 0, len(refs))
	for _, r := range refs {
		ma.add(r.ParkKey)
		ids = append(ids, r.ID)
	}
	var b pgx.Batch
	b.Queue(s.park.boundSQL, s.lockTimeout)
	b.Queue(s.park.lock, ka.scopes, ka.topics, ka.keys)
	b.Queue(s.park.members, ma.scopes, ma.topics, ma.keys, ids)
	br := tx.SendBatch(ctx, &b)
	defer br.Close()
	if _, err := br.Exec(); err != nil {
		return nil, err
	}
	parked := make(map[dedup.ParkKey]*parkedKey)
	rows, err := br.Query()
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var k dedup.ParkKey
		var key []byte
		var delay int64
		pk := new(parkedKey)
		if err := rows.Scan(&k.Scope, &k.Topic, &key, &pk.Head, &delay, &pk.Depth, &pk.nextPos, &pk.HeadSince, &pk.Expired); err != nil {
			rows.Close()
			return nil, err
		}
		k.Key, pk.HeadDelay = string(key), time.Duration(delay)
		parked[k] = pk
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	rows, err = br.Query()
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
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	return parked, br.Close()
}

// writeParked writes what a CheckParked call changed: the followers added
// at their keys' tails, the keys' depths, next positions and expiry, and
// the released keys deleted with their lists.
func (s *Store) writeParked(ctx context.Context, tx pgx.Tx, parked map[dedup.ParkKey]*parkedKey) error {
	var (
		added, changed keyArgs
		ids            []string
		pos            []int64
		depths         []int32
		next           []int64
		expired        []bool
	)
	var b pgx.Batch
	for k, pk := range parked {
		if !pk.Changed() {
			continue
		}
		if pk.Release {
			b.Queue(s.park.release, k.Scope, k.Topic, []byte(k.Key))
			continue
		}
		for _, id := range pk.Added {
			added.add(k)
			ids, pos = append(ids, id), append(pos, pk.nextPos)
			pk.nextPos++
		}
		changed.add(k)
		depths, next, expired = append(depths, int32(pk.Depth)), append(next, pk.nextPos), append(expired, pk.Expired)
	}
	if len(ids) > 0 {
		b.Queue(s.park.add, added.scopes, added.topics, added.keys, ids, pos)
	}
	if len(changed.scopes) > 0 {
		b.Queue(s.park.update, changed.scopes, changed.topics, changed.keys, depths, next, expired)
	}
	if b.Len() == 0 {
		return nil
	}
	return tx.SendBatch(ctx, &b).Close()
}

// Park records that ref went to retry with delay; see dedup.Parking. The
// key's row is inserted or locked first, then ref added at its tail.
func (s *Store) Park(ctx context.Context, ref dedup.ParkRef, delay time.Duration, now time.Time) error {
	if err := ref.Validate(); err != nil {
		return fmt.Errorf("pgstore: park: %w", err)
	}
	key := []byte(ref.Key)
	return s.parkTx(ctx, "park", func(tx pgx.Tx) error {
		var b pgx.Batch
		b.Queue(s.park.boundSQL, s.lockTimeout)
		b.Queue(s.park.upsert, ref.Scope, ref.Topic, key, ref.ID, int64(delay), now)
		b.Queue(s.park.park, ref.Scope, ref.Topic, key, ref.ID, int64(delay))
		return tx.SendBatch(ctx, &b).Close()
	})
}

// Unpark removes ref from its key; see dedup.Parking. A new head keeps the
// key's HeadDelay: it went to retry as a follower with that delay.
func (s *Store) Unpark(ctx context.Context, ref dedup.ParkRef, now time.Time) error {
	if err := ref.Validate(); err != nil {
		return fmt.Errorf("pgstore: unpark: %w", err)
	}
	key := []byte(ref.Key)
	return s.parkTx(ctx, "unpark", func(tx pgx.Tx) error {
		var b pgx.Batch
		b.Queue(s.park.boundSQL, s.lockTimeout)
		b.Queue(s.park.lockOne, ref.Scope, ref.Topic, key)
		b.Queue(s.park.unpark, ref.Scope, ref.Topic, key, ref.ID, now)
		return tx.SendBatch(ctx, &b).Close()
	})
}

// parkTx runs fn in a transaction of its own and commits it. In
// distributed mode (SERIALIZABLE) a serialization failure — a key's row
// another call changed since the transaction's snapshot — is retried a
// few times, then is dedup.ErrInFlight: fn only reads and writes parked
// keys, and rolled back it did nothing. Under READ COMMITTED a call waits
// for the locks it needs instead, taken in one order: no deadlock.
func (s *Store) parkTx(ctx context.Context, what string, fn func(tx pgx.Tx) error) error {
	opts := pgx.TxOptions{IsoLevel: pgx.ReadCommitted}
	if s.cfg.Distributed {
		opts.IsoLevel = pgx.Serializable
	}
	const attempts = 8
	for attempt := 1; ; attempt++ {
		err := pgx.BeginTxFunc(ctx, s.pool, opts, fn)
		code := pgerr.Code(err)
		switch {
		case err == nil:
			return nil
		case s.cfg.Distributed && (code == "40001" || code == "40P01"):
			if attempt < attempts && ctx.Err() == nil {
				time.Sleep(time.Duration(attempt*(1+rand.IntN(5))) * time.Millisecond)
				continue
			}
			return fmt.Errorf("%w (%d conflicts with concurrent calls on the key): %w", dedup.ErrInFlight, attempt, err)
		case s.cfg.Distributed && code == "57014":
			return fmt.Errorf("%w (statement_timeout %s on the %s): %w", dedup.ErrInFlight, s.lockTimeout, what, err)
		}
		return s.parkErr(what, err)
	}
}

// parkErr wraps err with what failed: a lock timeout is dedup.ErrInFlight,
// a parking table that does not exist dedup.ErrNotMigrated.
func (s *Store) parkErr(what string, err error) error {
	if pgerr.Code(err) == "42P01" {
		return fmt.Errorf("%w: pgstore: %s: %s does not exist: run Store.Migrate (idem migrate): %w", dedup.ErrNotMigrated, what, s.park.keysTab, err)
	}
	return s.boundedErr(what, err)
}

// Parked lists the parked keys f selects, oldest first; see dedup.Parking.
func (s *Store) Parked(ctx context.Context, f dedup.ParkFilter) ([]dedup.ParkedKey, error) {
	limit := f.Limit
	if limit <= 0 {
		limit = 100
	}
	rows, err := s.pool.Query(ctx, s.park.list, f.Scope, f.Topic, []byte(f.Key), limit)
	if err != nil {
		return nil, s.parkErr("parked", err)
	}
	keys, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (dedup.ParkedKey, error) {
		var k dedup.ParkedKey
		var key []byte
		var delay int64
		err := row.Scan(&k.Scope, &k.Topic, &key, &k.Head, &delay, &k.Depth, &k.ParkedAt, &k.HeadSince, &k.Expired)
		k.Key, k.HeadDelay = string(key), time.Duration(delay)
		return k, err
	})
	if err != nil {
		return nil, s.parkErr("parked", err)
	}
	return keys, nil
}

// ParkStats counts the parked keys and finds the oldest; see
// dedup.Parking.
func (s *Store) ParkStats(ctx context.Context) (dedup.ParkStats, error) {
	var st dedup.ParkStats
	var oldest *time.Time
	if err := s.pool.QueryRow(ctx, s.park.stats).Scan(&st.Keys, &oldest); err != nil {
		return dedup.ParkStats{}, s.parkErr("park stats", err)
	}
	if oldest != nil {
		st.Oldest = *oldest
	}
	return st, nil
}

var _ dedup.Parking = (*Store)(nil)
