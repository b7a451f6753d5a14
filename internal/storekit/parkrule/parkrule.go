// Package parkrule decides the messages of a dedup.Parking.CheckParked call
// against their parked keys, for the SQL stores: a store reads each parked
// key of the call locked, with the call's messages that are in its list,
// decides the messages here in order, and writes back what changed (the
// followers added, the key expired).
package parkrule

import (
	"cmp"
	"slices"
	"time"

	"github.com/idemkit/idem/dedup"
)

// Key is a parked key as a call found it, and what the call did to it.
type Key struct {
	Head      string
	HeadDelay time.Duration
	HeadSince time.Time
	Depth     int
	Expired   bool
	// Members are the call's messages found in the key's list; Decide
	// adds the followers it adds.
	Members map[string]bool
	// Added are the followers the call added, in order: they go at the
	// key's tail in this order.
	Added []string
	// Expire says the call expired the key (Expired was false).
	Expire bool
	// Release says the call released the key: its head had held it
	// longer than twice limits.Wait. The store deletes the key and its
	// list; the call's later messages of the key find it not parked.
	Release bool
}

// Decide decides message id of k (nil: its key is not parked) as
// dedup.Parking says, at now under limits: a key whose head has held it
// longer than twice limits.Wait is released (Release), and id is tried as
// a message of a key not parked; a key whose head has held it longer than
// limits.Wait, or that id would make deeper than limits.Depth, is
// expired, and every message of an expired key is ParkExpired; the head
// is tried; a message in the list follows, one not in it is added at the
// tail and follows.
func (k *Key) Decide(id string, limits dedup.ParkLimits, now time.Time) dedup.ParkDecision {
	if k == nil || k.Release {
		return dedup.ParkDecision{Action: dedup.ParkTry}
	}
	if Released(k.HeadSince, limits, now) {
		k.Release = true
		return dedup.ParkDecision{Action: dedup.ParkTry}
	}
	if !k.Expired && limits.Wait > 0 && now.Sub(k.HeadSince) > limits.Wait {
		k.Expired, k.Expire = true, true
	}
	switch {
	case k.Expired:
		return dedup.ParkDecision{Action: dedup.ParkExpired}
	case id == k.Head:
		return dedup.ParkDecision{Action: dedup.ParkTry, Head: true}
	case !k.Members[id]:
		if limits.Depth > 0 && k.Depth >= limits.Depth {
			k.Expired, k.Expire = true, true
			return dedup.ParkDecision{Action: dedup.ParkExpired}
		}
		if k.Members == nil {
			k.Members = make(map[string]bool)
		}
		k.Members[id] = true
		k.Added = append(k.Added, id)
		k.Depth++
	}
	return dedup.ParkDecision{Action: dedup.ParkFollow, Delay: k.HeadDelay}
}

// Changed reports whether the call changed k: added followers, expired
// it or released it.
func (k *Key) Changed() bool { return len(k.Added) > 0 || k.Expire || k.Release }

// Released reports whether a key whose head has held it since headSince
// is released at now under limits: its head has held it longer than
// twice limits.Wait, and the messages still in its list are taken for
// lost with it.
func Released(headSince time.Time, limits dedup.ParkLimits, now time.Time) bool {
	return limits.Wait > 0 && now.Sub(headSince) > 2*limits.Wait
}

// Compare orders parked keys bytewise by scope, topic, record key: the
// order in which a store locks a call's keys, the same for every call, so
// that calls on crossed key sets do not deadlock.
func Compare(a, b dedup.ParkKey) int {
	return cmp.Or(cmp.Compare(a.Scope, b.Scope), cmp.Compare(a.Topic, b.Topic), cmp.Compare(a.Key, b.Key))
}

// Keys returns the distinct keys of refs in lock order (Compare).
func Keys(refs []dedup.ParkRef) []dedup.ParkKey {
	keys := make([]dedup.ParkKey, len(refs))
	for i, r := range refs {
		keys[i] = r.ParkKey
	}
	slices.SortFunc(keys, Compare)
	return slices.Compact(keys)
}
