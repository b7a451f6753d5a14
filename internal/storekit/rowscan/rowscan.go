// Package rowscan reads the result sets that several stores return alike,
// from pgx.Rows and *sql.Rows both.
package rowscan

import (
	"fmt"
	"time"

	"github.com/idemkit/idem/dedup"
)

// Rows is what pgx.Rows and *sql.Rows have in common.
type Rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
}

// Epochs reads the result of a query of (scope, epoch, releasing) into
// dedup.EpochStore's map, and closes its rows: rowscan.Epochs(db.Query(…)).
func Epochs(rows Rows, err error) (map[string]dedup.Epoch, error) {
	if err != nil {
		return nil, err
	}
	defer closeRows(rows)
	out := make(map[string]dedup.Epoch)
	for rows.Next() {
		var scope string
		var e dedup.Epoch
		if err := rows.Scan(&scope, &e.N, &e.Releasing); err != nil {
			return nil, err
		}
		out[scope] = e
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	return out, nil
}

// StepCounts reads the result of a query of (state, expired pending,
// count) into dedup.Journal.CountSteps's answer, and closes its rows:
// rowscan.StepCounts(db.Query(…)). Expired pending steps are counted apart,
// not under StepPending.
func StepCounts(rows Rows, err error) (byState map[dedup.StepState]int64, expiredPending int64, _ error) {
	if err != nil {
		return nil, 0, err
	}
	defer closeRows(rows)
	byState = make(map[dedup.StepState]int64)
	for rows.Next() {
		var (
			state   string
			expired bool
			n       int64
		)
		if err := rows.Scan(&state, &expired, &n); err != nil {
			return nil, 0, err
		}
		st, err := dedup.ParseStepState(state)
		if err != nil {
			return nil, 0, fmt.Errorf("a row of the steps table: %w", err)
		}
		if expired {
			expiredPending += n
		} else {
			byState[st] += n
		}
	}
	if err := rows.Err(); err != nil {
		return nil, 0, err
	}
	return byState, expiredPending, nil
}

// StaleEvents reads the result of a query of (scope, key, entity, major,
// minor, mark major, mark minor, at) into stale events, at in the integer
// unit of the store's clock, which at turns into a time; and closes its
// rows: rowscan.StaleEvents(db.Query(…)).
func StaleEvents(at func(int64) time.Time) func(rows Rows, err error) ([]dedup.StaleEvent, error) {
	return func(rows Rows, err error) ([]dedup.StaleEvent, error) {
		if err != nil {
			return nil, err
		}
		defer closeRows(rows)
		var evs []dedup.StaleEvent
		for rows.Next() {
			var e dedup.StaleEvent
			var t int64
			if err := rows.Scan(&e.Key.Scope, &e.Key.ID, &e.Entity, &e.Version.Major, &e.Version.Minor, &e.Watermark.Major, &e.Watermark.Minor, &t); err != nil {
				return nil, err
			}
			e.At = at(t)
			evs = append(evs, e)
		}
		return evs, rows.Err()
	}
}

// ParkedKeys reads the result of a query of (scope, topic, key, head,
// head delay in nanoseconds, depth, parked at, head since, expired) into
// parked keys, the times in Unix microseconds; and closes its rows:
// rowscan.ParkedKeys(db.Query(…)).
func ParkedKeys(rows Rows, err error) ([]dedup.ParkedKey, error) {
	if err != nil {
		return nil, err
	}
	defer closeRows(rows)
	var keys []dedup.ParkedKey
	for rows.Next() {
		var k dedup.ParkedKey
		var key []byte
		var delay, at, since int64
		if err := rows.Scan(&k.Scope, &k.Topic, &key, &k.Head, &delay, &k.Depth, &at, &since, &k.Expired); err != nil {
			return nil, err
		}
		k.Key, k.HeadDelay = string(key), time.Duration(delay)
		k.ParkedAt, k.HeadSince = time.UnixMicro(at), time.UnixMicro(since)
		keys = append(keys, k)
	}
	return keys, rows.Err()
}

// closeRows closes pgx.Rows (Close()) and *sql.Rows (Close() error) alike;
// an error of the latter is rows.Err's, read before.
func closeRows(rows Rows) {
	switch r := rows.(type) {
	case interface{ Close() }:
		r.Close()
	case interface{ Close() error }:
		_ = r.Close()
	}
}
