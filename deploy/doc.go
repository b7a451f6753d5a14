// Package deploy holds what operating idem takes beside the code: a
// Grafana dashboard (grafana/idem.json) and Prometheus alert rules
// (prometheus/alerts.yml), read by no Go code. Its test runs a consumer,
// an idempotent HTTP API and an outbox relay behind observe, scrapes
// /metrics, and checks every expression of both files against the scrape
// with Prometheus' own PromQL parser: each metric a selector names is
// exported, with each label the expression matches or groups by.
// docs/operating.md, "Dashboard and alerts", says how to load them.
//
// deploy is a module of its own (deploy/go.mod, with a replace to the idem
// beside it), so that Prometheus' server module stays out of idem's
// go.mod: run its test with go test -C deploy ./... (make test does).
package deploy
