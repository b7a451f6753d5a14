// Package relaytest has the helpers the outbox's integration tests share:
// waiting on conditions, Kafka and RocketMQ topics, reading a topic back,
// and private servers for the tests that stop them.
package relaytest
