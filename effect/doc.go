// Package effect wraps a handler's calls to systems outside the store's
// database — a payment provider's refund API, a bank's payout — in steps
// recorded in the store's effect journal (dedup.Journal), so that a call
// whose outcome is unknown is found out, not blindly repeated.
//
// A Step is one call a handler makes for a message. Do runs it:
//
//   - The first time, the intent is committed to the journal before the
//     request leaves, with a provider key derived from the message's
//     identity (Message.DedupKey: the same on every delivery, retry copy
//     and redriven letter) and the step's name, and a fencing token.
//   - A succeeded step returns its stored result on every later delivery
//     without calling; a step the provider refused (Refused) returns the
//     same ErrRefused error without calling.
//   - A call that fails any other way (timeout, reset connection, 5xx, a
//     process killed mid-call) leaves the step unknown, and Do returns an
//     error matching ErrUnknownOutcome that the consumer retries. The next
//     run asks the provider first (Step.ReadBack) and records what it
//     says; it repeats the request, with the same provider key, only when
//     the read-back trusts a "not found" or while the provider still
//     keeps the key (Step.KeyTTL). Otherwise the step is in doubt: Do
//     returns an error the consumer dead-letters with cause in_doubt, with
//     every fact in the letter's reason, for an operator to resolve
//     (dedup.Journal.ResolveStep), and never repeats it.
//   - A step answers only the message that began it: it keeps that
//     message's fingerprint (Message.DedupFingerprint). A later message
//     under the same key with another payload — the key stayed free after
//     the step ran — gets an error matching dedup.ErrFingerprintMismatch,
//     marked consumer.Reject, that the consumer dead-letters with cause
//     fingerprint_mismatch; the provider is not called and the step is
//     left as it is.
//
// What it cannot do: a provider that keeps no idempotency keys and has no
// query leaves every unknown outcome in doubt — Do then never repeats,
// and an operator decides. The journal fences its own writes; the
// provider fences a zombie holder's late request only if it checks the
// token Do hands to Call.
//
// Do's journal writes are transactions of their own, on connections of
// their own, beside the handler's transaction: give the journal a store on
// a pool of its own, or a pool larger than the consumer's lanes, so that
// handlers holding every connection do not wait in Do for each other.
package effect
