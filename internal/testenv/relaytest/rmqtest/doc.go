// Package rmqtest is relaytest's RocketMQ part, apart so that tests that do
// not use RocketMQ do not link its client (whose package-level goroutines
// goleak would see).
package rmqtest
