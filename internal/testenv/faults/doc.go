// Package faults is idem's fault-injection suite: the payments consumer of
// examples/payments runs as a child process against real Postgres, Kafka and
// RocketMQ, failpoints chosen by environment variable kill it, break its
// database connections and make its handler misbehave at the worst moments,
// and after every scenario the four tables, the dedup table, the dead-letter
// topic and the consumer group's offsets are checked against what was sent.
//
// The package holds only tests; docs/reliability.md describes the
// scenarios, how to run one alone and the summary of a run. It is a module of
// its own (go.mod beside this file, replacing github.com/idemkit/idem with the
// checkout around it), so that the tools it alone uses, toxiproxy and
// zerolog, stay out of the library's go.mod: run it with
// go test -C internal/testenv/faults . from the repository's root.
//
// No failpoint lives in the engine: the child wraps the Source (a SIGKILL in
// Ack, after the database commit and before the offset commit), the Store (a
// SIGKILL before COMMIT, a COMMIT whose outcome the consumer cannot know) and
// the handler (panics, transient errors, constraint violations).
package faults
