// Package observe serves what operating a consumer, an idempotent HTTP
// API and an outbox relay needs over HTTP: /metrics in Prometheus' text
// format and /healthz for probes. It is the supported way to expose idem's
// telemetry; examples and cmd/idem-relay use it as a service would.
//
//	obs, err := observe.New(observe.Config{})
//	tel, err := obs.Telemetry(otelconsumer.Config{})
//	c, err := consumer.New(consumer.Config[pgx.Tx]{..., Observer: tel, DeadLetter: src})
//	err = obs.Watch(c, tel)               // before Run: every counter from zero
//	go obs.ListenAndServe(ctx, ":9464")   // until ctx ends
//	err = c.Run(ctx)
//
// An HTTP API and a relay are watched the same way:
//
//	tel, err := obs.HTTPTelemetry(otelhttpidem.Config{Routes: []string{"POST /payments"}})
//	mw, err := httpidem.New(httpidem.Config[pgx.Tx]{Store: store, Observer: tel})
//	err = obs.WatchHTTP("payments", store, tel) // the stuck-requests gauge, the store in /healthz
//	err = obs.WatchRelay(ob, relay)             // before relay.Run: the outbox's series from zero
//	err = obs.WatchJournal("refunds", store)    // the effect journal's steps by state, the unresolved ones
//
// /metrics is OpenTelemetry's Prometheus exporter (a bridge onto
// client_golang's registry, served by promhttp) reading the meter provider
// consumer/otelconsumer records into: the instruments are defined once,
// through OpenTelemetry's API; Prometheus is one way to read them, an OTLP
// exporter another. Beside them:
//
//   - every idem counter, at zero from Watch on, for each consumer (each
//     dead-letter cause, each retried class), so a dashboard shows 0 and
//     rate() sees the first increment;
//   - the health gauges (idem_consumer_in_flight,
//     idem_consumer_progress_age_seconds, idem_consumer_lanes_stopped,
//     idem_consumer_lanes_stalled, idem_consumer_lane_waiting);
//   - the Go runtime and process metrics (go_goroutines, go_memstats_*,
//     go_gc_duration_seconds, process_cpu_seconds_total,
//     process_resident_memory_bytes, ...) of client_golang's Go and
//     process collectors. They are Prometheus' own, on the registry the
//     exporter already needs, so they cost no dependency, and every Go
//     dashboard knows their names; OpenTelemetry's runtime
//     instrumentation (go.opentelemetry.io/contrib/instrumentation/runtime)
//     would add a module for the same numbers under other names, and no
//     process metrics. An application that exports over OTLP instead
//     installs that one on its own provider.
//
// /healthz answers 200 when everything watched passes, 503 when something
// does not or nothing is watched. A relay is ready while it runs and live
// while a round went through within Config.Stall (RelayJSON); a request
// store is ready while it answers, and lists its stuck requests
// (HTTPJSON). For a consumer the JSON body (HealthJSON) has ready, live, the
// error, stopped_lanes and stalled_lanes (always lists), in_flight,
// last_progress and the source's lanes. ?probe=ready is the readiness
// probe (running, the store answers: a database away makes a consumer not
// ready, not dead), ?probe=live the liveness probe (not stopped by
// itself, no lane stopped or stalled, progress within Config.Stall while
// messages are in flight: see consumer.Health.Live).
package observe
