// Package otelhttpidem records httpidem's requests as OpenTelemetry
// metrics and spans: set a Telemetry as httpidem.Config.Observer. It is
// to the HTTP middleware what consumer/otelconsumer is to the consumer;
// package observe serves both on /metrics.
//
// Metrics, each with http.request.method and http.route (the route's name,
// as in its keys' scope):
//
//	idem.http.requests              requests, by idem.http.outcome (httpidem.Outcome: executed,
//	                                replayed, in_flight, mismatch, bad_key, bad_request, too_large,
//	                                unavailable, store_busy, failed, lease_lost, unkeyed)
//	idem.http.replay.age            seconds from a key's first request to a retry answered with
//	                                its stored response: retention must stay above its 99.9th percentile
//	idem.http.lease.takeovers       leases taken over from a holder that left no outcome
//	idem.http.lease.fenced          lease writes the store refused, by idem.lease.operation
//	                                (finish, extend, end): a holder that outlived its lease
//	idem.http.requests.stuck        gauge: Processing keys whose lease ran out (ObserveStore)
//
// Spans: a request gets a SERVER span, "METHOD route", whose parent is the
// trace context of the request's headers — or, when the request's context
// holds a span already (otelhttp's, a router's), an INTERNAL child of it,
// "idem METHOD route". The store's work and the handler run under it.
//
// Counters are at zero from New on for each of Config.Routes, every
// outcome, so that a scrape right after start lists them; other routes
// appear with their first request.
package otelhttpidem
