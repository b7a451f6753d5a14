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
//     "duplicate" — and no state kept in Redis can prevent that, because
//     Redis can lose it (a flush, a restart without persistence, an
//     eviction) or go back to before it (a restart from an older RDB
//     snapshot or AOF, a failover to a replica that lagged). So the fact
//     that a release happened is kept in the database: per scope, a
//     release epoch (dedup.EpochStore; a table Migrate creates). Every
//     entry carries the epoch of its scope that the front had read before
//     the claim the entry records, and is trusted only while the scope is
//     still at that epoch with no release in progress. Release and
//     ReleaseScope begin a release in the database (the epoch moves; from
//     then on no entry of the scope is trusted or written), wait until
//     every process has read the epochs again, call deleteRows, and end
//     the release (the epoch moves again). An entry written before the
//     release, by a transaction that read a row before deleteRows deleted
//     it, or brought back from an old snapshot, carries an older epoch and
//     is never trusted again. Rows deleted any other way (by hand) need
//     Forget or ForgetScope afterwards; until then their keys are still
//     answered as duplicates.
//   - The cost: the front reads the epochs (one small query) once per
//     Config.EpochTTL (default 1s) per process, not per claim, so a
//     duplicate is still answered without a database round trip; the
//     view it read is trusted for EpochTTL after the read began (this
//     process's monotonic clock), which is why Release waits a little over
//     EpochTTL before deleting rows: every view older than the release has
//     run out by then. A release costs its scopes a cold cache — every
//     entry of the scope goes to the database once, and is written again
//     with the new epoch — not only its keys'. When the epochs cannot be
//     read, claims go to the database.
//   - Stale entries after a purge: an entry expires when its row's
//     retention ends (first claimed + Config.Retention, as an absolute time
//     by Redis's clock), never later, so Purge, which deletes only expired
//     rows, needs no invalidation — provided Config.Retention is the
//     store's (or shorter) and the clocks of Redis and the database agree.
//
// Why a trusted entry is true: an entry of scope S written at epoch E is
// trusted only by a view that read S at E with no release in progress. Its
// writer read E before its claim read the key's row, so the row existed (or
// was made by that claim) at a moment when S was at E. A release that
// deleted the row after that moment moved S past E when it began, and every
// view still saying E was read before that and ran out before deleteRows
// ran; every view read since says a later epoch, or "releasing". None of
// this depends on what Redis holds: a flush or an eviction only removes
// entries, and an old snapshot only brings back entries of older epochs.
//
// What it does not promise: that a duplicate is answered from Redis (an
// entry can be missing, evicted, expired or refused at any time); that the
// consumer's Stats.Commits counts database commits (a batch answered from
// Redis counts as committed). What the release protection rests on: that
// every process has the same Config.EpochTTL (or a shorter one than the
// releasing process's) and clocks that run at about the same rate (not the
// same time: each view's lifetime is measured on one machine); that
// deleteRows is done within Config.ReleaseHold (its context ends before;
// Release says when it was not); and that the epochs table is never
// emptied or rolled back on its own. Run Redis with a maxmemory-policy that
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
