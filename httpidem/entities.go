package httpidem

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/idemkit/idem/dedup"
)

// Entity order on a route (Route.Entity): a request names the entity it is
// an event of — a trade a payment channel calls back about — and the
// event's version. In the transaction that runs the request under its key,
// right after the claim, the event meets its entity's watermark
// (dedup.Watermarks, in the route's key scope): above it, the watermark
// moves to its version and the handler runs; at or below it the request is
// stale. The watermark, the key, the handler's writes and the stored
// response commit together, or none of them does.

// Entity names the entity a request is an event of and the event's version
// (Route.Entity). A zero Name: the request is of no entity.
type Entity struct {
	Name    string
	Version dedup.Version
}

// StaleRequest is a request found stale: its entity's watermark was at or
// above its version (Route.Stale answers it).
type StaleRequest struct {
	Key       dedup.Key
	Entity    string
	Version   dedup.Version // the request's
	Watermark dedup.Version // the entity's, which it met
}

// HeaderStale is set to "true" on the default answer to a stale request
// (AnswerStale), and replayed with it.
const HeaderStale = "Idempotent-Stale"

// AnswerStale is the default answer to a stale request: 200 OK, the header
// Idempotent-Stale: true and a JSON body naming the entity, the request's
// version and the watermark it met:
//
//	{"stale":true,"entity":"T1","version":"1796004245.2","watermark":"1796004245.3"}
//
// A 2xx, because the request was received and deliberately not applied: a
// payment channel re-sends its callback until it gets one (Alipay 8 times
// in 25 hours, Stripe for 3 days), and every re-send would be as stale. A
// channel that wants a body of its own (Alipay's "success") gets it from a
// Route.Stale that writes it.
func AnswerStale(w http.ResponseWriter, _ *http.Request, s StaleRequest) {
	body, _ := json.Marshal(struct {
		Stale     bool   `json:"stale"`
		Entity    string `json:"entity"`
		Version   string `json:"version"`
		Watermark string `json:"watermark"`
	}{true, s.Entity, s.Version.String(), s.Watermark.String()})
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	h.Set(HeaderStale, "true")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(body)
}

// titleEntity is the problem a request whose entity cannot be read gets.
const titleEntity = "The request names no valid entity"

// entityOf runs Route.Entity on a prepared request's body.
func (rt *route) entityOf(r *http.Request, body []byte) (Entity, error) {
	e, err := rt.Entity(r, body)
	switch {
	case err != nil:
		return Entity{}, err
	case len(e.Name) > 200:
		return Entity{}, fmt.Errorf("the entity's name is %d bytes, the limit is 200", len(e.Name))
	case e.Name == "" && e.Version != (dedup.Version{}):
		return Entity{}, fmt.Errorf("version %s without an entity name", e.Version)
	}
	return e, nil
}

// advance moves the entity of p forward in tx, the transaction of its
// claim, and says whether the request is stale. A wait for another
// transaction advancing the entity that ran past the store's lock timeout
// is the store being busy (503), not the key being in flight (409).
func (m *Middleware[TTx]) advance(ctx context.Context, tx TTx, p prepared) (StaleRequest, bool, error) {
	ev := []dedup.EntityEvent{{Key: p.claim.Key, Entity: p.entity.Name, Version: p.entity.Version}}
	var res [1]dedup.Advance
	if err := m.marks.AdvanceEntities(ctx, tx, ev, res[:]); err != nil {
		if errors.Is(err, dedup.ErrInFlight) {
			return StaleRequest{}, false, fmt.Errorf("%w: entity %q is being advanced by another request: %w", dedup.ErrStoreBusy, p.entity.Name, err)
		}
		return StaleRequest{}, false, fmt.Errorf("httpidem: advancing entity %q: %w", p.entity.Name, err)
	}
	if !res[0].Stale {
		return StaleRequest{}, false, nil
	}
	return StaleRequest{Key: p.claim.Key, Entity: p.entity.Name, Version: p.entity.Version, Watermark: res[0].Watermark}, true, nil
}
