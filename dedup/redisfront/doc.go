// Package redisfront puts Redis in front of any dedup.Store: keys committed
// through it are remembered in Redis, and a claim Redis can answer as a
// duplicate of a committed key skips the database — for a batch of nothing
// but such duplicates, the whole transaction. Duplicate-heavy streams (a
// payment channel re-sending its callbacks, a replayed topic) then cost a
// Redis round trip per batch instead of a database transaction.
//
// # What it promises
//
// The database stays the authority. Redis holds one fact per key, "this key
// was committed with this fingerprint, first at this time", written only
// after the database transaction that made it true (or found it true)
// committed. A claim is answered from Redis only when Redis holds that fact
// with the claim's own fingerprint: the answer is StatusDuplicate, exactly
// what the database would say. Everything else — a miss, another
// fingerprint (a possible mismatch), a recorded failure, a Redis error, a
// timeout, an evicted or expired entry, a flushed or restarted Redis — goes
// to the database, at the cost of the round trip Redis was to save. Redis
// never causes an effect to be applied, and never causes a skip beyond
// "this key was committed with this fingerprint".
//
// Where other frameworks went wrong, and what this one does instead:
//
//   - Redis overwriting a live in-progress record (Powertools Python #8386,
//     TypeScript #5714: a second worker's write replaced the first one's
//     INPROGRESS record, and both ran). Here Redis never holds in-progress
//     state: the claim in flight is a row lock in the database, and Redis
//     is written after COMMIT only, with committed facts only.
//   - Stale entries after a key is released (its row deleted to run it
//     again, after ErrFailedBefore say): a Redis entry would keep answering
//     "duplicate". Release and ReleaseScope delete the rows (your function)
//     between two invalidations that leave tombstones, and every write is a
//     script that refuses to replace a tombstone and refuses to run more
//     than Config.WriteWindow after the Redis lookup that preceded its
//     database read (Redis's clock), while a tombstone outlives that window:
//     a transaction that read the row before it was deleted can no longer
//     put it back. Rows deleted any other way (by hand) need Forget or
//     ForgetScope afterwards; until then, or until the entries expire,
//     their keys are still answered as duplicates.
//   - Stale entries after a purge: an entry expires when its row's
//     retention ends (first claimed + Config.Retention, as an absolute time
//     by Redis's clock), never later, so Purge, which deletes only expired
//     rows, needs no invalidation — provided Config.Retention is the
//     store's (or shorter) and the clocks of Redis and the database agree.
//
// What it does not promise: that a duplicate is answered from Redis (an
// entry can be missing, evicted, expired or refused at any time); that the
// consumer's Stats.Commits counts database commits (a batch answered from
// Redis counts as committed); a tombstone that Redis evicts under memory
// pressure within Config.WriteWindow of a release, or a Redis clock that
// jumps, can let a stale entry back. Run Redis with a maxmemory-policy that
// evicts keys with a TTL (volatile-lru, volatile-ttl; every key here has
// one) and give it memory for the keys of MaxTTL.
//
// # How the transaction is skipped
//
// The Store interface has no hook after COMMIT, and a claim runs inside a
// transaction the caller already began. Store.InTx therefore first runs fn
// without a transaction (tx is TTx's zero value) and answers its Claim from
// Redis. When Redis knows every claim as a committed duplicate, fn sees
// only duplicates, runs no handler, and InTx returns without touching the
// database (fn's own error, if it returns one, is InTx's, as after a
// rollback). Otherwise Claim unwinds fn with a panic that InTx recovers
// (fn's deferred calls run; nothing after its Claim does), and InTx runs fn
// again inside the inner store's transaction: Claim passes the claims Redis
// could not answer to the inner store and records the database's answers;
// after the inner InTx committed, the new and duplicate keys are written to
// Redis (a failure to write is logged, never returned). So fn must call
// Claim before it uses tx, pass Claim the context InTx gave it, and run
// nothing with effects for duplicates — the consumer's transaction does
// exactly that. Set Config.AlwaysTransact for code that does not: every
// InTx then opens a transaction, and Redis still saves the claim's rows.
package redisfront
