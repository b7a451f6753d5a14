package dedup

import (
	"cmp"
	"context"
	"errors"
	"strconv"
	"time"
)

// Entity versions order the different events of one entity — a trade, a
// payment intent, an account — where a dedup key only recognizes copies of
// one event. A channel that re-sends TRADE_SUCCESS after the TRADE_CLOSED
// that followed it sends a new event, with a key of its own: dedup applies
// it, and the trade goes back to paid. With versions, each entity of a key
// scope has a watermark, the highest version applied, which moves forward
// only, in the transaction of the claim: an event at or below it is stale
// and is not applied.
//
// The discipline, which every Watermarks keeps:
//   - Forward only: an event applies when its version is above the
//     entity's watermark, and the watermark becomes its version; an event
//     at or below it (equal included) is stale.
//   - In the claim's transaction: a rolled-back transaction moved nothing
//     and recorded nothing.
//   - In order within a call: the events of one entity in one call meet the
//     watermark the earlier ones left (v5 then v3: v3 is stale; v3 then
//     v5: both apply).
//   - One transaction at a time per entity: a concurrent transaction that
//     advances the same entity is waited for, and the decision is made
//     against what it committed.
//   - Stale events are recorded, with the entity and both versions, in the
//     same transaction.

// Version orders the events of one entity: Major first, then Minor. Major
// is typically a sequence number, a log position, or a timestamp in
// nanoseconds; Minor breaks ties (a state's rank, a sequence within the
// timestamp). Equal versions are not ordered: the second is stale.
type Version struct {
	Major, Minor int64
}

// Compare returns -1, 0 or +1 as v is below, equal to or above o.
func (v Version) Compare(o Version) int {
	if c := cmp.Compare(v.Major, o.Major); c != 0 {
		return c
	}
	return cmp.Compare(v.Minor, o.Minor)
}

func (v Version) String() string {
	return strconv.FormatInt(v.Major, 10) + "." + strconv.FormatInt(v.Minor, 10)
}

// EntityEvent is one event of an entity, as a claim of its message names
// it: the message's dedup key (its scope scopes the entity), the entity
// and the event's version.
type EntityEvent struct {
	Key     Key
	Entity  string
	Version Version
}

// Validate reports whether e names an event: a valid key and an entity of
// 1 to 200 bytes.
func (e EntityEvent) Validate() error {
	if err := e.Key.Validate(); err != nil {
		return err
	}
	if e.Entity == "" || len(e.Entity) > 200 {
		return errors.New("dedup: an entity's name must be 1 to 200 bytes")
	}
	return nil
}

// Advance is what AdvanceEntities decided for one event.
type Advance struct {
	// Stale: the entity's watermark was at or above the event's version;
	// apply nothing.
	Stale bool
	// Watermark is the watermark the event met: the stored one, or where
	// an earlier event of the same call moved it. Had is false when the
	// entity had none (the event applies).
	Watermark Version
	Had       bool
}

// StaleEvent is a recorded stale event.
type StaleEvent struct {
	Key       Key
	Entity    string
	Version   Version   // the event's
	Watermark Version   // the entity's, which it met
	At        time.Time // when it was recorded, by the store's clock
}

// StaleFilter selects recorded stale events; zero fields select all.
type StaleFilter struct {
	Scope  string
	Entity string
	// Limit is the most events returned, newest first; 0: 100.
	Limit int
}

// Watermarks is a Store that keeps entity watermarks. The consumer moves
// them, with Config.Entity, in the transaction of each batch's claim.
type Watermarks[TTx any] interface {
	// AdvanceEntities decides, in tx, set-based, each event against its
	// entity's watermark (the entity of a scope: (Key.Scope, Entity)), in
	// the order of events, moves the watermarks forward, records the stale
	// events, and writes one Advance per event into results (len(results)
	// must be at least len(events)). A concurrent uncommitted transaction
	// that advances one of the entities is waited for, at most the store's
	// lock timeout, then the call fails with an error wrapping ErrInFlight.
	// Entities are locked in one canonical order (scope, entity), so
	// concurrent calls never deadlock among themselves. After an error tx
	// is unusable.
	AdvanceEntities(ctx context.Context, tx TTx, events []EntityEvent, results []Advance) error

	// Watermark returns the committed watermark of entity in scope, and
	// whether it has one.
	Watermark(ctx context.Context, scope, entity string) (Version, bool, error)

	// StaleEvents lists the recorded stale events f selects, newest first.
	StaleEvents(ctx context.Context, f StaleFilter) ([]StaleEvent, error)
}
