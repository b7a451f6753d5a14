// Package relaytest is the outbox's test harness: an outbox in a fresh
// schema (NewOutbox), a relay run for the test (StartRelay), the outbox's
// pending rows and dead letters, a keyed stream to enqueue and check the
// order of (Enqueue, CheckKeyOrder), and Kafka topics with configs. Waiting,
// names, private servers and child processes are testenv's; RocketMQ topics
// rmqtest's.
package relaytest
