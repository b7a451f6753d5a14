package dedup

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// ErrUnknownStatus is what Statuses.Rank's error wraps when it is given a
// state it was not built with.
var ErrUnknownStatus = errors.New("unknown status")

// Statuses ranks the states of a status machine that moves forward, for an
// entity's Version: a payment channel's trade_status, a payment intent's
// status. Build it with StatusRank; the zero Statuses knows no state.
//
// The rank alone (Version{Major: rank}) orders a machine without loops: a
// re-sent earlier state is stale. Where a state can come again (Alipay's
// TRADE_SUCCESS with each partial refund), put the time of the event in
// Major and the rank in Minor (Statuses.At): events order by time, and two
// of one timestamp by their states. The time must be the event's — Alipay's
// gmt_payment, gmt_refund, gmt_close; Stripe's created — never the time of
// the delivery (Alipay's notify_time is new on every re-send, and would make
// a re-sent TRADE_SUCCESS newer than the TRADE_CLOSED that followed it).
//
// A Statuses is immutable and safe for concurrent use.
type Statuses struct {
	names []string
	rank  map[string]int64
}

// StatusRank returns the ranks of states, in their forward order: the first
// ranks 1, the next 2, and so on. States that end the machine in different
// ways (Stripe's succeeded and canceled) may come in either order: only one
// of them happens. It panics when a state is empty or given twice, as
// regexp.MustCompile does on a bad pattern: the states are the program's.
func StatusRank(states ...string) Statuses {
	s := Statuses{names: append([]string(nil), states...), rank: make(map[string]int64, len(states))}
	for i, st := range states {
		if st == "" {
			panic("dedup: StatusRank: an empty state")
		}
		if _, dup := s.rank[st]; dup {
			panic("dedup: StatusRank: state " + strconv.Quote(st) + " given twice")
		}
		s.rank[st] = int64(i + 1)
	}
	return s
}

// Rank returns the rank of state, from 1. A state not among the machine's
// is an error wrapping ErrUnknownStatus that names it and the known ones:
// a consumer dead-letters its message as bad input (CauseBadInput) with
// that error, and an HTTP route answers it 400.
func (s Statuses) Rank(state string) (int64, error) {
	if r, ok := s.rank[state]; ok {
		return r, nil
	}
	known := make([]string, len(s.names))
	for i, n := range s.names {
		known[i] = strconv.Quote(n)
	}
	return 0, fmt.Errorf("dedup: %w %q: the known statuses are %s", ErrUnknownStatus, state, strings.Join(known, " < "))
}

// Version is the version of an event that puts its entity in state, ranked
// alone: Version{Major: rank}. For a machine without loops.
func (s Statuses) Version(state string) (Version, error) {
	r, err := s.Rank(state)
	return Version{Major: r}, err
}

// At is the version of an event at major — the event's time in a
// resolution of its own (Unix seconds, milliseconds), or a sequence — that
// puts its entity in state: Version{Major: major, Minor: rank}. Two events
// of one major order by their states; equal ones are not ordered (the
// second is stale).
func (s Statuses) At(major int64, state string) (Version, error) {
	r, err := s.Rank(state)
	if err != nil {
		return Version{}, err
	}
	return Version{Major: major, Minor: r}, nil
}

// States returns the states in their forward order.
func (s Statuses) States() []string { return append([]string(nil), s.names...) }
