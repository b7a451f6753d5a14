// Package dedup defines what a duplicate is and what a dedup store must do.
//
// A [Key] names one business effect: a scope (the consumer's name, plus a tenant
// where one is configured) and an ID (the broker's message ID or a business key).
// A [Store] claims keys inside the caller's transaction: the claim and the
// effects of the handler commit together or not at all, so an effect exists
// exactly when its key's row exists.
//
// What a Store guarantees:
//   - a key is claimed as new by at most one committed transaction;
//   - a claim rolled back (or never committed) is forgotten;
//   - a claim that meets a concurrent, uncommitted claim of the same key waits
//     a bounded time and then fails with [ErrInFlight] (retry later);
//   - the same key with a different payload fingerprint is reported as
//     [StatusMismatch], never as a duplicate.
//
// What it does not guarantee: effects outside the store's database (an HTTP
// call, an e-mail) are not covered by the transaction and can repeat.
//
// An [OffsetStore] is the alternative for streams numbered in order (Kafka
// partitions): one row per partition holding the next offset not yet settled,
// moved forward by compare-and-set in the batch's transaction; a message below
// it is a redelivery. It guarantees that the offset only grows, that of two
// writers expecting one value at most one moves it, and that a move rolled
// back is forgotten.
//
// A [RequestStore] keeps HTTP Idempotency-Key requests (package httpidem) in
// the same key rows: a request's state, a lease with a fencing token that
// only grows, and its stored response. It guarantees that a key runs once
// (VerdictRun) and is replayed, busy or a mismatch after, that a write with
// an outdated token is refused ([ErrLeaseLost]), and that no lease is
// shorter than the row that holds it.
//
// A lost connection is a [*ConnLostError], whichever store lost it.
//
// The conformance suite in package deduptest pins this contract down; every
// store runs it (deduptest.Run; deduptest.RunOffsets for offset stores,
// deduptest.RunRequests for request stores).
package dedup
