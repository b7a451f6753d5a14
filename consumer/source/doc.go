// Package source is the contract between the consumer and a broker
// adapter: the [Message] a [Source] delivers, how it is delivered and
// settled, and the [Description] in which a source declares what it is and
// what it can do. The Kafka and RocketMQ adapters, consumertest's fake
// source and any source of your own implement it; package consumer runs
// one.
//
// A source declares its capabilities in one Description, returned by
// Describe, rather than by implementing optional interfaces: a source that
// wraps another (to time, log or fault it) forwards Describe, and nothing
// it wraps is hidden. The zero Description is a source that declares
// nothing, and the consumer takes the safe side of every choice it makes
// from it.
//
// This package imports nothing of the engine: an adapter needs it and
// package wire (the headers of dead letters and retry copies), and it may
// import package consumer for the user's API (Letter, RetryLetter).
package source
