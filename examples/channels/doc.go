// Package channels applies payment-channel callbacks as the channels really
// send them — Alipay's asynchronous notifications (form-urlencoded), WeChat
// Pay API v3 notifications and Stripe webhook events (JSON, signed in
// headers) — on the tables of examples/payments.
//
// A channel re-sends a callback until it is acknowledged — Alipay 8 times in
// about 25 hours, WeChat Pay 16 times in 24 hours, Stripe for 3 days — and
// every re-send has a new notification time, nonce and signature. A trade
// also has several events under one trade number: paid, then finished or
// refunded. So the dedup key is the trade and its status, and the
// fingerprint covers only the fields that define the event (order, trade,
// status, amount, currency): a re-send is a duplicate, skipped, and the same
// event with another amount a mismatch, dead-lettered.
//
// Config gives a channel's consumer: key consumer.Composite of the trade
// and its status, fingerprint consumer.FormFields or consumer.JSONFields
// (per event type where a payment and a refund differ), and the signature
// verified by consumer.Config.Validate, before the key is claimed, so that a
// forgery cannot take the key of the genuine callback it imitates.
//
// The channel's events of one order are ordered by consumer.Config.Entity
// (Channel.Entity): the version is the time of the event, its ties broken
// by the rank of the channel's status (dedup.StatusRank), so that a
// payment arriving after its refund or finish is stale — acknowledged,
// recorded by the store, never handed to Apply — whatever partition,
// re-send or redrive brings it. Apply moves an order UNPAID -> PAID ->
// FINISHED or REFUNDED after checking the amount and currency against the
// order, read FOR UPDATE, with no guard of its own against older events.
// An event that
// contradicts its order is refused with consumer.Reject, which leaves its
// key free for the genuine event. Alipay's partial refunds (TRADE_SUCCESS
// again, told apart by out_biz_no, an optional key part) are booked one
// ledger row each. Reconcile checks the tables against an expected end
// state.
//
// Alipay and WeChat Pay sign with RSA; here an HMAC under a test key stands
// in for it (see Keys). testdata/channels holds generated streams with their
// expected end state (go generate).
package channels
