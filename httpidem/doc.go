// Package httpidem is HTTP Idempotency-Key ingress on idem's stores: the
// IETF httpapi Idempotency-Key draft with Stripe's documented semantics, on
// the same keys, tables and purge as the consumers. One database serves both
// entry points: a request's key is a row of the dedup table (scope: method,
// route and tenant; ID: the header's value), and its record — state,
// fencing token, lease, stored response — a row of a table beside it.
//
// Two modes, chosen per route:
//
//   - Transactional: the handler gets the store's transaction. Its writes,
//     the key and the response commit together, or nothing does: exactly
//     once per key, no lease, nothing to recover. Use it whenever the
//     effects are writes to the store's database.
//   - Leased: for effects elsewhere (a payment provider, a bank, an e-mail).
//     The key is committed as Processing with a lease and a fencing token
//     before the handler runs; a response below 500 is stored; a 5xx, a
//     panic or a crash leaves the outcome uncertain, and once the lease
//     runs out the next request with the key takes it over with a larger
//     token. The holder it was taken from can no longer write: the store
//     refuses its token.
//
// What every route answers:
//
//	key new                              run the handler once; store status, chosen headers and body with the key
//	key finished                         replay status, headers and body byte for byte, errors too, with Idempotent-Replayed: true
//	key executing (or its lease running) 409 Conflict, application/problem+json, Retry-After
//	store busy (a lock held past its timeout, not this key's)  503, Retry-After
//	same key, another fingerprint        422 Unprocessable Content (another body, or another resource in the path)
//	key missing on a route requiring it  400
//	key empty, over 256 bytes, control characters, not UTF-8   400, never truncated
//	request body over the route's limit  413, before any store work
//	entity at or past the request's version (Route.Entity, transactional)  Route.Stale's answer, stored with the key; default 200, Idempotent-Stale: true
//
// A key is scoped by the request's method, the route and the tenant (the
// account a Config.Tenant function names), so two accounts may use one key
// and a key names one operation. The fingerprint covers the method, the
// route, the path values and the body — canonical JSON by default, or
// chosen fields: on POST /payments/{id}/capture a key used for payment 1
// and then for payment 2 is answered 422, never with payment 1's response
// (Route.IgnorePathValues opts out).
//
// What it does not do: effects outside the database of a Transactional
// route are not covered (make them Leased), and a Leased handler's own
// effects are only as fenced as the system performing them makes them —
// pass it the key and the lease's token. Responses are buffered until their
// outcome is stored, so an idempotent route does not stream (other routes
// are untouched). Keys live for the route's Retention (24 hours by
// default), and a leased key at least as long as its lease, extensions
// included; a retry after that runs again. Fencing tokens only grow: a
// key purged and claimed again gets a larger token than any it had.
//
// The store is a dedup.RequestStore (pgstore.Store, sqlitestore.Store):
// the contract of request records, verdicts, leases and tokens lives in
// package dedup, with its conformance suite in deduptest.RunRequests.
// Operators see keys stuck in Processing past their lease with the store's
// StuckRequests, and release one with its ReleaseRequest (the next request
// with the key takes it over; a still-running holder is fenced out). The
// middleware's own suite, httpidemtest, runs on every store.
//
// Config.Observer sees each request's outcome (Outcome: executed,
// replayed, in_flight, mismatch, ...), a replay's age, takeovers and the
// lease writes the store refused; httpidem/otelhttpidem records them as
// OpenTelemetry metrics and spans, and package observe serves them. The
// middleware imports no telemetry library itself.
package httpidem
