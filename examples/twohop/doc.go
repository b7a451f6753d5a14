// Package twohop is the payments flow with a second hop: booking a
// payment callback (examples/payments) also enqueues an order.paid event in
// the same transaction (package outbox); a relay publishes it; a second idem
// consumer, shipping, keyed by the event's outbox identity, ships each paid
// order once.
//
//	callback ─▶ payments consumer ─▶ orders, ledger, accounts, inventory ┐ one
//	                                  + outbox row (order.paid)          ┘ transaction
//	outbox ─▶ relay ─▶ broker ─▶ shipping consumer ─▶ shipments, warehouse
//	          (at least once)    (ByHeader(outbox.HeaderID): copies skipped)
//
// Reconcile checks both hops: the four payments tables as
// payments.Reconcile does, then every paid order shipped exactly once, by
// the event whose identity derives from its payment's key, and nothing left
// in the outbox or its dead-letter table.
//
// Both consumers share one database and one dedup table here (scopes
// "payments" and "shipping"); in production shipping would be another
// service with its own.
package twohop
